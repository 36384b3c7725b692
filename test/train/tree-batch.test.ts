// Tree-packed training against the flat path on the same rollouts: the signed
// tree reduction against a naive loop, the copy sums against the flattened
// sequences copy by copy, micro-batch splitting (budget, ownership), packed
// scoring against per-trajectory scoring, and one optimiser step (loss,
// metrics, gradient norm, the weights after it) tree vs flat on a float64
// model for soft / hard attribution and every aggregation.
import { tinyConfig } from '../../lib/model/checkpoint';
import { PolicyModel, type TrainSequence } from '../../lib/model/policy-model';
import { treeReduceSigned, type KernelAggregation } from '../../lib/native/kernels';
import { RolloutTree, type RolloutResult } from '../../lib/rollout';
import { attributeScores, microBatches, type ScoredTrajectory } from '../../lib/train/batch';
import { buildTrainTrees, recomputeTreeLogprobs, treeMicroBatches, treeTokenCounts, type TrainTree } from '../../lib/train/tree-batch';

const V = 61;

/** Deterministic LCG in [0, 1). */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
}

/**
 * A random ARPO-shaped tree: the prompt, generated segments that end in a tool
 * call (then a tool result from which 1-3 branches continue) or a leaf;
 * some leaves are empty generated segments.
 */
function randomTree(prompt: number, r: () => number, maxDepth: number): RolloutTree {
  const int = (n: number): number => Math.floor(r() * n);
  const t = new RolloutTree(prompt, Array.from({ length: 3 + int(6) }, () => int(V)), V);
  let path = 0;
  const grow = (context: number, depth: number): void => {
    const branches = depth === 0 ? 2 + int(3) : 1 + int(3);
    for (let b = 0; b < branches; b++) {
      const p = path++;
      const g = t.addGenerated(context, p);
      const call = depth < maxDepth && r() < 0.6;
      const n = call ? 1 + int(5) : int(6);
      for (let i = 0; i < n; i++) t.appendGenerated(g, int(V), -2 - 2 * r(), 1, 0.5);
      if (call) {
        const tool = t.addToolResult(g, Array.from({ length: 1 + int(4) }, () => int(V)), { tag: 'search', content: '', ok: true, cached: true, ms: 0 }, p);
        grow(tool, depth + 1);
      } else {
        t.addLeaf(g, 'answer', { path: p, origin: 'global', stream: BigInt(p), toolCalls: depth });
      }
    }
  };
  grow(0, 0);
  t.canonicalize();
  return t;
}

function scoredRollout(seed: number, prompts: number, attribution: 'soft' | 'hard', maxDepth = 3) {
  const r = rng(seed);
  const trees = Array.from({ length: prompts }, (_, p) => randomTree(p, r, maxDepth));
  const rollout = { trees, decisions: [], metrics: {} } as unknown as RolloutResult;
  const items: ScoredTrajectory[] = trees.flatMap((t) => t.trajectories()).map((trajectory) => {
    const score = Math.floor(r() * 3) / 2; // ties on purpose: zero advantages occur
    return { trajectory, group: trajectory.prompt, response: '', reward: { score, accuracy: score, formatOk: true } as never, advantage: 0 };
  });
  const scored = attributeScores(rollout, items, { estimator: 'grpo', attribution, dynamicSampling: true });
  return { rollout, scored };
}

describe('treeReduceSigned', () => {
  test('equals a naive loop over the leaves of each subtree', () => {
    const r = rng(3);
    const N = 40;
    const parent = Int32Array.from({ length: N }, (_, n) => (n === 0 || r() < 0.1 ? -1 : Math.floor(r() * n)));
    const L = 25;
    const leafNode = Int32Array.from({ length: L }, () => Math.floor(r() * N));
    const adv = Float64Array.from({ length: L }, (_, l) => (l % 5 === 0 ? 0 : r() - 0.5));
    const w = Float64Array.from({ length: L }, () => r());
    const out = treeReduceSigned(parent, leafNode, adv, w);
    for (let n = 0; n < N; n++) {
      let pos = 0, neg = 0, ws = 0, cp = 0, cn = 0, c = 0;
      for (let l = 0; l < L; l++) {
        let under = false;
        for (let a = leafNode[l]!; a >= 0; a = parent[a]!) if (a === n) under = true;
        if (!under) continue;
        if (adv[l]! > 0) (pos += w[l]! * adv[l]!), cp++;
        if (adv[l]! < 0) (neg += w[l]! * adv[l]!), cn++;
        ws += w[l]!;
        c++;
      }
      expect(out.posSum[n]).toBeCloseTo(pos, 12);
      expect(out.negSum[n]).toBeCloseTo(neg, 12);
      expect(out.weightSum[n]).toBeCloseTo(ws, 12);
      expect([out.posCount[n], out.negCount[n], out.count[n]]).toEqual([cp, cn, c]);
    }
    expect(() => treeReduceSigned(parent, leafNode, adv, w.subarray(1))).toThrow(/leafWeight/);
    expect(() => treeReduceSigned(parent, leafNode, adv, Float64Array.from(w, (x, i) => (i === 4 ? -1 : x)))).toThrow(/leafWeight\[4\]/);
    expect(() => treeReduceSigned(Int32Array.from([-1, 1]), [0], [1], [1])).toThrow(/parent\[1\]/);
  });
});

/** Copy sums of every tree token, copy by copy from the flat sequences (the independent reference). */
function naiveSums(trees: readonly TrainTree[], sequences: readonly TrainSequence[], aggregation: KernelAggregation) {
  // Each sequence is one leaf's root-to-leaf path: map its tokens to the tree's packed indices.
  const sums = trees.map((t) => ({ pos: new Float64Array(t.tokens.length), neg: new Float64Array(t.tokens.length), w: new Float64Array(t.tokens.length), count: new Float64Array(t.tokens.length) }));
  let s = 0;
  trees.forEach((t, ti) => {
    const leaves = Array.from(t.leafNode.keys());
    for (const l of leaves) {
      const path: number[] = [];
      for (let n = t.leafNode[l]!; n >= 0; n = t.parent[n]!) path.unshift(n);
      const idx = path.flatMap((n) => Array.from({ length: t.nodeTokens[n]! }, (_, j) => t.nodeOffset[n]! + j));
      const seq = sequences[s++]!;
      expect(Array.from(idx, (i) => t.tokens[i])).toEqual(Array.from(seq.tokens));
      let len = 0;
      for (let j = 1; j < idx.length; j++) len += seq.mask[j]!;
      for (let j = 1; j < idx.length; j++) {
        const m = seq.mask[j]!;
        const a = seq.advantages![j]!;
        const w = aggregation === 'seq-mean-token-mean' ? (len > 0 ? m / len : 0) : m;
        const i = idx[j]!;
        const out = sums[ti]!;
        if (a > 0) out.pos[i] = out.pos[i]! + w * a;
        if (a < 0) out.neg[i] = out.neg[i]! + w * a;
        out.w[i] = out.w[i]! + w;
        out.count[i] = out.count[i]! + m;
        expect(t.oldLogprobs[i]).toBe(seq.oldLogprobs![j]);
      }
    }
  });
  expect(s).toBe(sequences.length);
  return sums;
}

describe('buildTrainTrees', () => {
  test.each([
    ['soft', 'token-mean'],
    ['soft', 'seq-mean-token-mean'],
    ['hard', 'token-mean'],
    ['hard', 'seq-mean-token-mean'],
  ] as const)('%s attribution, %s: the copy sums of the flattened sequences', (attribution, aggregation) => {
    const { rollout, scored } = scoredRollout(7, 4, attribution);
    const trees = buildTrainTrees(rollout, scored, aggregation);
    expect(trees.length).toBe(4 - scored.droppedGroups);
    const ref = naiveSums(trees, scored.sequences, aggregation);
    trees.forEach((t, ti) => {
      for (let i = 0; i < t.tokens.length; i++) {
        expect(t.advPos[i]).toBeCloseTo(ref[ti]!.pos[i]!, 10);
        expect(t.advNeg[i]).toBeCloseTo(ref[ti]!.neg[i]!, 10);
        expect(t.weight[i]).toBeCloseTo(ref[ti]!.w[i]!, 10);
        expect(t.count[i]).toBeCloseTo(ref[ti]!.count[i]!, 10);
      }
    });
    const { unique, flattened } = treeTokenCounts(trees);
    expect(flattened).toBe(scored.sequences.reduce((a, s) => a + s.tokens.length, 0));
    expect(unique).toBeLessThan(flattened);
  });
});

describe('treeMicroBatches', () => {
  test('whole trees side by side, big trees split with context; every token owned once', () => {
    const { rollout, scored } = scoredRollout(11, 5, 'soft', 4);
    const trees = buildTrainTrees(rollout, scored, 'token-mean');
    for (const budget of [10_000, 60, 25, 8]) {
      const plans = treeMicroBatches(trees, budget);
      const owned = trees.map((t) => new Uint8Array(t.tokens.length));
      let sequences = 0;
      let count = 0;
      for (const p of plans) {
        sequences += p.batch.sequences;
        // Over budget only for one trajectory's path (it goes alone).
        if (p.batch.tokens.length > budget) expect(p.batch.sequences).toBe(1);
        for (let j = 0; j < p.tree.length; j++) {
          const t = trees[p.tree[j]!]!;
          expect(p.batch.tokens[j]).toBe(t.tokens[p.index[j]!]);
          if (p.owned[j]) owned[p.tree[j]!]![p.index[j]!]! += 1;
          count += p.batch.count[j] as number;
          if (!p.owned[j]) expect(p.batch.weight[j]).toBe(0);
        }
      }
      expect(sequences).toBe(scored.sequences.length);
      expect(count).toBeCloseTo(trees.reduce((a, t) => a + t.count.reduce((x, y) => x + y, 0), 0), 9);
      for (const o of owned) expect(Array.from(o).every((x) => x === 1)).toBe(true);
      if (budget === 10_000) expect(plans.length).toBe(1);
      if (budget === 8) expect(plans.length).toBeGreaterThan(trees.length);
    }
  });
});

describe('tree-packed training equals the flat path (float64 model)', () => {
  const config = tinyConfig('qwen3', { vocab_size: V, initializer_range: 0.2 });
  const optimizer = { lr: 1e-3, eps: 1e-3, weightDecay: 0, maxGradNorm: 0 };

  test('packed scoring equals per-trajectory scoring', async () => {
    const model = await PolicyModel.create(config, { seed: 4, threads: 1, dtype: 'float64' });
    const { rollout, scored } = scoredRollout(5, 3, 'soft');
    const trees = buildTrainTrees(rollout, scored, 'token-mean');
    const flat = await model.logprobs(scored.sequences.map((s) => s.tokens), { temperature: 0.9 });
    await recomputeTreeLogprobs(model, trees, 20, 0.9); // small budget: split trees
    let s = 0;
    for (const t of trees) {
      for (let l = 0; l < t.leafNode.length; l++, s++) {
        const path: number[] = [];
        for (let n = t.leafNode[l]!; n >= 0; n = t.parent[n]!) path.unshift(n);
        const idx = path.flatMap((n) => Array.from({ length: t.nodeTokens[n]! }, (_, j) => t.nodeOffset[n]! + j));
        idx.forEach((i, j) => {
          if (scored.sequences[s]!.mask[j]! > 0) expect(t.oldLogprobs[i]).toBeCloseTo(flat.logprobs[s]![j]!, 5);
        });
      }
    }
    const f = trees[0]!;
    const logits = await model.forwardTreeLogits(f);
    expect(logits.length).toBe(f.tokens.length * V);
    await expect(model.treeLogprobs({ tokens: f.tokens, parent: f.parent, nodeTokens: f.nodeTokens.subarray(1) })).rejects.toThrow(/forest.nodeTokens/);
    await expect(model.treeLogprobs({ tokens: f.tokens, parent: Int32Array.from(f.parent, (p, k) => (k === 2 ? 5 : p)), nodeTokens: f.nodeTokens })).rejects.toThrow(/forest.parent\[2\]/);
    model.dispose();
  });

  test.each([
    ['soft', 'token-mean', 10_000],
    ['soft', 'seq-mean-token-mean', 30],
    ['hard', 'seq-mean-token-sum', 10_000],
    ['hard', 'token-mean', 30],
    ['soft', 'seq-mean-token-sum-norm', 30],
  ] as const)('%s, %s, budget %d: metrics and weights after a step', async (attribution, aggregation, budget) => {
    const a = await PolicyModel.create(config, { seed: 9, threads: 1, dtype: 'float64' });
    const b = await PolicyModel.create(config, { seed: 9, threads: 1, dtype: 'float64' });
    const { rollout, scored } = scoredRollout(21, 3, attribution);
    const trees = buildTrainTrees(rollout, scored, aggregation);
    const loss = { aggregation, normConstant: 20, klCoef: 0.05, entropyCoef: 0.01, clipLow: 0.1, clipHigh: 0.1 };
    const mf = await a.trainStep(microBatches(scored.sequences, budget), { loss, optimizer });
    const mt = await b.trainTreeStep(treeMicroBatches(trees, budget).map((p) => p.batch), { loss, optimizer, chunkRows: 7 });
    for (const k of ['loss', 'pgLoss', 'pgClipfrac', 'ppoKl', 'entropy', 'kl', 'gradNorm', 'tokens'] as const) {
      expect(Math.abs(mt[k] - mf[k])).toBeLessThanOrEqual(1e-9 + 1e-6 * Math.abs(mf[k]));
    }
    expect(mf.gradNorm).toBeGreaterThan(0);
    const seqs = scored.sequences.map((s) => s.tokens);
    const la = await a.logprobs(seqs);
    const lb = await b.logprobs(seqs);
    la.logprobs.forEach((x, i) => x.forEach((v, j) => expect(Math.abs(lb.logprobs[i]![j]! - v)).toBeLessThanOrEqual(1e-6 * (1 + Math.abs(v)))));
    a.dispose();
    b.dispose();
  });

  test('bad tree micro-batches are rejected naming the field, before any update', async () => {
    const m = await PolicyModel.create(config, { seed: 2, threads: 1 });
    const { rollout, scored } = scoredRollout(21, 2, 'soft');
    const batch = treeMicroBatches(buildTrainTrees(rollout, scored, 'token-mean'), 10_000)[0]!.batch;
    await expect(m.trainTreeStep([{ ...batch, advNeg: Float64Array.from(batch.advNeg).subarray(1) }])).rejects.toThrow(/batches\[0\]\.advNeg/);
    await expect(m.trainTreeStep([{ ...batch, advPos: Float64Array.from(batch.advPos, (x, i) => (i === 3 ? -1 : x)) }])).rejects.toThrow(/batches\[0\]\.advPos\[3\]/);
    await expect(m.trainTreeStep([{ ...batch, sequences: -1 }])).rejects.toThrow(/batches\[0\]\.sequences/);
    await expect(m.trainTreeStep([batch], { chunkRows: -2 })).rejects.toThrow(/options\.chunkRows/);
    await expect(m.trainTreeStep([batch], { mode: 'sft' } as never)).rejects.toThrow(/options\.mode/);
    expect(m.info().optimizerSteps).toBe(0);
    m.dispose();
  });
});
