// logitsStats against the float64 reference: odd shape, full Qwen vocabulary
// row, bf16, extreme logits, V = 1, T = 0, async = sync, and argument errors.
import { loadNative, logitsStats, logitsStatsAsync } from '../../lib/native';
import { expectClose, makeRandom, randomLogits, refLogprob, refRow, toBf16 } from './reference';

function reference(x: Float32Array, T: number, V: number, temperature: number, targets?: Int32Array) {
  const lse = new Float64Array(T);
  const ent = new Float64Array(T);
  const norm = new Float64Array(T);
  const logp = new Float64Array(T);
  for (let t = 0; t < T; t++) {
    const r = refRow(x, t * V, V, temperature);
    lse[t] = r.lse;
    ent[t] = r.entropy;
    norm[t] = V > 1 ? r.entropy / Math.log(V) : 0;
    const tg = targets ? (targets[t] as number) : -1;
    logp[t] = tg < 0 ? 0 : refLogprob(r, tg);
  }
  return { lse, ent, norm, logp };
}

function compare(name: string, out: ReturnType<typeof logitsStats>, ref: ReturnType<typeof reference>, tol = 2e-5) {
  expectClose(`${name} logsumexp`, out.logsumexp, ref.lse, tol, tol);
  expectClose(`${name} entropy`, out.entropy, ref.ent, tol, tol);
  expectClose(`${name} entropyNorm`, out.entropyNorm, ref.norm, tol, tol);
  if (out.targetLogprob) expectClose(`${name} targetLogprob`, out.targetLogprob, ref.logp, tol, tol);
}

describe('logitsStats', () => {
  const rng = makeRandom(1);

  test.each([
    [7, 1001, 1],
    [7, 1001, 0.7],
    [2, 151936, 1],
    [5, 256, 1.3],
    [3, 17, 1],
  ])('float32 and bf16, T=%i V=%i temperature %f', (T, V, temperature) => {
    const x = randomLogits(rng, T, V, 3);
    const targets = Int32Array.from({ length: T }, (_, t) => (t % 4 === 3 ? -1 : rng.int(0, V - 1)));
    compare('f32', logitsStats(x, T, V, { targets, temperature }), reference(x, T, V, temperature, targets));
    const { bits, values } = toBf16(x);
    compare('bf16', logitsStats(bits, T, V, { targets, temperature }), reference(values, T, V, temperature, targets));
  });

  test('extreme logits: +-1e4, -inf entries, a row of all -inf, one finite value', () => {
    const V = 300;
    const x = new Float32Array(4 * V);
    for (let j = 0; j < V; j++) {
      x[j] = (rng.uniform() < 0.5 ? 1 : -1) * 1e4 * rng.uniform();
      x[V + j] = j % 3 === 0 ? -Infinity : rng.normal();
      x[2 * V + j] = -Infinity;
      x[3 * V + j] = j === 123 ? 5 : -Infinity;
    }
    const targets = Int32Array.from([0, 0, 5, 123]);
    const out = logitsStats(x, 4, V, { targets });
    compare('extremes', out, reference(x, 4, V, 1, targets));
    expect([out.logsumexp[2], out.entropy[2], out.targetLogprob?.[2]]).toEqual([-Infinity, 0, -Infinity]);
    expect([out.logsumexp[3], out.entropy[3], out.targetLogprob?.[3]]).toEqual([5, 0, 0]);
    expect(out.targetLogprob?.[1]).toBe(-Infinity);
  });

  test('V = 1 gives entropy 0 and T = 0 gives empty results', () => {
    const out = logitsStats(Float32Array.from([2.5, -1]), 2, 1, { targets: [0, 0] });
    expect(Array.from(out.entropy)).toEqual([0, 0]);
    expect(Array.from(out.entropyNorm)).toEqual([0, 0]);
    expect(Array.from(out.logsumexp)).toEqual([2.5, -1]);
    expect(Array.from(out.targetLogprob ?? [])).toEqual([0, 0]);
    const empty = logitsStats(new Float32Array(0), 0, 10);
    expect(empty.logsumexp.length).toBe(0);
    expect(empty.targetLogprob).toBeNull();
  });

  test('NaN logits give NaN stats for their row only', () => {
    const x = randomLogits(rng, 2, 40, 1);
    x[45] = NaN;
    const out = logitsStats(x, 2, 40);
    expect(Number.isNaN(out.logsumexp[1])).toBe(true);
    expect(Number.isFinite(out.logsumexp[0])).toBe(true);
  });

  test('async equals sync, threads do not change results', async () => {
    const x = randomLogits(rng, 33, 3001, 2);
    const targets = Int32Array.from({ length: 33 }, () => rng.int(0, 3000));
    const a = logitsStats(x, 33, 3001, { targets, threads: 1 });
    const b = await logitsStatsAsync(x, 33, 3001, { targets, threads: 2 });
    expect(b).toEqual(a);
  });

  test('caller-provided outputs are filled in place', () => {
    const x = randomLogits(rng, 3, 50, 1);
    const logsumexp = new Float32Array(3);
    const out = logitsStats(x, 3, 50, { out: { logsumexp } });
    expect(out.logsumexp).toBe(logsumexp);
    expect(Array.from(logsumexp)).toEqual(Array.from(logitsStats(x, 3, 50).logsumexp));
    expect(() => logitsStats(x, 3, 50, { out: { entropy: new Float32Array(2) } })).toThrow('Expected a Float32Array of 3 values for out.entropy but received Float32Array(2)');
  });

  test('argument errors name the argument and the value', () => {
    const x = new Float32Array(10);
    expect(() => logitsStats(x, 2, 4)).toThrow('Expected a logits array of T * V = 8 values for logits but received Float32Array(10) of type Float32Array');
    expect(() => logitsStats(x, 2, 5, { temperature: 0 })).toThrow('Expected a finite number > 0 for temperature but received 0 of type number');
    expect(() => logitsStats(x, 2, 5, { temperature: NaN })).toThrow('for temperature but received NaN of type number');
    expect(() => logitsStats(x, 2, 5, { targets: [0, 5] })).toThrow('Expected an integer in [-2147483648, 4] for targets[1] but received 5 of type number');
    expect(() => logitsStats(x, 2.5, 4)).toThrow('Expected an integer >= 0 for T but received 2.5 of type number');
    expect(() => logitsStats(x, 10, 0)).toThrow('Expected an integer >= 1 for V but received 0 of type number');
    expect(() => logitsStats([1, 2] as unknown as Float32Array, 1, 2)).toThrow('for logits but received Array(2) of type array');
    expect(() => logitsStats(x, 2, 5, { threads: -1 })).toThrow('Expected an integer in [0, 1024] for threads');
  });

  test('the C++ layer re-checks lengths it is given directly', async () => {
    expect(() => loadNative().logitsStats(new Float32Array(3), 2, 2, null, 1, 1, null, null, null, null)).toThrow(
      'logitsStats: expected a Float32Array of length 4, got length 3 for logits');
    await expect(loadNative().logitsStatsAsync(new Float32Array(4), 2, 2, null, 1, 1, new Float32Array(1), null, null, null))
      .rejects.toThrow('expected a Float32Array of length 2, got length 1 for logsumexp');
  });
});
