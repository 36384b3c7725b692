// Public typed wrappers of the fused native kernels (native/kernels/kernels.h):
// logits statistics, sampling, entropy change, the clipped-ratio policy loss
// and the rollout-tree reductions. Every argument is validated here; native
// errors are rethrown as ArpoError('NATIVE_OP_FAILED', '<op>: <message>').
import { invalidArgument, unknownName } from '../errors';
import { loadNative } from './loader';
import type { LogitsArray, PolicyLossResult, RawPolicyLossConfig } from './types';
import {
  callNative, callNativeAsync, checkFloat32Out, checkInteger, checkLogits, checkNumber, checkOptions, checkThreads,
  toBigInt64, toBigUint64, toFloat32, toInt32, toSeed,
} from './validate';

const INT32_MAX = 2147483647;

// ---------------------------------------------------------------- logitsStats
export interface LogitsStatsOptions {
  /** (T) token id per row whose log-probability to return; negative = ignore (0). */
  targets?: ArrayLike<number>;
  /** z = logits / temperature (default 1). */
  temperature?: number;
  /** Worker threads; 0 (default) = every hardware thread. */
  threads?: number;
  /** Caller-provided (T) Float32Array outputs to fill instead of new ones (e.g. in a decode loop). */
  out?: Partial<LogitsStats>;
}
export interface LogitsStats {
  /** (T) log Σ_j exp(z_j). */
  logsumexp: Float32Array;
  /** (T) entropy in nats of softmax(z). */
  entropy: Float32Array;
  /** (T) entropy / ln V, in [0, 1] (0 when V = 1). */
  entropyNorm: Float32Array;
  /** (T) log p(target) (0 for ignored targets); null without targets. */
  targetLogprob: Float32Array | null;
}

function statsArgs(logits: LogitsArray, T: number, V: number, options: LogitsStatsOptions | undefined) {
  const dims = checkLogits(logits, T, V);
  const o = checkOptions(options, 'options');
  const temperature = o.temperature === undefined ? 1 : checkNumber(o.temperature, 'temperature', 'a finite number > 0', (x) => x > 0);
  const targets = o.targets === undefined ? null : toInt32(o.targets, 'targets', dims.T, -INT32_MAX - 1, dims.V - 1);
  const given = checkOptions(o.out, 'out');
  const buffer = (name: keyof LogitsStats) =>
    given[name] === undefined || given[name] === null ? new Float32Array(dims.T) : checkFloat32Out(given[name], `out.${name}`, dims.T);
  const out: LogitsStats = {
    logsumexp: buffer('logsumexp'),
    entropy: buffer('entropy'),
    entropyNorm: buffer('entropyNorm'),
    targetLogprob: targets ? buffer('targetLogprob') : null,
  };
  const args = [logits, dims.T, dims.V, targets, temperature, checkThreads(o.threads), out.logsumexp, out.entropy, out.entropyNorm, out.targetLogprob] as const;
  return { args, out };
}

/** Fused per-row logsumexp, entropy, normalised entropy and target log-probability, one read of the logits. */
export function logitsStats(logits: LogitsArray, T: number, V: number, options?: LogitsStatsOptions): LogitsStats {
  const { args, out } = statsArgs(logits, T, V, options);
  callNative('logitsStats', () => loadNative().logitsStats(...args));
  return out;
}

/** logitsStats off the JS thread. Do not modify the logits until the Promise settles. */
export async function logitsStatsAsync(logits: LogitsArray, T: number, V: number, options?: LogitsStatsOptions): Promise<LogitsStats> {
  const { args, out } = statsArgs(logits, T, V, options);
  await callNativeAsync('logitsStatsAsync', () => loadNative().logitsStatsAsync(...args));
  return out;
}

// ---------------------------------------------------------------- sampleTokens
export interface SamplingOptions {
  /** > 0 samples from softmax(logits / temperature); 0 = greedy (default 1). */
  temperature?: number;
  /** Keep the k most likely tokens (ties at the k-th included); 0 = all (default). */
  topK?: number;
  /** Keep the smallest most-likely set with mass >= topP, in (0, 1] (default 1 = all). */
  topP?: number;
  /** Seed of the counter-based RNG (default 0). */
  seed?: bigint | number;
  /** (T) stream id per row, e.g. the path id (required when temperature > 0). */
  streams?: ArrayLike<number | bigint>;
  /** (T) position per row, e.g. the token index in the path (required when temperature > 0). */
  positions?: ArrayLike<number | bigint>;
  threads?: number;
  /** Caller-provided (T) outputs to fill instead of new ones. */
  out?: Partial<SampledTokens>;
}
export interface SampledTokens {
  /** (T) sampled token ids. */
  tokens: Int32Array;
  /** (T) log-probability of each token under the full softmax(z / temperature) (temperature 1 when greedy). */
  logprobs: Float32Array;
  /** (T) entropy (nats) of that distribution. */
  entropy: Float32Array;
  /** (T) entropy / ln V. */
  entropyNorm: Float32Array;
}

function sampleArgs(logits: LogitsArray, T: number, V: number, options: SamplingOptions | undefined) {
  const dims = checkLogits(logits, T, V);
  const o = checkOptions(options, 'options');
  const temperature = o.temperature === undefined ? 1 : checkNumber(o.temperature, 'temperature', 'a finite number >= 0 (0 = greedy)', (x) => x >= 0);
  const topK = o.topK === undefined ? 0 : checkInteger(o.topK, 'topK', 0, INT32_MAX);
  const topP = o.topP === undefined ? 1 : checkNumber(o.topP, 'topP', 'a number in (0, 1]', (x) => x > 0 && x <= 1);
  const seed = toSeed(o.seed);
  let streams: BigUint64Array | null = null;
  let positions: BigInt64Array | null = null;
  if (temperature > 0 || o.streams !== undefined || o.positions !== undefined) {
    if (o.streams === undefined) throw invalidArgument(`an array of ${dims.T} stream ids (required when temperature > 0)`, 'streams', o.streams);
    if (o.positions === undefined) throw invalidArgument(`an array of ${dims.T} positions (required when temperature > 0)`, 'positions', o.positions);
    streams = toBigUint64(o.streams, 'streams', dims.T);
    positions = toBigInt64(o.positions, 'positions', dims.T, -(2n ** 63n));
  }
  const given = checkOptions(o.out, 'out');
  const buffer = (name: 'logprobs' | 'entropy' | 'entropyNorm') =>
    given[name] === undefined ? new Float32Array(dims.T) : checkFloat32Out(given[name], `out.${name}`, dims.T);
  let tokens: Int32Array = new Int32Array(dims.T);
  if (given.tokens !== undefined) {
    if (!(given.tokens instanceof Int32Array) || given.tokens.length !== dims.T) throw invalidArgument(`an Int32Array of ${dims.T} values`, 'out.tokens', given.tokens);
    tokens = given.tokens;
  }
  const out: SampledTokens = { tokens, logprobs: buffer('logprobs'), entropy: buffer('entropy'), entropyNorm: buffer('entropyNorm') };
  const args = [logits, dims.T, dims.V, streams, positions, temperature, topK, topP, seed, checkThreads(o.threads),
    out.tokens, out.logprobs, out.entropy, out.entropyNorm] as const;
  return { args, out };
}

/**
 * Samples one token per row by Gumbel-max with a counter-based RNG: the
 * token of a row depends only on its logits and (seed, stream, position),
 * never on the rest of the batch. Also returns its logprob and the entropy.
 */
export function sampleTokens(logits: LogitsArray, T: number, V: number, options?: SamplingOptions): SampledTokens {
  const { args, out } = sampleArgs(logits, T, V, options);
  callNative('sampleTokens', () => loadNative().sampleTokens(...args));
  return out;
}

/** sampleTokens off the JS thread. */
export async function sampleTokensAsync(logits: LogitsArray, T: number, V: number, options?: SamplingOptions): Promise<SampledTokens> {
  const { args, out } = sampleArgs(logits, T, V, options);
  await callNativeAsync('sampleTokensAsync', () => loadNative().sampleTokensAsync(...args));
  return out;
}

// ---------------------------------------------------------------- entropyDelta
export interface EntropySegments {
  /** (S) first token of each segment in the entropy array. */
  starts: ArrayLike<number>;
  /** (S) one past the last token of each segment. */
  ends: ArrayLike<number>;
  /** (S) index of the segment holding the trajectory's initial window; negative or itself = no delta. */
  baseline?: ArrayLike<number>;
}
export interface EntropyDelta {
  /** (S) mean normalised entropy over the first min(k, length) tokens (0 for empty segments). */
  windowMean: Float32Array;
  /** (S) that token count. */
  windowCount: Int32Array;
  /** (S) windowMean[s] - windowMean[baseline[s]] (ΔH of ARPO.md section 1). */
  delta: Float32Array;
}

/** Windowed entropy after each tool call and its change against the trajectory's initial window. */
export function entropyDelta(entropy: ArrayLike<number>, segments: EntropySegments, k: number): EntropyDelta {
  const T = entropy?.length;
  const ent = toFloat32(entropy, 'entropy', typeof T === 'number' ? T : -1);
  if (segments === null || typeof segments !== 'object') throw invalidArgument('an object { starts, ends, baseline? }', 'segments', segments);
  const S = segments.starts?.length;
  if (typeof S !== 'number') throw invalidArgument('an array of segment starts', 'starts', segments.starts);
  const starts = toBigInt64(segments.starts, 'starts', S, 0n);
  const ends = toBigInt64(segments.ends, 'ends', S, 0n);
  for (let s = 0; s < S; s++) {
    const b = Number(starts[s]);
    const e = Number(ends[s]);
    if (b > ent.length) throw invalidArgument(`a start in [0, ${ent.length}]`, `starts[${s}]`, b);
    if (e < b || e > ent.length) throw invalidArgument(`an end in [starts[${s}] = ${b}, ${ent.length}]`, `ends[${s}]`, e);
  }
  const baseline = segments.baseline === undefined ? null : toInt32(segments.baseline, 'baseline', S, -INT32_MAX - 1, S - 1);
  const kk = checkInteger(k, 'k', 1, INT32_MAX);
  const out: EntropyDelta = { windowMean: new Float32Array(S), windowCount: new Int32Array(S), delta: new Float32Array(S) };
  callNative('entropyDelta', () => loadNative().entropyDelta(ent, starts, ends, baseline, kk, out.windowMean, out.windowCount, out.delta));
  return out;
}

// ---------------------------------------------------------------- policyLoss
export const KERNEL_KL_TYPES = { k1: 0, kl: 0, k2: 1, mse: 1, k3: 2, low_var_kl: 2, abs: 3 } as const;
export const KERNEL_AGGREGATIONS = { 'token-mean': 0, 'seq-mean-token-mean': 1, 'seq-mean-token-sum': 2, 'seq-mean-token-sum-norm': 3 } as const;
export type KernelKLType = keyof typeof KERNEL_KL_TYPES;
export type KernelAggregation = keyof typeof KERNEL_AGGREGATIONS;

/** Loss settings (verl core_algos names in camelCase). */
export interface PolicyLossKernelSettings {
  /** Ratio clipped below at 1 - clipLow (0.2). */
  clipLow: number;
  /** Ratio clipped above at 1 + clipHigh (0.2). */
  clipHigh: number;
  /** Dual-clip bound c for A < 0 (3); <= 1 disables it. */
  dualClipC: number;
  /** KL estimator to the reference: k1 | k2 | k3 (low_var_kl) | abs, or verl's kl | mse | low_var_kl (k3). */
  klType: KernelKLType;
  /** KL coefficient (0); != 0 needs refLogprobs. */
  klCoef: number;
  /** Entropy bonus: loss -= entropyCoef · H (0). */
  entropyCoef: number;
  aggregation: KernelAggregation;
  /** Logits are divided by it (1). */
  temperature: number;
  /** > 0 replaces sum(mask) / the sequence count / normConstant (gradient accumulation); 0 = from the batch. */
  denominator: number;
  /** Divisor of seq-mean-token-sum-norm (e.g. the max response length); must be > 0 there unless denominator is. */
  normConstant: number;
  /** Multiplies loss and gradient (1). */
  gradScale: number;
}
const DEFAULT_SETTINGS: PolicyLossKernelSettings = {
  clipLow: 0.2, clipHigh: 0.2, dualClipC: 3, klType: 'k3', klCoef: 0, entropyCoef: 0, aggregation: 'token-mean',
  temperature: 1, denominator: 0, normConstant: 0, gradScale: 1,
};

export interface PolicyLossBatch {
  /** (T) sampled token per row; negative only where mask is 0. */
  targets: ArrayLike<number>;
  /** (T) log-probabilities under the rollout policy. */
  oldLogprobs: ArrayLike<number>;
  /** (T) advantage per token. */
  advantages: ArrayLike<number>;
  /** (T) 1 for loss tokens, 0 for prompt / tool-result / padding (or weights). */
  mask: ArrayLike<number>;
  /** (T) sequence index per token (required for seq-mean-token-mean). */
  seqIds?: ArrayLike<number>;
  /** Sequences in the batch (seq-mean-*): default max(seqIds) + 1. */
  numSeqs?: number;
  /** (T) reference-policy log-probabilities (needed when klCoef != 0). */
  refLogprobs?: ArrayLike<number>;
}
export interface PolicyLossOptions {
  /** Gradient d loss / d logits: true = a new (T, V) Float32Array; 'logits' = written over the float32 logits; a Float32Array = that buffer; false = forward only (default). */
  grad?: boolean | 'logits' | Float32Array;
  threads?: number;
}
export interface PolicyLossOutput extends PolicyLossResult {
  /** (T) log p(target) under the current logits. */
  logprobs: Float32Array;
  /** (T) entropy (nats) per token (`entropy` is their masked mean). */
  tokenEntropy: Float32Array;
  /** (T, V) gradient, or null when not requested. */
  grad: Float32Array | null;
}

/** Validates and converts settings to the addon's numeric form. */
export function policyLossConfig(settings: Partial<PolicyLossKernelSettings> | undefined): RawPolicyLossConfig {
  const s = { ...DEFAULT_SETTINGS, ...checkOptions(settings, 'settings') };
  for (const key of Object.keys(s)) {
    if (!(key in DEFAULT_SETTINGS)) throw unknownName('policy-loss setting', key, Object.keys(DEFAULT_SETTINGS));
  }
  if (typeof s.klType !== 'string' || !(s.klType in KERNEL_KL_TYPES)) throw unknownName('KL type', String(s.klType), Object.keys(KERNEL_KL_TYPES));
  if (typeof s.aggregation !== 'string' || !(s.aggregation in KERNEL_AGGREGATIONS)) {
    throw unknownName('loss aggregation', String(s.aggregation), Object.keys(KERNEL_AGGREGATIONS));
  }
  const normConstant = checkNumber(s.normConstant, 'normConstant', 'a finite number >= 0', (x) => x >= 0);
  const denominator = checkNumber(s.denominator, 'denominator', 'a finite number >= 0 (0 = from the batch)', (x) => x >= 0);
  if (s.aggregation === 'seq-mean-token-sum-norm' && normConstant === 0 && denominator === 0) {
    throw invalidArgument('a number > 0 for seq-mean-token-sum-norm (e.g. the max response length)', 'normConstant', s.normConstant);
  }
  return {
    clipLow: checkNumber(s.clipLow, 'clipLow', 'a finite number >= 0', (x) => x >= 0),
    clipHigh: checkNumber(s.clipHigh, 'clipHigh', 'a finite number >= 0', (x) => x >= 0),
    dualClipC: checkNumber(s.dualClipC, 'dualClipC', 'a finite number (<= 1 disables the dual clip)'),
    klType: KERNEL_KL_TYPES[s.klType],
    klCoef: checkNumber(s.klCoef, 'klCoef', 'a finite number'),
    entropyCoef: checkNumber(s.entropyCoef, 'entropyCoef', 'a finite number'),
    aggregation: KERNEL_AGGREGATIONS[s.aggregation],
    temperature: checkNumber(s.temperature, 'temperature', 'a finite number > 0', (x) => x > 0),
    denominator,
    normConstant,
    gradScale: checkNumber(s.gradScale, 'gradScale', 'a finite number'),
  };
}

function lossArgs(logits: LogitsArray, T: number, V: number, batch: PolicyLossBatch, settings: Partial<PolicyLossKernelSettings> | undefined,
  options: PolicyLossOptions | undefined) {
  const dims = checkLogits(logits, T, V);
  if (batch === null || typeof batch !== 'object') throw invalidArgument('an object { targets, oldLogprobs, advantages, mask, ... }', 'batch', batch);
  const config = policyLossConfig(settings);
  const o = checkOptions(options, 'options');
  const n = dims.T;
  const targets = toInt32(batch.targets, 'targets', n, -INT32_MAX - 1, dims.V - 1);
  const oldLogprobs = toFloat32(batch.oldLogprobs, 'oldLogprobs', n, true);
  const advantages = toFloat32(batch.advantages, 'advantages', n);
  const mask = toFloat32(batch.mask, 'mask', n);
  for (let t = 0; t < n; t++) {
    if ((targets[t] as number) < 0 && mask[t] !== 0) throw invalidArgument(`a token id in [0, ${dims.V}) where mask is not 0`, `targets[${t}]`, targets[t]);
  }
  const seqIds = batch.seqIds === undefined ? null : toInt32(batch.seqIds, 'seqIds', n, 0, INT32_MAX);
  const aggregation = config.aggregation;
  if (aggregation === KERNEL_AGGREGATIONS['seq-mean-token-mean'] && !seqIds) {
    throw invalidArgument('an array of sequence ids (required for seq-mean-token-mean)', 'seqIds', batch.seqIds);
  }
  let maxSeq = -1;
  if (seqIds) for (let t = 0; t < n; t++) maxSeq = Math.max(maxSeq, seqIds[t] as number);
  let numSeqs = 1;
  if (batch.numSeqs !== undefined) numSeqs = checkInteger(batch.numSeqs, 'numSeqs', Math.max(1, maxSeq + 1));
  else if (seqIds) numSeqs = Math.max(1, maxSeq + 1);
  else if (aggregation === KERNEL_AGGREGATIONS['seq-mean-token-sum'] && config.denominator === 0) {
    throw invalidArgument('the number of sequences (seq-mean-token-sum needs numSeqs or seqIds)', 'numSeqs', batch.numSeqs);
  }
  const refLogprobs = batch.refLogprobs === undefined ? null : toFloat32(batch.refLogprobs, 'refLogprobs', n, true);
  if (config.klCoef !== 0 && !refLogprobs) throw invalidArgument('an array of reference log-probabilities (klCoef != 0)', 'refLogprobs', batch.refLogprobs);
  let grad: Float32Array | null = null;
  if (o.grad === true) grad = new Float32Array(n * dims.V);
  else if (o.grad === 'logits') {
    if (!(logits instanceof Float32Array)) throw invalidArgument("a caller Float32Array or true ('logits' needs float32 logits)", 'grad', o.grad);
    grad = logits;
  } else if (o.grad instanceof Float32Array) grad = checkFloat32Out(o.grad, 'grad', n * dims.V);
  else if (o.grad !== undefined && o.grad !== false) throw invalidArgument("true, false, 'logits' or a Float32Array", 'grad', o.grad);
  const logprobs = new Float32Array(n);
  const entropy = new Float32Array(n);
  const args = [logits, n, dims.V, targets, oldLogprobs, advantages, mask, seqIds, numSeqs, refLogprobs, config,
    checkThreads(o.threads), grad, logprobs, entropy] as const;
  return { args, grad, logprobs, entropy };
}

/**
 * Clipped-ratio policy loss (verl compute_policy_loss + agg_loss + kl_penalty
 * + entropy bonus), forward and optionally backward, fused over the logits.
 */
export function policyLoss(logits: LogitsArray, T: number, V: number, batch: PolicyLossBatch,
  settings?: Partial<PolicyLossKernelSettings>, options?: PolicyLossOptions): PolicyLossOutput {
  const { args, grad, logprobs, entropy } = lossArgs(logits, T, V, batch, settings, options);
  const r = callNative('policyLoss', () => loadNative().policyLoss(...args));
  return { ...r, logprobs, tokenEntropy: entropy, grad };
}

/** policyLoss off the JS thread. Do not touch the logits / grad buffers until the Promise settles. */
export async function policyLossAsync(logits: LogitsArray, T: number, V: number, batch: PolicyLossBatch,
  settings?: Partial<PolicyLossKernelSettings>, options?: PolicyLossOptions): Promise<PolicyLossOutput> {
  const { args, grad, logprobs, entropy } = lossArgs(logits, T, V, batch, settings, options);
  const r = await callNativeAsync('policyLossAsync', () => loadNative().policyLossAsync(...args));
  return { ...r, logprobs, tokenEntropy: entropy, grad };
}

// ---------------------------------------------------------------- tree reduce / expand
export interface TreeReduction {
  /** (N) Σ of leaf advantages under each node (soft attribution). */
  nodeSum: Float32Array;
  /** (N) their mean (hard attribution); 0 for nodes without leaves. */
  nodeMean: Float32Array;
  /** (N) number of leaves under each node. */
  nodeCount: Int32Array;
}

/** Parents in topological order (-1 or an earlier node) and leaf nodes, validated. */
function treeArrays(parent: ArrayLike<number>, leafNode: ArrayLike<number>): { par: Int32Array; leaves: Int32Array } {
  const N = parent?.length;
  const par = toInt32(parent, 'parent', typeof N === 'number' ? N : -1, -1, INT32_MAX);
  for (let n = 0; n < par.length; n++) {
    if ((par[n] as number) >= n) throw invalidArgument(`-1 or a node index below ${n}`, `parent[${n}]`, par[n]);
  }
  const L = leafNode?.length;
  return { par, leaves: toInt32(leafNode, 'leafNode', typeof L === 'number' ? L : -1, 0, par.length - 1) };
}

/** Per-node sum / mean / count of the advantages of the leaves beneath it (nodes in topological order). */
export function treeReduce(parent: ArrayLike<number>, leafNode: ArrayLike<number>, leafAdvantage: ArrayLike<number>): TreeReduction {
  const { par, leaves } = treeArrays(parent, leafNode);
  const adv = toFloat32(leafAdvantage, 'leafAdvantage', leaves.length);
  const out: TreeReduction = { nodeSum: new Float32Array(par.length), nodeMean: new Float32Array(par.length), nodeCount: new Int32Array(par.length) };
  callNative('treeReduce', () => loadNative().treeReduce(par, leaves, adv, out.nodeSum, out.nodeMean, out.nodeCount));
  return out;
}

export interface SignedTreeReduction {
  /** (N) Σ weight·adv over the leaves under each node with adv > 0, and with adv < 0. */
  posSum: Float64Array;
  negSum: Float64Array;
  /** (N) Σ weight over every leaf under the node. */
  weightSum: Float64Array;
  /** (N) leaves under the node with adv > 0, adv < 0, and all of them. */
  posCount: Int32Array;
  negCount: Int32Array;
  count: Int32Array;
}

/**
 * The weighted reduction split by the sign of the leaf advantage: per node,
 * the copy sums that tree-packed training gives each of its tokens
 * (arpo::kernels::tree_reduce_signed, float64).
 */
export function treeReduceSigned(
  parent: ArrayLike<number>, leafNode: ArrayLike<number>, leafAdvantage: ArrayLike<number>, leafWeight: ArrayLike<number>,
): SignedTreeReduction {
  const { par, leaves } = treeArrays(parent, leafNode);
  const adv = toFloat64(leafAdvantage, 'leafAdvantage', leaves.length);
  const weight = toFloat64(leafWeight, 'leafWeight', leaves.length);
  for (let l = 0; l < weight.length; l++) if (!((weight[l] as number) >= 0)) throw invalidArgument('a finite weight >= 0', `leafWeight[${l}]`, weight[l]);
  const n = par.length;
  const out: SignedTreeReduction = {
    posSum: new Float64Array(n), negSum: new Float64Array(n), weightSum: new Float64Array(n),
    posCount: new Int32Array(n), negCount: new Int32Array(n), count: new Int32Array(n),
  };
  callNative('treeReduceSigned', () =>
    loadNative().treeReduceSigned(par, leaves, adv, weight, out.posSum, out.negSum, out.weightSum, out.posCount, out.negCount, out.count));
  return out;
}

/** A finite-number array as a Float64Array of `length` (a fresh copy). */
function toFloat64(value: ArrayLike<number>, name: string, length: number): Float64Array {
  if (value === null || typeof value !== 'object' || typeof value.length !== 'number' || value.length !== length) {
    throw invalidArgument(`an array of ${length} numbers`, name, value);
  }
  const out = new Float64Array(length);
  for (let i = 0; i < length; i++) {
    const x = value[i];
    if (typeof x !== 'number' || !Number.isFinite(x)) throw invalidArgument('a finite number', `${name}[${i}]`, x);
    out[i] = x;
  }
  return out;
}

/** tokenValue[i] = nodeValue[n] for every token i of node n's span; other tokens are untouched. */
export function treeExpand(tokenValue: Float32Array, nodeValue: ArrayLike<number>, tokenOffset: ArrayLike<number>, tokenCount: ArrayLike<number>): void {
  if (!(tokenValue instanceof Float32Array)) throw invalidArgument('a Float32Array of per-token values', 'tokenValue', tokenValue);
  const N = nodeValue?.length;
  const values = toFloat32(nodeValue, 'nodeValue', typeof N === 'number' ? N : -1, true);
  const offset = toBigInt64(tokenOffset, 'tokenOffset', values.length, 0n);
  const count = toBigInt64(tokenCount, 'tokenCount', values.length, 0n);
  for (let n = 0; n < values.length; n++) {
    const off = Number(offset[n]);
    if (off > tokenValue.length) throw invalidArgument(`an offset in [0, ${tokenValue.length}]`, `tokenOffset[${n}]`, off);
    if (off + Number(count[n]) > tokenValue.length) {
      throw invalidArgument(`a count <= ${tokenValue.length - off} (the span must end inside the ${tokenValue.length} tokens)`, `tokenCount[${n}]`, Number(count[n]));
    }
  }
  callNative('treeExpand', () => loadNative().treeExpand(tokenValue, values, offset, count));
}

/** Sum of the values by a plain native loop (the bandwidth baseline of bench/stats.ts). */
export function benchSum(values: Float32Array, threads = 1): number {
  if (!(values instanceof Float32Array)) throw invalidArgument('a Float32Array', 'values', values);
  const th = checkThreads(threads);
  return callNative('benchSum', () => loadNative().benchSum(values, th));
}
