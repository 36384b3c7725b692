// The entropy-driven branch decision of ARPO (ARPO.md section 1, steps 2-4)
// and the counter-based keys that keep a rollout deterministic: per-path
// sampling streams and per-decision uniforms are hashes, never a shared RNG.
import { invalidArgument } from '../errors';
import type { BranchRule } from './settings';

const MASK64 = (1n << 64n) - 1n;

/** SplitMix64 finaliser, bit-identical to `arpo::rng::mix64` in native/kernels/rng.h. */
export function mix64(value: bigint): bigint {
  let x = (value + 0x9e3779b97f4a7c15n) & MASK64;
  x = ((x ^ (x >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
  x = ((x ^ (x >> 27n)) * 0x94d049bb133111ebn) & MASK64;
  return x ^ (x >> 31n);
}

/** A run seed as an unsigned 64-bit integer. */
export function seedToU64(seed: bigint | number, name = 'seed'): bigint {
  if (typeof seed === 'bigint') {
    if (seed < 0n || seed > MASK64) throw invalidArgument('an unsigned 64-bit integer', name, seed);
    return seed;
  }
  if (typeof seed !== 'number' || !Number.isSafeInteger(seed) || seed < 0) {
    throw invalidArgument('a non-negative safe integer or bigint', name, seed);
  }
  return BigInt(seed);
}

/** Uniform in the open interval (0, 1) from a 64-bit key: 53 bits, centred (as rng::uniform). */
export function uniformFromKey(key: bigint): number {
  const bits = mix64(key) >> 11n;
  return (Number(bits) + 0.5) / 9007199254740992;
}

// Domain tag so decision keys never coincide with sampling keys.
const BRANCH_DOMAIN = 0x4152504f5f425241n; // "ARPO_BRA"

/**
 * The bernoulli rule's uniform for one decision: a hash of (seed, prompt,
 * path, tool-call index), so it does not depend on which decisions were made
 * before it, in which order, or on timing.
 */
export function decisionUniform(seed: bigint, prompt: number, path: number, toolCall: number): number {
  const key = mix64(seed ^ mix64(BRANCH_DOMAIN ^ mix64(BigInt(prompt) ^ mix64(BigInt(path) ^ mix64(BigInt(toolCall))))));
  return uniformFromKey(key);
}

/** Stream order reserved for a prompt's prefill path (its sample is discarded). */
export const PREFILL_STREAM_ORDER = 0xffffffff;

/**
 * Stream order of a prompt's refill j (its j-th fresh global sample after the
 * first N): 2^31 + j, keyed by the refill index rather than by the path's
 * creation order, so a refill samples the same tokens whether it starts once
 * every path has finished or speculatively with the first paths.
 */
export function refillStreamOrder(j: number): number {
  if (!Number.isInteger(j) || j < 0 || j >= 2 ** 31 - 1) throw invalidArgument('a refill index in [0, 2^31 - 1)', 'refill', j);
  return 2 ** 31 + j;
}

/**
 * Sampling stream of a path: (prompt index, creation order within the
 * prompt) packed as prompt · 2^32 + order (refills: {@link refillStreamOrder}).
 * Unique within a step; the step's seed separates steps.
 */
export function pathStream(prompt: number, order: number): bigint {
  if (!Number.isInteger(prompt) || prompt < 0 || prompt >= 2 ** 31) throw invalidArgument('a prompt index in [0, 2^31)', 'prompt', prompt);
  if (!Number.isInteger(order) || order < 0 || order > PREFILL_STREAM_ORDER) throw invalidArgument('a path order in [0, 2^32)', 'order', order);
  return (BigInt(prompt) << 32n) | BigInt(order);
}

/** P_t = clamp(α + β·ΔH_t, 0, 1) (ARPO.md section 1, step 4). */
export function branchProbability(alpha: number, beta: number, deltaEntropy: number): number {
  const p = alpha + beta * deltaEntropy;
  return p < 0 ? 0 : p > 1 ? 1 : p;
}

/**
 * Does the rule fire? `threshold`: P_t > τ (the paper). `bernoulli`: u < P_t,
 * i.e. the reference's `u − β·ΔH ≤ α` up to the measure-zero boundary, so it
 * fires with probability exactly P_t.
 */
export function branchFires(rule: BranchRule, probability: number, threshold: number, uniform: number): boolean {
  return rule === 'threshold' ? probability > threshold : uniform < probability;
}

/**
 * The reference's entropy estimate from the top-k log-probabilities of one
 * sampled position: −Σ_{i ≤ k} exp(l_i)·l_i (the missing tail mass is
 * ignored, so it underestimates), normalised by ln V like the exact one.
 */
export function topKEntropy(topLogprobs: ArrayLike<number>, offset: number, k: number, vocabSize: number): number {
  let h = 0;
  for (let i = 0; i < k; i++) {
    const l = topLogprobs[offset + i] as number;
    if (l > -Infinity) h -= Math.exp(l) * l;
  }
  return vocabSize > 1 ? h / Math.log(vocabSize) : 0;
}

/**
 * The mean of the first k values of a segment (the window of
 * `arpo::kernels::entropy_delta`): values beyond k are ignored, an empty
 * window has mean 0.
 */
export class EntropyWindow {
  private sum = 0;
  private n = 0;
  constructor(readonly k: number) {}
  /** Adds a value while the window is open; returns true when this value filled it. */
  add(value: number): boolean {
    if (this.n >= this.k) return false;
    this.sum += value;
    this.n++;
    return this.n === this.k;
  }
  get count(): number {
    return this.n;
  }
  get full(): boolean {
    return this.n >= this.k;
  }
  get mean(): number {
    return this.n === 0 ? 0 : this.sum / this.n;
  }
}
