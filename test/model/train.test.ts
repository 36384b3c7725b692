// PolicyModel.trainStep: metrics against formulas at ratio 1, the KL term
// (k3) against its formula, gradient accumulation, the LR schedule, exact
// resume from a saved checkpoint with optimizer.safetensors, SFT lowering the
// loss, and argument errors.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { tinyConfig } from '../../lib/model/checkpoint';
import { PolicyModel, type TrainSequence } from '../../lib/model/policy-model';

const V = 96;
let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-train-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const seqA = Array.from({ length: 14 }, (_, i) => (i * 17 + 3) % V);
const seqB = Array.from({ length: 9 }, (_, i) => (i * 41 + 5) % V);
// Prompt tokens (and one "tool result" token) masked out; the first token never counts.
const maskOf = (n: number): number[] => Array.from({ length: n }, (_, t) => (t >= 3 && t !== 6 ? 1 : 0));
const advOf = (n: number, s: number): number[] => Array.from({ length: n }, (_, t) => Math.sin(t * 1.7 + s));

async function sequencesAtRatioOne(model: PolicyModel): Promise<TrainSequence[]> {
  const scored = await model.logprobs([seqA, seqB]);
  return [seqA, seqB].map((tokens, i) => ({
    tokens, mask: maskOf(tokens.length), advantages: advOf(tokens.length, i), oldLogprobs: scored.logprobs[i]!,
  }));
}

test('at ratio 1 the metrics equal their formulas: pgLoss = -sum(mask A) / sum(mask), no clipping, entropy = masked mean', async () => {
  const model = await PolicyModel.create(tinyConfig('qwen2'), { seed: 1, threads: 1 });
  const seqs = await sequencesAtRatioOne(model);
  const scored = await model.logprobs([seqA, seqB]);
  let sumMask = 0;
  let sumA = 0;
  let sumH = 0;
  seqs.forEach((s, i) => {
    for (let t = 1; t < s.tokens.length; t++) {
      const m = s.mask[t]!;
      sumMask += m;
      sumA += m * s.advantages![t]!;
      sumH += m * scored.entropies[i]![t]!;
    }
  });
  const r = await model.trainStep([seqs], { optimizer: { lr: 1e-3 } });
  expect(r.tokens).toBe(sumMask);
  expect(r.pgLoss).toBeCloseTo(-sumA / sumMask, 5);
  expect(r.loss).toBeCloseTo(-sumA / sumMask, 5);
  expect(r.pgClipfrac).toBe(0);
  expect(Math.abs(r.ppoKl)).toBeLessThan(1e-6);
  expect(r.entropy).toBeCloseTo(sumH / sumMask, 4);
  expect(r.gradNorm).toBeGreaterThan(0);
  expect(r.lr).toBe(1e-3);
  expect(r.step).toBe(1);
  expect(r.skipped).toBe(false);
  model.dispose();
});

test('the k3 KL term to given refLogprobs equals exp(d) - d - 1 with d = ref - logp', async () => {
  const model = await PolicyModel.create(tinyConfig('llama'), { seed: 2, threads: 1 });
  const seqs = (await sequencesAtRatioOne(model)).map((s) => ({ ...s, refLogprobs: Array.from(s.oldLogprobs!, (x) => x - 0.1) }));
  const r = await model.trainStep([seqs], { loss: { klCoef: 0.05, klType: 'k3' }, optimizer: { lr: 0 } });
  const d = -0.1;
  expect(r.kl).toBeCloseTo(Math.exp(d) - d - 1, 5);
  expect(r.loss - r.pgLoss).toBeCloseTo(0.05 * (Math.exp(d) - d - 1), 5);
  // Without refLogprobs the frozen reference (a copy of the weights at the first KL step) scores them.
  const plain = await sequencesAtRatioOne(model);
  const first = await model.trainStep([plain], { loss: { klCoef: 0.05 }, optimizer: { lr: 1e-2, weightDecay: 0 } });
  expect(first.kl).toBeCloseTo(0, 6);
  expect(model.info().hasReference).toBe(true);
  const second = await model.trainStep([plain], { loss: { klCoef: 0.05 }, optimizer: { lr: 1e-2, weightDecay: 0 } });
  expect(second.kl).toBeGreaterThan(1e-6);
  model.dispose();
});

test('two micro-batches accumulate to the one-batch step (same loss, grad norm and weights)', async () => {
  const one = await PolicyModel.create(tinyConfig('qwen3'), { seed: 3, threads: 1 });
  const two = await PolicyModel.create(tinyConfig('qwen3'), { seed: 3, threads: 1 });
  const seqs = await sequencesAtRatioOne(one);
  const opts = { loss: { clipLow: 0.2, clipHigh: 0.28 }, optimizer: { lr: 1e-3, maxGradNorm: 0 } };
  const r1 = await one.trainStep([seqs], opts);
  const r2 = await two.trainStep([[seqs[0]!], [seqs[1]!]], opts);
  expect(r2.loss).toBeCloseTo(r1.loss, 6);
  expect(r2.gradNorm).toBeCloseTo(r1.gradNorm, 5);
  expect(r2.tokens).toBe(r1.tokens);
  const a = await one.forwardLogits([seqA]);
  const b = await two.forwardLogits([seqA]);
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i]! - b[i]!));
  expect(worst).toBeLessThan(1e-5);
  one.dispose();
  two.dispose();
});

test('warmup and cosine schedule set the step lr', async () => {
  const model = await PolicyModel.create(tinyConfig('qwen2'), { seed: 4, threads: 1 });
  const seqs = await sequencesAtRatioOne(model);
  const optimizer = { lr: 1e-3, warmupSteps: 2, totalSteps: 6, schedule: 'cosine' as const, minLrRatio: 0.1 };
  const lrs: number[] = [];
  for (let s = 0; s < 4; s++) lrs.push((await model.trainStep([seqs], { optimizer })).lr);
  const cosine = (p: number) => 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + Math.cos(Math.PI * p));
  expect(lrs[0]).toBeCloseTo(5e-4, 12);
  expect(lrs[1]).toBeCloseTo(1e-3, 12);
  expect(lrs[2]).toBeCloseTo(cosine(0), 12);
  expect(lrs[3]).toBeCloseTo(cosine(0.25), 12);
  model.dispose();
});

test('save after a step (model + optimizer.safetensors) and load resume exactly', async () => {
  const model = await PolicyModel.create(tinyConfig('llama'), { seed: 5, threads: 1 });
  const seqs = await sequencesAtRatioOne(model);
  const opts = { optimizer: { lr: 1e-2, weightDecay: 0.1 } };
  await model.trainStep([seqs], opts);
  const ckpt = path.join(dir, 'resume');
  await model.save(ckpt);
  expect(fs.existsSync(path.join(ckpt, 'optimizer.safetensors'))).toBe(true);
  const resumed = await PolicyModel.load(ckpt, { threads: 1 });
  expect(resumed.info().optimizerSteps).toBe(1);
  const r1 = await model.trainStep([seqs], opts);
  const r2 = await resumed.trainStep([seqs], opts);
  expect(r2.loss).toBe(r1.loss);
  expect(r2.step).toBe(2);
  expect(await resumed.forwardLogits([seqB])).toEqual(await model.forwardLogits([seqB]));
  // Without the optimizer state the second step differs (fresh moments).
  const fresh = await PolicyModel.load(ckpt, { threads: 1, loadOptimizer: false });
  await fresh.trainStep([seqs], opts);
  expect(await fresh.forwardLogits([seqB])).not.toEqual(await model.forwardLogits([seqB]));
  for (const m of [model, resumed, fresh]) m.dispose();
});

test('SFT lowers the token cross-entropy of its data', async () => {
  const model = await PolicyModel.create(tinyConfig('qwen2'), { seed: 6, threads: 1 });
  const data: TrainSequence[] = [seqA, seqB].map((tokens) => ({ tokens, mask: maskOf(tokens.length) }));
  const losses: number[] = [];
  for (let s = 0; s < 15; s++) losses.push((await model.trainStep([data], { mode: 'sft', optimizer: { lr: 1e-2, weightDecay: 0 } })).loss);
  expect(losses[0]).toBeCloseTo(Math.log(V), 1); // near-uniform at init (initializer_range 0.02)
  expect(losses[14]!).toBeLessThan(0.5 * losses[0]!);
  // The reported loss is the masked mean NLL that logprobs() recomputes.
  const scored = await model.logprobs([seqA, seqB]);
  let nll = 0;
  let n = 0;
  data.forEach((s, i) => {
    for (let t = 1; t < s.tokens.length; t++) {
      nll -= s.mask[t]! * scored.logprobs[i]![t]!;
      n += s.mask[t]!;
    }
  });
  const r = await model.trainStep([data], { mode: 'sft', optimizer: { lr: 0 } });
  expect(r.loss).toBeCloseTo(nll / n, 4);
  model.dispose();
});

test('policy mode needs advantages and oldLogprobs; errors name the field', async () => {
  const model = await PolicyModel.create(tinyConfig('qwen2'), { threads: 1 });
  await expect(model.trainStep([[{ tokens: seqA, mask: maskOf(seqA.length) }]])).rejects.toThrow(
    'Expected an array of 14 numbers for microBatches[0][0].oldLogprobs but received undefined of type undefined',
  );
  await expect(model.trainStep([[{ tokens: seqA, mask: maskOf(seqA.length) }]], { loss: { aggregation: 'mean' as never }, mode: 'sft' })).rejects.toThrow(
    'Unknown loss aggregation "mean"',
  );
  await expect(model.trainStep([])).rejects.toThrow('Expected a non-empty array of micro-batches for microBatches');
  model.dispose();
});
