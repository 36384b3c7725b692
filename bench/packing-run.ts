// One measurement of the packing bench, in its own process (so its memory is
// its own). Prints one JSON line.
//
// kind "train": one rollout of each mode (ARPO tree, GRPO trajectories) on the
//   demo world from the bench checkpoint, then the train phase (old-logprob
//   recompute + one update) with packing flat and tree, alternated rep by rep
//   on the same scored rollout: seconds of each part, peak RSS rise, and the
//   unique / flattened token counts (prompt included).
// kind "head": one update on a micro-batch of 4,096 tokens (8 sequences) of a
//   one-layer model with the real Qwen3 vocabulary (V = 151,936), flat (a
//   (T, V) logits buffer) or tree (the chunked LM head + loss): seconds and
//   peak RSS rise.
//
//   ts-node --transpile-only bench/packing-run.ts '<json PackingRunSpec>'
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { demoRunConfig } from '../lib/cli/demo';
import { tinyConfig } from '../lib/model/checkpoint';
import { PolicyModel, type TrainSequence, type TrainTreeBatch } from '../lib/model/policy-model';
import { rollout } from '../lib/rollout';
import { microBatches, scoreAndAttribute } from '../lib/train/batch';
import { buildReward, buildTools, loadDataset, loadPolicy, promptIds, rolloutDeps, rolloutSettings } from '../lib/train/setup';
import { lossOptions, stepSeed } from '../lib/train/trainer';
import { buildTrainTrees, recomputeTreeLogprobs, treeMicroBatches, treeTokenCounts } from '../lib/train/tree-batch';
import { childMain } from './summary';

export type PackingRunSpec =
  | { kind: 'train'; envDir: string; modelDir: string; seed: number; quick: boolean; reps: number }
  | { kind: 'head'; variant: 'flat' | 'tree'; tokens: number; vocab: number; hidden: number };

export interface PhaseCost {
  recomputeSeconds: number;
  updateSeconds: number;
  peakExtraBytes: number;
}

export interface TrainPackingResult {
  kind: 'train';
  modes: {
    mode: 'arpo' | 'trajectory';
    trajectories: number;
    uniqueTokens: number;
    flattenedTokens: number;
    /** Σ over unique tokens of the keys each attends to (its path position + 1), and the same over flattened tokens. */
    attentionPairs: { tree: number; flat: number };
    flat: PhaseCost[];
    tree: PhaseCost[];
    loss: { flat: number; tree: number };
  }[];
  model: { hidden: number; layers: number; heads: number; headDim: number; kvHeads: number; intermediate: number; vocab: number };
  microBatchTokens: number;
}

export interface HeadPackingResult {
  kind: 'head';
  variant: 'flat' | 'tree';
  tokens: number;
  vocab: number;
  seconds: number[];
  peakExtraBytes: number;
  paramBytes: number;
  logitsBytes: number;
}

/** Runs `fn`, sampling the RSS every 2 ms: seconds and the peak rise above the RSS at the start. */
async function measured<T>(fn: () => Promise<T>): Promise<{ value: T; seconds: number; peakExtra: number }> {
  const base = process.memoryUsage.rss();
  let peak = base;
  const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage.rss())), 2);
  const t0 = process.hrtime.bigint();
  try {
    const value = await fn();
    return { value, seconds: Number(process.hrtime.bigint() - t0) / 1e9, peakExtra: Math.max(peak, process.memoryUsage.rss()) - base };
  } finally {
    clearInterval(timer);
  }
}

async function runTrain(spec: Extract<PackingRunSpec, { kind: 'train' }>): Promise<TrainPackingResult> {
  const runDir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-packing-'));
  try {
    const out: TrainPackingResult['modes'] = [];
    let modelInfo: TrainPackingResult['model'] | undefined;
    let microBatchTokens = 0;
    for (const mode of ['arpo', 'trajectory'] as const) {
      const cfg = demoRunConfig(spec.envDir, spec.modelDir, runDir, spec.seed, spec.quick, 1, {
        algorithm: { name: mode === 'arpo' ? 'arpo' : 'grpo' },
        rollout: { mode },
        train: { oldLogprobs: 'recompute', ppoEpochs: 1 },
      });
      microBatchTokens = cfg.train.microBatchTokens;
      const { model, tokenizer } = await loadPolicy(spec.modelDir, cfg);
      const c = model.config;
      modelInfo = {
        hidden: c.hiddenSize, layers: c.numHiddenLayers, heads: c.numAttentionHeads, headDim: c.headDim ?? c.hiddenSize / c.numAttentionHeads,
        kvHeads: c.numKeyValueHeads, intermediate: c.intermediateSize, vocab: c.vocabSize,
      };
      const tools = await buildTools(cfg, runDir);
      try {
        const reward = await buildReward(cfg);
        const data = await loadDataset(cfg.data.train!, cfg);
        const examples = data.sampler({ batchSize: cfg.train.batchPrompts, seed: spec.seed, shuffle: true }).next();
        const prompts = examples.map((e) => promptIds(e, tokenizer, cfg.data.systemPrompt));
        const result = await rollout(rolloutDeps(model, tokenizer, tools.runner, cfg.model.path), prompts, stepSeed(spec.seed, 'train', 1), rolloutSettings(cfg));
        const scored = await scoreAndAttribute(result, examples, tokenizer, reward, {
          estimator: cfg.algorithm.estimator, attribution: cfg.algorithm.attribution, dynamicSampling: false,
        });
        const options = lossOptions(cfg);
        const temperature = options.loss!.temperature!;
        const counts = treeTokenCounts(buildTrainTrees(result, scored, cfg.loss.aggregation));
        const pairs = { tree: 0, flat: 0 };
        for (const t of buildTrainTrees(result, scored, cfg.loss.aggregation)) {
          const start = new Int32Array(t.parent.length);
          for (let k = 0; k < t.parent.length; k++) {
            const p = t.parent[k]!;
            start[k] = p < 0 ? 0 : start[p]! + t.nodeTokens[p]!;
            for (let j = 0; j < t.nodeTokens[k]!; j++) pairs.tree += start[k]! + j + 1;
          }
        }
        for (const s of scored.sequences) pairs.flat += (s.tokens.length * (s.tokens.length + 1)) / 2;
        const flat: PhaseCost[] = [];
        const tree: PhaseCost[] = [];
        const loss = { flat: NaN, tree: NaN };
        for (let rep = 0; rep < spec.reps; rep++) {
          // Alternate which goes first, so drifts of the shared machine hit both alike.
          for (const packing of rep % 2 === 0 ? (['flat', 'tree'] as const) : (['tree', 'flat'] as const)) {
            if (packing === 'flat') {
              let seqs: TrainSequence[] = scored.sequences;
              const r = await measured(async () => {
                const scores = await model.logprobs(seqs.map((s) => s.tokens), { temperature });
                seqs = seqs.map((s, i) => ({ ...s, oldLogprobs: scores.logprobs[i]! }));
              });
              const u = await measured(() => model.trainStep(microBatches(seqs, cfg.train.microBatchTokens), options));
              flat.push({ recomputeSeconds: r.seconds, updateSeconds: u.seconds, peakExtraBytes: Math.max(r.peakExtra, u.peakExtra) });
              if (rep === 0) loss.flat = u.value.loss;
            } else {
              let batches: TrainTreeBatch[] = [];
              const r = await measured(async () => {
                const trees = buildTrainTrees(result, scored, cfg.loss.aggregation);
                await recomputeTreeLogprobs(model, trees, cfg.train.microBatchTokens, temperature);
                batches = treeMicroBatches(trees, cfg.train.microBatchTokens).map((p) => p.batch);
              });
              const u = await measured(() => model.trainTreeStep(batches, { loss: options.loss, optimizer: options.optimizer }));
              tree.push({ recomputeSeconds: r.seconds, updateSeconds: u.seconds, peakExtraBytes: Math.max(r.peakExtra, u.peakExtra) });
              if (rep === 0) loss.tree = u.value.loss;
            }
          }
        }
        out.push({
          mode, trajectories: scored.sequences.length, uniqueTokens: counts.unique, flattenedTokens: counts.flattened,
          attentionPairs: pairs, flat, tree, loss,
        });
      } finally {
        await tools.close();
        model.dispose();
      }
    }
    return { kind: 'train', modes: out, model: modelInfo!, microBatchTokens };
  } finally {
    fs.rmSync(runDir, { recursive: true, force: true });
  }
}

async function runHead(spec: Extract<PackingRunSpec, { kind: 'head' }>): Promise<HeadPackingResult> {
  const config = tinyConfig('qwen3', {
    vocab_size: spec.vocab, hidden_size: spec.hidden, intermediate_size: 2 * spec.hidden, num_hidden_layers: 1,
    num_attention_heads: 4, num_key_value_heads: 2, head_dim: spec.hidden / 4, max_position_embeddings: spec.tokens, tie_word_embeddings: true,
  });
  const model = await PolicyModel.create(config, { seed: 1, threads: 0 });
  // The micro-batch: 8 sequences of T / 8 tokens (short enough that attention's T x T buffers stay small
  // next to the logits), as 8 trees of one node each on the packed side.
  const T = spec.tokens;
  const S = 8;
  const n = T / S;
  let s = 12345;
  const rand = (): number => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
  const tokens = Int32Array.from({ length: T }, () => Math.floor(rand() * spec.vocab));
  const mask = Float32Array.from({ length: T }, (_, i) => (i % n < 32 ? 0 : 1)); // a 32-token prompt per sequence
  const adv = Float32Array.from({ length: T }, () => rand() - 0.5);
  const old = new Float32Array(T).fill(-12);
  const seqs: TrainSequence[] = Array.from({ length: S }, (_, k) => ({
    tokens: tokens.subarray(k * n, (k + 1) * n), mask: mask.subarray(k * n, (k + 1) * n),
    oldLogprobs: old.subarray(k * n, (k + 1) * n), advantages: adv.subarray(k * n, (k + 1) * n),
  }));
  const tree: TrainTreeBatch = {
    tokens, parent: new Int32Array(S).fill(-1), nodeTokens: new Int32Array(S).fill(n), oldLogprobs: old, sequences: S,
    advPos: Float64Array.from(adv, (a, i) => (a > 0 ? mask[i]! * a : 0)), advNeg: Float64Array.from(adv, (a, i) => (a < 0 ? mask[i]! * a : 0)),
    weight: Float64Array.from(mask), countPos: Float64Array.from(adv, (a, i) => (a > 0 ? mask[i]! : 0)),
    countNeg: Float64Array.from(adv, (a, i) => (a < 0 ? mask[i]! : 0)), count: Float64Array.from(mask),
  };
  const step = () => (spec.variant === 'flat' ? model.trainStep([seqs], { optimizer: { lr: 1e-5 } }) : model.trainTreeStep([tree], { optimizer: { lr: 1e-5 } }));
  await step(); // creates the AdamW moments, so the measured steps allocate only the loss path and the gradients
  const seconds: number[] = [];
  let peak = 0;
  for (let r = 0; r < 2; r++) {
    const m = await measured(step);
    seconds.push(m.seconds);
    peak = Math.max(peak, m.peakExtra);
  }
  const paramBytes = model.info().numParameters * 4;
  model.dispose();
  return { kind: 'head', variant: spec.variant, tokens: T, vocab: spec.vocab, seconds, peakExtraBytes: peak, paramBytes, logitsBytes: T * spec.vocab * 4 };
}

if (require.main === module) {
  childMain<PackingRunSpec, unknown>(
    'packing-run',
    "ts-node --transpile-only bench/packing-run.ts '{\"kind\":\"head\",\"variant\":\"tree\",\"tokens\":4096,\"vocab\":151936,\"hidden\":64}'",
    () => true,
    (spec) => (spec.kind === 'train' ? runTrain(spec) : runHead(spec)),
  );
}
