// Plain float64 references and helpers for the native kernel tests: a seeded
// RNG, bf16 rounding, per-row softmax statistics, verl's policy loss, the
// Gumbel-max RNG of native/kernels/rng.h (BigInt SplitMix64), and a
// tolerance check that reports the first mismatches.

/** Seeded generator (SplitMix32 variant of mulberry32), uniform in [0, 1). */
export function makeRandom(seed: number) {
  let a = seed >>> 0;
  const uniform = (): number => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const normal = (): number => {
    const u = Math.max(uniform(), 1e-12);
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * uniform());
  };
  const int = (lo: number, hi: number): number => lo + Math.floor(uniform() * (hi - lo + 1));
  return { uniform, normal, int };
}

export function randomLogits(rng: ReturnType<typeof makeRandom>, T: number, V: number, scale: number): Float32Array {
  const x = new Float32Array(T * V);
  for (let i = 0; i < x.length; i++) x[i] = scale * rng.normal();
  return x;
}

/** float32 -> bf16 bits (round to nearest even) and back. */
export function toBf16(x: Float32Array): { bits: Uint16Array; values: Float32Array } {
  const u = new Uint32Array(x.buffer.slice(x.byteOffset, x.byteOffset + x.byteLength));
  const bits = new Uint16Array(x.length);
  const values = new Float32Array(x.length);
  const vu = new Uint32Array(values.buffer);
  for (let i = 0; i < x.length; i++) {
    const w = u[i] as number;
    const r = (w & 0x7f800000) === 0x7f800000 ? w : (w + 0x7fff + ((w >>> 16) & 1)) >>> 0;
    bits[i] = r >>> 16;
    vu[i] = ((r >>> 16) << 16) >>> 0;
  }
  return { bits, values };
}

export interface RefRow {
  z: Float64Array;
  max: number;
  lse: number;
  entropy: number;
}

/** Row statistics in float64 of z = float32(x * float32(1 / temperature)), the kernels' contract. */
export function refRow(x: ArrayLike<number>, offset: number, V: number, temperature: number): RefRow {
  const invT = Math.fround(1 / temperature);
  const z = new Float64Array(V);
  let max = -Infinity;
  for (let j = 0; j < V; j++) {
    z[j] = Math.fround((x[offset + j] as number) * invT);
    if ((z[j] as number) > max) max = z[j] as number;
  }
  if (max === -Infinity) return { z, max, lse: -Infinity, entropy: 0 };
  let s = 0;
  for (let j = 0; j < V; j++) s += Math.exp((z[j] as number) - max);
  const lse = max + Math.log(s);
  let h = 0;
  for (let j = 0; j < V; j++) {
    const zj = z[j] as number;
    if (zj !== -Infinity) h -= Math.exp(zj - lse) * (zj - lse);
  }
  return { z, max, lse, entropy: h };
}

export function refLogprob(r: RefRow, j: number): number {
  const zj = r.z[j] as number;
  return zj === -Infinity || r.lse === -Infinity ? -Infinity : zj - r.lse;
}

/**
 * |ref - out| <= atol + rtol |ref| elementwise (equal infinities, NaN == NaN);
 * throws with the first few mismatches.
 */
export function expectClose(name: string, out: ArrayLike<number>, ref: ArrayLike<number>, atol: number, rtol: number): void {
  if (out.length !== ref.length) throw new Error(`${name}: length ${out.length} vs reference ${ref.length}`);
  const bad: string[] = [];
  let count = 0;
  for (let i = 0; i < ref.length; i++) {
    const o = out[i] as number;
    const r = ref[i] as number;
    const ok = Number.isNaN(r) || Number.isNaN(o) ? Number.isNaN(r) && Number.isNaN(o)
      : !Number.isFinite(r) || !Number.isFinite(o) ? o === r : Math.abs(r - o) <= atol + rtol * Math.abs(r);
    if (!ok) {
      count++;
      if (bad.length < 5) bad.push(`  [${i}] out ${o} ref ${r} |diff| ${Math.abs(o - r).toExponential(2)}`);
    }
  }
  if (count > 0) throw new Error(`${name}: ${count} of ${ref.length} values differ (atol ${atol}, rtol ${rtol})\n${bad.join('\n')}`);
}

// ---------------------------------------------------------------- policy loss
export interface RefLossSettings {
  clipLow: number;
  clipHigh: number;
  dualClipC: number;
  klType: 'k1' | 'k2' | 'k3' | 'abs';
  klCoef: number;
  entropyCoef: number;
  aggregation: 'token-mean' | 'seq-mean-token-mean' | 'seq-mean-token-sum' | 'seq-mean-token-sum-norm';
  temperature: number;
  denominator: number;
  normConstant: number;
  gradScale: number;
}
export const REF_DEFAULTS: RefLossSettings = {
  clipLow: 0.2, clipHigh: 0.2, dualClipC: 3, klType: 'k3', klCoef: 0, entropyCoef: 0, aggregation: 'token-mean',
  temperature: 1, denominator: 0, normConstant: 0, gradScale: 1,
};
export interface RefBatch {
  T: number;
  V: number;
  targets: Int32Array;
  oldLogprobs: Float32Array;
  advantages: Float32Array;
  mask: Float32Array;
  seqIds: Int32Array;
  numSeqs: number;
  refLogprobs?: Float32Array;
}

function klRef(type: RefLossSettings['klType'], lp: number, ref: number): number {
  const d = lp - ref;
  if (type === 'k1') return d;
  if (type === 'k2') return 0.5 * d * d;
  if (type === 'abs') return Math.abs(d);
  const kl = Math.min(20, Math.max(-20, ref - lp));
  return Math.min(10, Math.max(-10, Math.exp(kl) - kl - 1));
}

/** verl compute_policy_loss + kl_penalty + entropy bonus + agg_loss, all float64, straight from the formulas. */
export function refPolicyLoss(x: ArrayLike<number>, b: RefBatch, s: RefLossSettings) {
  const { T, V } = b;
  const logp = new Float64Array(T);
  const ent = new Float64Array(T);
  const lossT = new Float64Array(T);
  const pgT = new Float64Array(T);
  let clip = 0;
  let clipLower = 0;
  let ppoKl = 0;
  let kl = 0;
  let tokens = 0;
  for (let t = 0; t < T; t++) {
    const z = new Float64Array(V);
    let m = -Infinity;
    for (let j = 0; j < V; j++) m = Math.max(m, (z[j] = (x[t * V + j] as number) / s.temperature));
    let sum = 0;
    for (let j = 0; j < V; j++) sum += Math.exp((z[j] as number) - m);
    const lse = m + Math.log(sum);
    let h = 0;
    for (let j = 0; j < V; j++) if (z[j] !== -Infinity) h -= Math.exp((z[j] as number) - lse) * ((z[j] as number) - lse);
    ent[t] = h;
    const mt = b.mask[t] as number;
    tokens += mt;
    const tg = b.targets[t] as number;
    if (tg < 0) continue;
    const lp = (z[tg] as number) - lse;
    logp[t] = lp;
    const A = b.advantages[t] as number;
    const negKl = Math.min(20, Math.max(-20, lp - (b.oldLogprobs[t] as number)));
    const ratio = Math.exp(negKl);
    const pg1 = -A * ratio;
    const pg2 = -A * Math.min(1 + s.clipHigh, Math.max(1 - s.clipLow, ratio));
    const clipped = Math.max(pg1, pg2);
    let pg = clipped;
    if (s.dualClipC > 1 && A < 0) {
      const pg3 = -A * s.dualClipC;
      pg = Math.min(pg3, clipped);
      clipLower += mt * (clipped > pg3 ? 1 : 0);
    }
    clip += mt * (pg2 > pg1 ? 1 : 0);
    ppoKl += mt * -negKl;
    const k = b.refLogprobs ? klRef(s.klType, lp, b.refLogprobs[t] as number) : 0;
    kl += mt * k;
    pgT[t] = pg;
    lossT[t] = pg + s.klCoef * k - s.entropyCoef * h;
  }
  const aggregate = (l: Float64Array): number => {
    let r = 0;
    if (s.aggregation === 'token-mean') {
      const D = s.denominator > 0 ? s.denominator : tokens;
      for (let t = 0; t < T; t++) r += D > 0 ? ((l[t] as number) * (b.mask[t] as number)) / D : 0;
    } else if (s.aggregation === 'seq-mean-token-sum-norm') {
      const N = s.denominator > 0 ? s.denominator : s.normConstant;
      for (let t = 0; t < T; t++) r += ((l[t] as number) * (b.mask[t] as number)) / N;
    } else {
      const S = s.denominator > 0 ? s.denominator : b.numSeqs;
      for (let q = 0; q < b.numSeqs; q++) {
        let sum = 0;
        let cnt = 0;
        for (let t = 0; t < T; t++) {
          if (b.seqIds[t] !== q) continue;
          sum += (l[t] as number) * (b.mask[t] as number);
          cnt += b.mask[t] as number;
        }
        if (s.aggregation === 'seq-mean-token-mean') r += cnt > 0 ? sum / cnt / S : 0;
        else r += sum / S;
      }
    }
    return r;
  };
  let entropy = 0;
  for (let t = 0; t < T; t++) entropy += (b.mask[t] as number) * (ent[t] as number);
  const div = (v: number) => (tokens > 0 ? v / tokens : 0);
  return {
    loss: aggregate(lossT) * s.gradScale, pgLoss: aggregate(pgT), pgClipfrac: div(clip), pgClipfracLower: div(clipLower),
    ppoKl: div(ppoKl), entropy: div(entropy), kl: div(kl), tokens, logprobs: logp, tokenEntropy: ent,
  };
}

/** Central finite differences of f at x (float64), step h. */
export function finiteDifferences(x: Float64Array, h: number, f: (x: Float64Array) => number): Float64Array {
  const g = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) {
    const x0 = x[i] as number;
    x[i] = x0 + h;
    const up = f(x);
    x[i] = x0 - h;
    const dn = f(x);
    x[i] = x0;
    g[i] = (up - dn) / (2 * h);
  }
  return g;
}

// ---------------------------------------------------------------- Gumbel-max RNG (native/kernels/rng.h)
const M64 = (1n << 64n) - 1n;
export function mix64(x: bigint): bigint {
  x = (x + 0x9e3779b97f4a7c15n) & M64;
  x = ((x ^ (x >> 30n)) * 0xbf58476d1ce4e5b9n) & M64;
  x = ((x ^ (x >> 27n)) * 0x94d049bb133111ebn) & M64;
  return x ^ (x >> 31n);
}
export function rowKey(seed: bigint, stream: bigint, position: bigint): bigint {
  return mix64(seed ^ mix64(stream ^ mix64(BigInt.asUintN(64, position))));
}
export function gumbel(key: bigint, j: number): number {
  const bits = mix64((key + BigInt(j) * 0xd1b54a32d192ed03n) & M64) >> 11n;
  const u = (Number(bits) + 0.5) * (1 / 9007199254740992);
  return -Math.log(-Math.log(u));
}
