// Tree-packed training part of `npm run bench` (issue 13): on the e2e trees of
// both modes, the train phase (old-logprob recompute + update) with packing
// tree vs flat, side by side in one process on the same scored rollouts; the
// unique / flattened token ratio (prompt included); peak memory; attention's
// share of the cost (FLOP model, at the demo's and the reference's sizes); and
// the chunked LM head + loss against a full (T, V) logits buffer at the real
// Qwen3 vocabulary (each variant in a fresh process).
import * as path from 'path';
import type { Target } from './kernels';
import type { HeadPackingResult, PackingRunSpec, PhaseCost, TrainPackingResult } from './packing-run';
import { lastJson, mib, num, runChild, spread, table } from './summary';

export interface PackingOptions {
  quick: boolean;
  root: string;
  envDir: string;
  modelDir: string;
  seed: number;
  log: (line: string) => void;
}

export interface PackingResult {
  train: TrainPackingResult;
  head: { flat: HeadPackingResult; tree: HeadPackingResult };
  attention: { demo: Record<string, number>; reference: ReferenceShare };
  targets: Target[];
}

interface ReferenceShare {
  description: string;
  treeShare: number;
  flatShare: number;
  uniqueRatio: number;
}

async function child<T>(o: PackingOptions, spec: PackingRunSpec): Promise<T> {
  const args = ['-r', 'ts-node/register/transpile-only', path.join(o.root, 'bench', 'packing-run.ts'), JSON.stringify(spec)];
  const r = await runChild(process.execPath, args, { cwd: o.root, echo: true });
  if (r.code !== 0) throw new Error(`packing run ${spec.kind} failed (exit ${r.code}): ${r.stderr.trim().split('\n').slice(-5).join('\n')}`);
  return lastJson<T>(r.stdout, `packing run ${spec.kind}`);
}

interface Dims {
  hidden: number;
  layers: number;
  heads: number;
  headDim: number;
  kvHeads: number;
  intermediate: number;
  vocab: number;
}

/**
 * Attention's share of the forward FLOPs of one layer stack: per query-key
 * pair 4·heads·headDim (QKᵀ and PV); per token 2·(linear weights) for the
 * projections and the MLP; the LM head 2·hidden·V per token. Backward scales
 * both alike (about 2x), so the share holds for the train step.
 */
function attentionShare(d: Dims, tokens: number, pairs: number): number {
  const q = d.heads * d.headDim;
  const kv = d.kvHeads * d.headDim;
  const linear = 2 * d.layers * (d.hidden * (q + 2 * kv) + q * d.hidden + 3 * d.hidden * d.intermediate) + 2 * d.hidden * d.vocab;
  const attn = 4 * d.layers * q * pairs;
  return attn / (attn + linear * tokens);
}

/**
 * The reference's sizes: a prompt of 1,000 tokens, M = 16 responses of 4,096
 * tokens, N = 8 global samples each forked once at its midpoint (ARPO), on a
 * Qwen2.5-7B-shaped model.
 */
function referenceShare(): ReferenceShare {
  const d: Dims = { hidden: 3584, layers: 28, heads: 28, headDim: 128, kvHeads: 4, intermediate: 18944, vocab: 152064 };
  const P = 1000, R = 4096, M = 16, N = 8;
  const tri = (a: number, b: number): number => ((b - a) * (a + b + 1)) / 2; // Σ_{i=a}^{b-1} (i + 1)
  // Flat: M sequences of P + R tokens.
  const flatTokens = M * (P + R);
  const flatPairs = M * tri(0, P + R);
  // Tree: the prompt once; N global responses; M - N branches sharing the first R/2 of one global response.
  const treeTokens = P + N * R + (M - N) * (R / 2);
  const treePairs = tri(0, P) + N * tri(P, P + R) + (M - N) * tri(P + R / 2, P + R);
  return {
    description: `Qwen2.5-7B shape (hidden 3584, 28 layers, GQA 28/4, MLP 18944, V 152064), prompt ${P}, M = ${M} responses of ${R} tokens, N = ${N} forked at mid-response`,
    treeShare: attentionShare(d, treeTokens, treePairs),
    flatShare: attentionShare(d, flatTokens, flatPairs),
    uniqueRatio: treeTokens / flatTokens,
  };
}

const total = (c: PhaseCost): number => c.recomputeSeconds + c.updateSeconds;

export async function runPackingBench(o: PackingOptions): Promise<PackingResult> {
  o.log('[bench] packing: train phase, tree vs flat, on one scored rollout of each mode');
  const train = await child<TrainPackingResult>(o, { kind: 'train', envDir: o.envDir, modelDir: o.modelDir, seed: o.seed, quick: o.quick, reps: o.quick ? 2 : 4 });
  o.log('[bench] packing: LM head + loss at V = 151,936, 4,096 tokens (flat logits buffer vs chunked)');
  const head = {
    flat: await child<HeadPackingResult>(o, { kind: 'head', variant: 'flat', tokens: 4096, vocab: 151936, hidden: 64 }),
    tree: await child<HeadPackingResult>(o, { kind: 'head', variant: 'tree', tokens: 4096, vocab: 151936, hidden: 64 }),
  };
  const demo: Record<string, number> = {};
  for (const m of train.modes) {
    demo[`${m.mode}:tree`] = attentionShare(train.model, m.uniqueTokens, m.attentionPairs.tree);
    demo[`${m.mode}:flat`] = attentionShare(train.model, m.flattenedTokens, m.attentionPairs.flat);
  }
  const reference = referenceShare();
  const targets: Target[] = [];
  for (const m of train.modes) {
    const ratio = m.uniqueTokens / m.flattenedTokens;
    const t = spread(m.tree.map(total)).median / spread(m.flat.map(total)).median;
    const peakTree = Math.max(...m.tree.map((c) => c.peakExtraBytes));
    const peakFlat = Math.max(...m.flat.map((c) => c.peakExtraBytes));
    targets.push({
      name: `${m.mode === 'arpo' ? 'ARPO' : 'GRPO'} trees: train phase packed / flat <= 1.15 x unique / flattened tokens`,
      met: t <= 1.15 * ratio,
      detail: `time ratio ${num(t, 3)} vs token ratio ${num(ratio, 3)} (bound ${num(1.15 * ratio, 3)})`,
    });
    targets.push({
      name: `${m.mode === 'arpo' ? 'ARPO' : 'GRPO'} trees: peak memory of the train phase packed <= flat (same micro-batch budget)`,
      met: peakTree <= peakFlat,
      detail: `peak RSS rise ${mib(peakTree)} packed vs ${mib(peakFlat)} flat`,
    });
  }
  const headExtra = head.tree.peakExtraBytes - head.tree.paramBytes;
  targets.push({
    name: 'Chunked LM head + loss at V = 151,936, 4,096 tokens: loss-path peak beyond the parameter gradients <= 1/8 of the logits buffer',
    met: headExtra <= head.tree.logitsBytes / 8,
    detail: `${mib(headExtra)} vs ${mib(head.tree.logitsBytes / 8)} (flat path: ${mib(head.flat.peakExtraBytes - head.flat.paramBytes)})`,
  });
  const ht = Math.min(...head.tree.seconds), hf = Math.min(...head.flat.seconds);
  targets.push({
    name: 'Chunked LM head + loss: step time no worse than the full logits buffer',
    met: ht <= hf * 1.05,
    detail: `${num(ht, 3)} s vs ${num(hf, 3)} s (ratio ${num(ht / hf, 3)}; 5% allowance for noise)`,
  });
  return { train, head, attention: { demo, reference }, targets };
}

export function packingTables(r: PackingResult): string {
  const lines: string[] = [];
  const m0 = r.train.model;
  lines.push(
    `One rollout per mode from the bench checkpoint (demo model: hidden ${m0.hidden}, ${m0.layers} layers, V ${m0.vocab}); micro-batch budget ${r.train.microBatchTokens} tokens; ` +
      'train phase = old-logprob recompute + one update (forward, loss, backward, AdamW) over all prompts; reps alternate flat / tree on the same process and model. ' +
      'Cells: median [min, max] over reps.',
  );
  const sp = (xs: number[], d = 3): string => {
    const s = spread(xs);
    return s.n <= 1 ? num(s.median, d) : `${num(s.median, d)} [${num(s.min, d)}, ${num(s.max, d)}]`;
  };
  const rows = r.train.modes.map((m) => {
    const ratio = m.uniqueTokens / m.flattenedTokens;
    const tt = spread(m.tree.map(total)).median;
    const tf = spread(m.flat.map(total)).median;
    return [
      m.mode === 'arpo' ? 'ARPO' : 'GRPO',
      String(m.trajectories),
      `${m.uniqueTokens} / ${m.flattenedTokens} = ${num(ratio, 3)}`,
      `${sp(m.flat.map((c) => c.recomputeSeconds))} + ${sp(m.flat.map((c) => c.updateSeconds))}`,
      `${sp(m.tree.map((c) => c.recomputeSeconds))} + ${sp(m.tree.map((c) => c.updateSeconds))}`,
      num(tt / tf, 3),
      `${mib(Math.max(...m.flat.map((c) => c.peakExtraBytes)))} / ${mib(Math.max(...m.tree.map((c) => c.peakExtraBytes)))}`,
      `${num(m.loss.flat, 6)} / ${num(m.loss.tree, 6)}`,
    ];
  });
  lines.push(table(['trees', 'trajectories', 'unique / flattened tokens', 'flat: recompute + update, s', 'tree: recompute + update, s', 'time tree / flat', 'peak RSS rise flat / tree', 'loss flat / tree (rep 1)'], rows));
  const h = r.head;
  lines.push(
    table(
      ['LM head + loss, V = 151,936, 4,096 tokens = 8 x 512 (1-layer model, hidden 64)', 'step time, s (min of 2)', 'peak RSS rise', 'beyond parameter gradients', 'full logits buffer'],
      [h.flat, h.tree].map((x) => [
        x.variant === 'flat' ? 'flat: (T, V) logits + fused loss' : 'tree: chunked head + loss (~64 MiB chunks)',
        num(Math.min(...x.seconds), 3), mib(x.peakExtraBytes), mib(x.peakExtraBytes - x.paramBytes), mib(x.logitsBytes),
      ]),
    ),
  );
  const a = r.attention;
  const demoCells = r.train.modes.map((m) => `${m.mode === 'arpo' ? 'ARPO' : 'GRPO'} ${num(100 * a.demo[`${m.mode}:tree`]!, 1)}% packed / ${num(100 * a.demo[`${m.mode}:flat`]!, 1)}% flat`);
  lines.push(
    `Attention's share of the forward FLOPs (QKᵀ + PV over the keys each token sees, against projections, MLP and LM head): demo trees ${demoCells.join(', ')}; ` +
      `reference sizes (${a.reference.description}): ${num(100 * a.reference.treeShare, 1)}% packed, ${num(100 * a.reference.flatShare, 1)}% flat, unique / flattened tokens ${num(a.reference.uniqueRatio, 3)}. ` +
      'Packed attention runs chain by chain over each chain\'s ancestors (no dense T x T mask), so its cost is that of the flat sequences\' causal attention restricted to unique queries.',
  );
  return lines.join('\n\n');
}
