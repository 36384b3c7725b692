// policyLoss against the float64 TS reference of verl's loss: loss, metrics,
// per-token logprobs/entropy, and the gradient against central finite
// differences of the reference (float64) and of the native loss itself;
// every aggregation, dual clip, each KL type, entropy bonus, all options at
// once (bf16 too), in-place gradient, async = sync, and argument errors.
import { policyLoss, policyLossAsync, type PolicyLossKernelSettings } from '../../lib/native';
import {
  REF_DEFAULTS, expectClose, finiteDifferences, makeRandom, randomLogits, refLogprob, refPolicyLoss, refRow, toBf16,
  type RefBatch, type RefLossSettings,
} from './reference';

function makeBatch(seed: number, T: number, V: number, numSeqs: number) {
  const rng = makeRandom(seed);
  const logits = randomLogits(rng, T, V, 2);
  const b: RefBatch = {
    T, V, numSeqs,
    targets: new Int32Array(T), oldLogprobs: new Float32Array(T), advantages: new Float32Array(T), mask: new Float32Array(T),
    seqIds: new Int32Array(T), refLogprobs: new Float32Array(T),
  };
  for (let t = 0; t < T; t++) {
    const tg = rng.int(0, V - 1);
    const lp = refLogprob(refRow(logits, t * V, V, 1), tg);
    b.targets[t] = tg;
    b.oldLogprobs[t] = lp + 0.4 * rng.normal(); // ratios spread over ~[0.5, 2]: clipping happens
    (b.refLogprobs as Float32Array)[t] = lp + 0.3 * rng.normal();
    b.advantages[t] = rng.normal();
    if (t % 3 === 1) {
      // ratio e^1.5 ~ 4.5 with A < 0: beyond the dual-clip bound c = 3 (pg_clipfrac_lower, zero gradient).
      b.oldLogprobs[t] = lp - 1.5;
      b.advantages[t] = -Math.abs(b.advantages[t] as number) - 0.1;
    }
    b.mask[t] = rng.uniform() < 0.8 || t % 3 === 1 ? 1 : 0;
    b.seqIds[t] = Math.floor((t * numSeqs) / T);
  }
  return { logits, b };
}

function check(name: string, logits: Float32Array, b: RefBatch, s: RefLossSettings, withRef: boolean, bf16 = false) {
  const x = bf16 ? toBf16(logits) : { bits: logits, values: logits };
  const batch = { ...b, refLogprobs: withRef ? b.refLogprobs : undefined };
  const settings: Partial<PolicyLossKernelSettings> = { ...s };
  const out = policyLoss(x.bits, b.T, b.V, batch, settings, { grad: true, threads: 2 });
  const ref = refPolicyLoss(x.values, batch, s);
  for (const key of ['loss', 'pgLoss', 'pgClipfrac', 'pgClipfracLower', 'ppoKl', 'entropy', 'kl', 'tokens'] as const) {
    expectClose(`${name} ${key}`, [out[key]], [ref[key]], 1e-6, 1e-5);
  }
  expectClose(`${name} logprobs`, out.logprobs, ref.logprobs, 2e-6, 1e-5);
  expectClose(`${name} tokenEntropy`, out.tokenEntropy, ref.tokenEntropy, 2e-6, 1e-5);
  const fd = finiteDifferences(Float64Array.from(x.values), 1e-5, (v) => refPolicyLoss(v, batch, s).loss);
  const gmax = fd.reduce((m, g) => Math.max(m, Math.abs(g)), 0);
  expectClose(`${name} grad vs finite differences`, out.grad as Float32Array, fd, 2e-5 * gmax + 1e-7, 1e-3);
}

describe('policyLoss', () => {
  const { logits, b } = makeBatch(3, 7, 23, 3); // odd shape

  test.each([
    ['token-mean', 3], ['token-mean', 0], ['seq-mean-token-mean', 3], ['seq-mean-token-mean', 0],
    ['seq-mean-token-sum', 3], ['seq-mean-token-sum', 0], ['seq-mean-token-sum-norm', 3], ['seq-mean-token-sum-norm', 0],
  ] as const)('aggregation %s, dual clip %f', (aggregation, dualClipC) => {
    check(aggregation, logits, b, { ...REF_DEFAULTS, aggregation, dualClipC, normConstant: 16 }, false);
    const r = policyLoss(logits, b.T, b.V, b, { aggregation, dualClipC, normConstant: 16 });
    expect(r.pgClipfrac).toBeGreaterThan(0); // the batch exercises the clip ...
    if (dualClipC > 1) expect(r.pgClipfracLower).toBeGreaterThan(0); // ... and the dual clip
  });

  test.each(['k1', 'k2', 'k3', 'abs'] as const)('KL %s to the reference policy', (klType) => {
    check(`kl ${klType}`, logits, b, { ...REF_DEFAULTS, klType, klCoef: 0.3 }, true);
  });

  test('entropy bonus', () => {
    check('entropy', logits, b, { ...REF_DEFAULTS, entropyCoef: 0.05 }, false);
  });

  test('every option at once, float32 and bf16', () => {
    const all: RefLossSettings = {
      clipLow: 0.15, clipHigh: 0.28, dualClipC: 2.5, klType: 'k3', klCoef: 0.2, entropyCoef: 0.01,
      aggregation: 'seq-mean-token-mean', temperature: 0.7, denominator: 5, normConstant: 0, gradScale: 0.5,
    };
    check('all f32', logits, b, all, true);
    check('all bf16', logits, b, all, true, true);
  });

  test('gradient matches finite differences of the native loss itself', () => {
    const small = makeBatch(4, 3, 9, 1);
    const s = { entropyCoef: 0.05, temperature: 0.9 };
    const out = policyLoss(small.logits, 3, 9, small.b, s, { grad: true });
    const h = 1e-2; // float32 logits: a large step keeps rounding noise small against the difference
    const x = Float32Array.from(small.logits);
    const fd = new Float64Array(x.length);
    for (let i = 0; i < x.length; i++) {
      const x0 = x[i] as number;
      x[i] = x0 + h;
      const up = policyLoss(x, 3, 9, small.b, s).loss;
      x[i] = x0 - h;
      const dn = policyLoss(x, 3, 9, small.b, s).loss;
      x[i] = x0;
      fd[i] = (up - dn) / (2 * h);
    }
    const gmax = fd.reduce((m, g) => Math.max(m, Math.abs(g)), 0);
    expectClose('native grad vs native finite differences', out.grad as Float32Array, fd, 2e-3 * gmax, 2e-2);
  });

  test("in-place gradient ('logits') equals the separate buffer; masked rows get zeros; async equals sync", async () => {
    const big = makeBatch(5, 11, 517, 4);
    big.b.targets[4] = -1; // ignored token: only allowed where mask is 0
    big.b.mask[4] = 0;
    const s = { entropyCoef: 0.02, aggregation: 'seq-mean-token-mean' as const };
    const sep = policyLoss(big.logits, 11, 517, big.b, s, { grad: true, threads: 1 });
    const async = await policyLossAsync(big.logits, 11, 517, big.b, s, { grad: true, threads: 2 });
    expect(async).toEqual(sep);
    const inplace = Float32Array.from(big.logits);
    const r = policyLoss(inplace, 11, 517, big.b, s, { grad: 'logits' });
    expect(r.grad).toBe(inplace);
    expect(Buffer.from(inplace.buffer).equals(Buffer.from((sep.grad as Float32Array).buffer))).toBe(true);
    expect(r.loss).toBe(sep.loss);
    expect((sep.grad as Float32Array).subarray(4 * 517, 5 * 517).every((g) => g === 0)).toBe(true);
    expect(sep.logprobs[4]).toBe(0);
    const fwd = policyLoss(big.logits, 11, 517, big.b, s);
    expect(fwd.grad).toBeNull();
    expect(fwd.loss).toBe(sep.loss);
  });

  test('T = 0 and fully masked batches give zero loss and metrics', () => {
    const empty = policyLoss(new Float32Array(0), 0, 5, { targets: [], oldLogprobs: [], advantages: [], mask: [] });
    expect([empty.loss, empty.tokens, empty.entropy]).toEqual([0, 0, 0]);
    const masked = { ...b, mask: new Float32Array(b.T) };
    const out = policyLoss(logits, b.T, b.V, masked, {}, { grad: true });
    expect([out.loss, out.tokens, out.pgClipfrac]).toEqual([0, 0, 0]);
    expect((out.grad as Float32Array).every((g) => g === 0)).toBe(true);
  });

  test('argument errors name the argument and the value', () => {
    const call = (patch: object, settings: object = {}, options: object = {}) => () =>
      policyLoss(logits, b.T, b.V, { ...b, ...patch }, settings as Partial<PolicyLossKernelSettings>, options);
    const t = Array.from(b.targets);
    expect(call({ targets: [...t.slice(0, 6), 23] })).toThrow('Expected an integer in [-2147483648, 22] for targets[6] but received 23 of type number');
    const masked = Array.from(b.mask);
    masked[2] = 1;
    expect(call({ targets: [t[0], t[1], -1, ...t.slice(3)], mask: masked })).toThrow('Expected a token id in [0, 23) where mask is not 0 for targets[2] but received -1');
    expect(call({ advantages: [1, 2] })).toThrow('Expected an array of 7 numbers for advantages but received Array(2) of type array');
    expect(call({ mask: [1, 1, NaN, 1, 1, 1, 1] })).toThrow('Expected a finite number for mask[2] but received NaN of type number');
    expect(call({}, { klType: 'k9' })).toThrow('Unknown KL type "k9"; known: abs, k1, k2, k3, kl, low_var_kl, mse');
    expect(call({}, { aggregation: 'sum' })).toThrow('Unknown loss aggregation "sum"; known:');
    expect(call({}, { clipLow: -0.1 })).toThrow('Expected a finite number >= 0 for clipLow but received -0.1 of type number');
    expect(call({}, { temperature: NaN })).toThrow('Expected a finite number > 0 for temperature but received NaN');
    expect(call({}, { aggregation: 'seq-mean-token-sum-norm' })).toThrow('Expected a number > 0 for seq-mean-token-sum-norm (e.g. the max response length) for normConstant but received 0');
    expect(call({ refLogprobs: undefined }, { klCoef: 0.1 })).toThrow('Expected an array of reference log-probabilities (klCoef != 0) for refLogprobs but received undefined');
    expect(call({}, { clipLo: 0.1 })).toThrow('Unknown policy-loss setting "clipLo"');
    expect(call({}, {}, { grad: new Float32Array(3) })).toThrow('Expected a Float32Array of 161 values for grad but received Float32Array(3)');
    const bits = toBf16(logits).bits;
    expect(() => policyLoss(bits, b.T, b.V, b, {}, { grad: 'logits' })).toThrow("Expected a caller Float32Array or true ('logits' needs float32 logits) for grad");
  });
});
