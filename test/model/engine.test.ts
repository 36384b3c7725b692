// The GenerationEngine of PolicyModel: KV-cache decode equals the full
// forward, forks continue exactly like unforked copies, sampled tokens depend
// only on (seed, stream, position), refcounts return to zero, the sampler's
// logprobs equal rescoring, and the 151,936-token vocabulary decodes.
import { tinyConfig } from '../../lib/model/checkpoint';
import { PolicyModel } from '../../lib/model/policy-model';
import type { SamplingOptions } from '../../lib/model/types';

const V = 96;
const tokens = (n: number, seed: number): Int32Array => Int32Array.from({ length: n }, (_, i) => (i * 29 + seed * 13 + 7) % V);
const sampling: SamplingOptions = { temperature: 1, seed: 2024n };

let model: PolicyModel;
beforeAll(async () => {
  model = await PolicyModel.create(tinyConfig('qwen3', { initializer_range: 0.2 }), { seed: 3, threads: 1, blockSize: 4, initialBlocks: 2 });
});
afterAll(() => model.dispose());

/** log-softmax in float64 of one row of V logits. */
function logSoftmax(row: Float32Array): Float64Array {
  let m = -Infinity;
  for (const x of row) m = Math.max(m, x);
  let z = 0;
  for (const x of row) z += Math.exp(x - m);
  const lse = m + Math.log(z);
  return Float64Array.from(row, (x) => x - lse);
}

test('decoding through the cache in uneven chunks equals the full forward at every step (|d| <= 1e-5 (1 + |ref|))', async () => {
  const seq = tokens(37, 1);
  const full = await model.forwardLogits([seq]);
  const p = model.newPath(1);
  let pos = 0;
  let worst = 0;
  for (const n of [5, 1, 1, 4, 1, 7, 1, 1, 1, 2, 13]) {
    const last = await model.extendLogits([p], [seq.subarray(pos, pos + n)]);
    pos += n;
    for (let j = 0; j < V; j++) {
      const ref = full[(pos - 1) * V + j]!;
      worst = Math.max(worst, Math.abs(last[j]! - ref) / (1e-5 * (1 + Math.abs(ref))));
    }
  }
  expect(pos).toBe(37);
  expect(model.pathLength(p)).toBe(37);
  model.freePath(p);
  expect(worst).toBeLessThan(1);
});

test('a fork continues exactly as an unforked copy would, and the parent is never disturbed', async () => {
  const prefix = tokens(10, 2); // 2.5 blocks of 4: the last block is shared and partial
  const parent = model.newPath(10);
  await model.extend([parent], [prefix], sampling);
  const child = model.fork(parent, 10, 11);
  const copy = model.newPath(11); // same stream as the child, own cache
  await model.extend([copy], [prefix], sampling);
  // Child and copy decode 6 tokens each (the child writes into the shared block first).
  const run = async (p: number, first: number): Promise<number[]> => {
    const out: number[] = [];
    let input = Int32Array.of(first);
    for (let i = 0; i < 6; i++) {
      const r = await model.extend([p], [input], sampling);
      out.push(r.tokens[0]!);
      input = Int32Array.of(r.tokens[0]!);
    }
    return out;
  };
  const a = await run(child, 5);
  const b = await run(copy, 5);
  expect(a).toEqual(b);
  // The parent then continues and matches a fresh path with its own history.
  const parentNext = await model.extendLogits([parent], [Int32Array.of(9, 8)]);
  const fresh = await model.forwardLogits([[...prefix, 9, 8]]);
  for (let j = 0; j < V; j++) expect(parentNext[j]).toBeCloseTo(fresh[11 * V + j]!, 4);
  // Re-sampling the token after a prefix: fork at length - 1, extend with the last token.
  const resample = model.fork(parent, 9, 99);
  const r = await model.extend([resample], [prefix.subarray(9)], sampling);
  const alone = model.newPath(99);
  const r2 = await model.extend([alone], [prefix], sampling);
  expect(r.tokens[0]).toBe(r2.tokens[0]);
  expect(r.logprobs[0]).toBeCloseTo(r2.logprobs[0]!, 5);
  for (const p of [parent, child, copy, resample, alone]) model.freePath(p);
  expect(model.cacheStats()).toMatchObject({ blocksUsed: 0, paths: 0, tokens: 0, bytesUsed: 0 });
});

test('tokens depend only on (seed, stream, position): alone or in a shuffled batch of 5 with mixed prefill', async () => {
  const prompts = [3, 8, 1, 5, 12].map((n, i) => tokens(n, 20 + i));
  const alone: number[][] = [];
  for (let i = 0; i < 5; i++) {
    const p = model.newPath(500 + i);
    const out: number[] = [];
    let input = prompts[i]!;
    for (let s = 0; s < 5; s++) {
      const r = await model.extend([p], [input], sampling);
      out.push(r.tokens[0]!);
      input = Int32Array.of(r.tokens[0]!);
    }
    alone.push(out);
    model.freePath(p);
  }
  const paths = prompts.map((_, i) => model.newPath(500 + i));
  const got: number[][] = prompts.map(() => []);
  const next: Array<Int32Array> = prompts.map((p) => p);
  let rng = 12345;
  for (let step = 0; step < 5; step++) {
    const order = [0, 1, 2, 3, 4];
    for (let i = order.length - 1; i > 0; i--) {
      rng = (rng * 1103515245 + 12345) % 2147483648;
      const j = rng % (i + 1);
      [order[i], order[j]] = [order[j]!, order[i]!];
    }
    const r = await model.extend(order.map((i) => paths[i]!), order.map((i) => next[i]!), sampling);
    order.forEach((i, k) => {
      got[i]!.push(r.tokens[k]!);
      next[i] = Int32Array.of(r.tokens[k]!);
    });
  }
  expect(got).toEqual(alone);
  for (const p of paths) model.freePath(p);
  // Another seed gives other samples.
  const p = model.newPath(500);
  const other = await model.extend([p], [prompts[0]!], { temperature: 1, seed: 7 });
  const same = model.newPath(500);
  const again = await model.extend([same], [prompts[0]!], sampling);
  expect(again.tokens[0]).toBe(alone[0]![0]);
  model.freePath(p);
  model.freePath(same);
  expect(other.tokens.length).toBe(1);
});

test('sampled logprobs and entropies equal rescoring the sequence; greedy is the argmax', async () => {
  const prompt = tokens(6, 3);
  const [gen] = await model.generate([prompt], { maxNewTokens: 8, sampling: { temperature: 0.8, seed: 1 } });
  const seq = [...prompt, ...gen!.tokens];
  const scored = await model.logprobs([seq], { temperature: 0.8 });
  const full = await model.forwardLogits([seq]);
  for (let k = 0; k < gen!.tokens.length; k++) {
    const t = prompt.length + k;
    expect(gen!.logprobs[k]).toBeCloseTo(scored.logprobs[0]![t]!, 4);
    expect(gen!.entropies[k]).toBeCloseTo(scored.entropies[0]![t]!, 4);
    // And both equal log_softmax(logits / 0.8) computed here in float64.
    const ls = logSoftmax(full.subarray((t - 1) * V, t * V).map((x) => x / 0.8));
    expect(scored.logprobs[0]![t]).toBeCloseTo(ls[seq[t]!]!, 4);
    let h = 0;
    for (const l of ls) h -= Math.exp(l) * l;
    expect(scored.entropies[0]![t]).toBeCloseTo(h, 4);
    expect(gen!.normEntropies[k]).toBeCloseTo(gen!.entropies[k]! / Math.log(V), 5);
  }
  const [greedy] = await model.generate([prompt], { maxNewTokens: 1, sampling: { temperature: 0, seed: 0 } });
  const row = full.subarray((prompt.length - 1) * V, prompt.length * V);
  expect(greedy!.tokens[0]).toBe(row.indexOf(Math.max(...row)));
  expect(model.cacheStats().paths).toBe(0); // generate frees its paths
});

test('generate: n forks per prompt, stop tokens, every path freed', async () => {
  const prompts = [tokens(5, 4), tokens(1, 5)];
  const out = await model.generate(prompts, { maxNewTokens: 6, n: 3, sampling: { temperature: 1, seed: 9 }, stopTokenIds: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] });
  expect(out.map((g) => g.prompt)).toEqual([0, 0, 0, 1, 1, 1]);
  for (const g of out) {
    const stopped = g.tokens.findIndex((t) => t < 10);
    if (g.finishReason === 'stop') expect(stopped).toBe(g.tokens.length - 1);
    else expect(g.tokens.length).toBe(6);
  }
  // Sample j of prompt i uses stream i * n + j: a manual decode reproduces it.
  const p = model.newPath(4); // prompt 1, sample 1 -> stream 1 * 3 + 1
  let input: Int32Array = prompts[1]!;
  const manual: number[] = [];
  for (let s = 0; s < out[4]!.tokens.length; s++) {
    const r = await model.extend([p], [input], { temperature: 1, seed: 9 });
    manual.push(r.tokens[0]!);
    input = Int32Array.of(r.tokens[0]!);
  }
  model.freePath(p);
  expect(manual).toEqual([...out[4]!.tokens]);
  expect(model.cacheStats()).toMatchObject({ paths: 0, blocksUsed: 0 });
});

test('8 forks of a 1,000-token path share its blocks: memory of one copy plus the forks\' own tails', async () => {
  const big = await PolicyModel.create(tinyConfig('qwen2', { max_position_embeddings: 2048 }), { threads: 1, blockSize: 16 });
  const root = big.newPath(0);
  await big.extend([root], [Int32Array.from({ length: 1000 }, (_, i) => i % V)], sampling);
  const forks = Array.from({ length: 8 }, (_, i) => big.fork(root, 1000, i + 1));
  const shared = big.cacheStats();
  expect(shared.blocksUsed).toBe(Math.ceil(1000 / 16)); // forking copied nothing
  await big.extend(forks, forks.map((_, i) => Int32Array.of(i)), sampling);
  const after = big.cacheStats();
  // 1000 = 62.5 blocks: each fork copies the shared partial block once (copy-on-write).
  expect(after.blocksUsed).toBe(63 + 8);
  expect(after.bytesUnshared).toBe((63 + 8 * 63) * after.bytesPerBlock);
  for (const f of forks) big.freePath(f);
  big.freePath(root);
  expect(big.cacheStats().blocksUsed).toBe(0);
  big.dispose();
});

test('the Qwen vocabulary (151,936) with a tiny hidden size creates and decodes', async () => {
  const m = await PolicyModel.create(tinyConfig('qwen2', { vocab_size: 151936, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1 }), { threads: 1 });
  const out = await m.generate([[151935, 0, 100000]], { maxNewTokens: 3, sampling: { temperature: 1, seed: 1 } });
  expect(out[0]!.tokens.length).toBe(3);
  for (const t of out[0]!.tokens) expect(t).toBeLessThan(151936);
  expect(out[0]!.normEntropies[0]).toBeGreaterThan(0.99); // initializer_range 0.02: near uniform
  m.dispose();
});

test('fusedDecode (the default decode-time CPU kernels) samples what the plain torch compositions sample, on the same paths and inputs', async () => {
  expect(model.info().fusedDecode).toBe(true);
  const runWith = async (fusedDecode: boolean): Promise<{ tokens: number[]; logprobs: number[] }> => {
    const m = await PolicyModel.create(tinyConfig('qwen3', { initializer_range: 0.2 }), { seed: 3, threads: 1, blockSize: 4, initialBlocks: 2, fusedDecode });
    try {
      expect(m.info().fusedDecode).toBe(fusedDecode);
      const root = m.newPath(0);
      await m.extend([root], [tokens(23, 4)], sampling);
      const paths = [0, 1, 2, 3].map((i) => m.fork(root, 21 + (i % 3), 10 + i));
      const out = { tokens: [] as number[], logprobs: [] as number[] };
      let last = [1, 2, 3, 4];
      for (let s = 0; s < 10; s++) {
        // Decode rows with a multi-token (tool result) row every third step.
        const inputs = paths.map((_, i) => ((s + i) % 3 === 2 ? tokens(3 + i, s) : Int32Array.of(last[i]!)));
        const r = await m.extend(paths, inputs, sampling);
        last = Array.from(r.tokens);
        out.tokens.push(...r.tokens);
        out.logprobs.push(...r.logprobs);
      }
      return out;
    } finally {
      m.dispose();
    }
  };
  const fused = await runWith(true);
  const plain = await runWith(false);
  expect(fused.tokens).toEqual(plain.tokens);
  fused.logprobs.forEach((lp, i) => expect(Math.abs(lp - plain.logprobs[i]!)).toBeLessThanOrEqual(1e-5 * (1 + Math.abs(plain.logprobs[i]!))));
  await expect(PolicyModel.create(tinyConfig('qwen3'), { fusedDecode: 'yes' as unknown as boolean })).rejects.toThrow(/options\.fusedDecode/);
});
