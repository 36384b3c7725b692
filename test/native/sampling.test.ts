// sampleTokens: the exact Gumbel-max token against an unpruned BigInt
// reference of native/kernels/rng.h, frequencies against softmax (chi-square),
// top-k / top-p never emit excluded tokens, batch-composition invariance,
// greedy = argmax, async = sync, and argument errors.
import { sampleTokens, sampleTokensAsync } from '../../lib/native';
import { expectClose, gumbel, makeRandom, randomLogits, refLogprob, refRow, rowKey } from './reference';

interface Params { temperature: number; topK: number; topP: number; seed: bigint }

/** Allowed tokens by brute force: sort z, top-k then top-p prefixes, ties at each threshold kept. */
function allowed(x: Float32Array, off: number, V: number, p: Params): boolean[] {
  const r = refRow(x, off, V, p.temperature);
  const order = Array.from({ length: V }, (_, j) => j).sort((a, b) => (r.z[b] as number) - (r.z[a] as number) || a - b);
  let thr = -Infinity;
  if (p.topK > 0 && p.topK < V) thr = r.z[order[p.topK - 1] as number] as number;
  if (p.topP < 1) {
    let total = 0;
    for (let j = 0; j < V; j++) if ((r.z[j] as number) >= thr) total += Math.exp((r.z[j] as number) - r.max);
    let cum = 0;
    for (const j of order) {
      const z = r.z[j] as number;
      if (z < thr) break;
      cum += Math.exp(z - r.max);
      if (cum >= p.topP * total) {
        thr = z;
        break;
      }
    }
  }
  return Array.from(r.z, (z) => z >= thr && z !== -Infinity);
}

describe('sampleTokens', () => {
  const rng = makeRandom(5);

  test.each([
    [1, 0, 1, 42n],
    [0.8, 50, 1, 7n],
    [1.2, 0, 0.6, 9n],
    [1, 20, 0.5, 11n],
  ])('exact Gumbel-max token, logprob and entropy (temperature %f, topK %i, topP %f)', (temperature, topK, topP, seed) => {
    const T = 12;
    const V = 1001;
    const x = randomLogits(rng, T, V, 2.5);
    const streams = Array.from({ length: T }, (_, t) => 1000 + (t % 3));
    const positions = Array.from({ length: T }, (_, t) => 17 * t);
    const out = sampleTokens(x, T, V, { temperature, topK, topP, seed, streams, positions });
    const p = { temperature, topK, topP, seed };
    const wantLogp: number[] = [];
    const wantEnt: number[] = [];
    for (let t = 0; t < T; t++) {
      const ok = allowed(x, t * V, V, p);
      const r = refRow(x, t * V, V, temperature);
      const key = rowKey(seed, BigInt(streams[t] as number), BigInt(positions[t] as number));
      let best = -Infinity;
      let tok = -1;
      for (let j = 0; j < V; j++) {
        if (!ok[j]) continue;
        const v = (r.z[j] as number) + gumbel(key, j);
        if (v > best) [best, tok] = [v, j];
      }
      expect(out.tokens[t]).toBe(tok);
      wantLogp.push(refLogprob(r, tok));
      wantEnt.push(r.entropy);
    }
    expectClose('logprobs', out.logprobs, wantLogp, 2e-5, 2e-5);
    expectClose('entropy', out.entropy, wantEnt, 2e-5, 2e-5);
  });

  test.each([
    [1, 0, 1, 7, 40.5],
    [0.7, 3, 1, 2, 27.6],
    [1, 0, 0.8, -1, 0],
  ])('frequencies match the (restricted) softmax: temperature %f topK %i topP %f', (temperature, topK, topP, dofExpected, bound) => {
    const row = [1.0, 0.5, -0.3, 2.0, 0.0, -1.5, 1.2, 0.8];
    const V = row.length;
    const N = 20000;
    const x = new Float32Array(N * V);
    for (let i = 0; i < N; i++) x.set(row, i * V);
    const positions = Array.from({ length: N }, (_, i) => i);
    const streams = new Array<number>(N).fill(3);
    const out = sampleTokens(x, N, V, { temperature, topK, topP, seed: 99, streams, positions });
    const ok = allowed(x, 0, V, { temperature, topK, topP, seed: 99n });
    const r = refRow(x, 0, V, temperature);
    let mass = 0;
    for (let j = 0; j < V; j++) if (ok[j]) mass += Math.exp(refLogprob(r, j));
    const count = new Array<number>(V).fill(0);
    for (const tk of out.tokens) count[tk] = (count[tk] as number) + 1;
    let chi2 = 0;
    let dof = -1;
    for (let j = 0; j < V; j++) {
      if (!ok[j]) {
        expect(count[j]).toBe(0); // excluded tokens never appear
        continue;
      }
      const expected = (N * Math.exp(refLogprob(r, j))) / mass;
      chi2 += ((count[j] as number) - expected) ** 2 / expected;
      dof++;
    }
    if (dofExpected < 0) {
      // topP 0.8 keeps {3, 6, 0, 7} here (mass 0.38, 0.56, 0.70, 0.81); check the set and per-bin 5 sigma.
      expect(ok.map((v, j) => (v ? j : -1)).filter((j) => j >= 0)).toEqual([0, 3, 6, 7]);
      for (let j = 0; j < V; j++) {
        if (!ok[j]) continue;
        const q = Math.exp(refLogprob(r, j)) / mass;
        expect(Math.abs((count[j] as number) - N * q)).toBeLessThan(5 * Math.sqrt(N * q * (1 - q)));
      }
      return;
    }
    // chi-square 1e-6 upper quantiles: 7 dof -> 40.5, 2 dof -> 27.6.
    expect(dof).toBe(dofExpected);
    expect(chi2).toBeLessThan(bound);
  });

  test('a row depends only on (seed, stream, position): same token alone, reordered or batched', async () => {
    const T = 16;
    const V = 500;
    const x = randomLogits(rng, T, V, 1.5);
    const streams = Array.from({ length: T }, (_, t) => BigInt(t * 7919));
    const positions = Array.from({ length: T }, (_, t) => BigInt(100 + t));
    const opts = { temperature: 1, topP: 0.95, seed: 2024n };
    const all = sampleTokens(x, T, V, { ...opts, streams, positions, threads: 2 });
    const order = Array.from({ length: T }, (_, t) => T - 1 - t);
    const rx = new Float32Array(T * V);
    order.forEach((src, dst) => rx.set(x.subarray(src * V, (src + 1) * V), dst * V));
    const rev = sampleTokens(rx, T, V, { ...opts, streams: order.map((t) => streams[t] as bigint), positions: order.map((t) => positions[t] as bigint) });
    order.forEach((src, dst) => expect(rev.tokens[dst]).toBe(all.tokens[src]));
    for (let t = 0; t < T; t += 5) {
      const one = sampleTokens(x.slice(t * V, (t + 1) * V), 1, V, { ...opts, streams: [streams[t] as bigint], positions: [positions[t] as bigint] });
      expect(one.tokens[0]).toBe(all.tokens[t]);
    }
    const asyncOut = await sampleTokensAsync(x, T, V, { ...opts, streams, positions, threads: 1 });
    expect(asyncOut).toEqual(all);
    const tokens = new Int32Array(T);
    const filled = sampleTokens(x, T, V, { ...opts, streams, positions, out: { tokens } });
    expect(filled.tokens).toBe(tokens);
    expect(Array.from(tokens)).toEqual(Array.from(all.tokens));
  });

  test('greedy (temperature 0) is argmax with the lowest index on ties, logprob at temperature 1', () => {
    const T = 6;
    const V = 300;
    const x = randomLogits(rng, T, V, 2);
    x[2 * V + 10] = 50;
    x[2 * V + 200] = 50;
    const out = sampleTokens(x, T, V, { temperature: 0 });
    for (let t = 0; t < T; t++) {
      const row = Array.from(x.subarray(t * V, (t + 1) * V));
      expect(out.tokens[t]).toBe(row.indexOf(Math.max(...row)));
      expect(out.logprobs[t]).toBeCloseTo(refLogprob(refRow(x, t * V, V, 1), out.tokens[t] as number), 5);
    }
    expect(out.tokens[2]).toBe(10);
  });

  test('argument errors', () => {
    const x = new Float32Array(10);
    const base = { streams: [0, 1], positions: [0, 1] };
    expect(() => sampleTokens(x, 2, 5, { ...base, temperature: -1 })).toThrow('Expected a finite number >= 0 (0 = greedy) for temperature but received -1 of type number');
    expect(() => sampleTokens(x, 2, 5, { ...base, topP: 0 })).toThrow('Expected a number in (0, 1] for topP but received 0 of type number');
    expect(() => sampleTokens(x, 2, 5, { ...base, topP: NaN })).toThrow('for topP but received NaN');
    expect(() => sampleTokens(x, 2, 5, { ...base, topK: -2 })).toThrow('Expected an integer in [0, 2147483647] for topK but received -2 of type number');
    expect(() => sampleTokens(x, 2, 5, {})).toThrow('Expected an array of 2 stream ids (required when temperature > 0) for streams but received undefined');
    expect(() => sampleTokens(x, 2, 5, { streams: [0, 1], positions: [0] })).toThrow('Expected an array of 2 integers for positions but received Array(1)');
    expect(() => sampleTokens(x, 2, 5, { ...base, seed: -1 })).toThrow('Expected a non-negative integer or bigint < 2^64 for seed but received -1');
    const nan = new Float32Array(10);
    nan[7] = NaN;
    expect(() => sampleTokens(nan, 2, 5, base)).toThrow('sampleTokens: logits row 1 contains NaN or +inf');
  });
});
