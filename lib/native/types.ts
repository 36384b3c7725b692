// The whole raw native surface, typed in one place. User-facing wrappers
// (lib/native/kernels.ts, lib/model/) validate arguments before calling these.

/** Logits (T, V) row-major: float32, or bfloat16 as raw uint16 bits. */
export type LogitsArray = Float32Array | Uint16Array;

/** Numeric policy-loss settings as the addon reads them (enums as integers). */
export interface RawPolicyLossConfig {
  clipLow: number;
  clipHigh: number;
  dualClipC: number;
  /** 0 k1, 1 k2, 2 k3 (low_var_kl), 3 abs */
  klType: number;
  klCoef: number;
  entropyCoef: number;
  /** 0 token-mean, 1 seq-mean-token-mean, 2 seq-mean-token-sum, 3 seq-mean-token-sum-norm */
  aggregation: number;
  temperature: number;
  denominator: number;
  normConstant: number;
  gradScale: number;
}

/** Aggregated loss and masked-mean metrics returned by policyLoss. */
export interface PolicyLossResult {
  /** Aggregated total loss, times gradScale. */
  loss: number;
  /** Aggregated policy-gradient part (not scaled). */
  pgLoss: number;
  pgClipfrac: number;
  pgClipfracLower: number;
  ppoKl: number;
  /** Masked mean entropy (nats). */
  entropy: number;
  /** Masked mean KL to the reference policy. */
  kl: number;
  /** sum(mask). */
  tokens: number;
}

// ---------------------------------------------------------------- kernels (native/napi/kernels.cc)
// Positional raw calls: outputs are caller-allocated typed arrays (null = not
// computed); lengths are re-checked in C++.
export interface NativeKernels {
  noop(): void;
  logitsStats(
    logits: LogitsArray, T: number, V: number, targets: Int32Array | null, temperature: number, threads: number,
    logsumexp: Float32Array | null, entropy: Float32Array | null, entropyNorm: Float32Array | null,
    targetLogprob: Float32Array | null,
  ): void;
  logitsStatsAsync(
    logits: LogitsArray, T: number, V: number, targets: Int32Array | null, temperature: number, threads: number,
    logsumexp: Float32Array | null, entropy: Float32Array | null, entropyNorm: Float32Array | null,
    targetLogprob: Float32Array | null,
  ): Promise<void>;
  sampleTokens(
    logits: LogitsArray, T: number, V: number, streams: BigUint64Array | null, positions: BigInt64Array | null,
    temperature: number, topK: number, topP: number, seed: bigint, threads: number,
    tokens: Int32Array, logprobs: Float32Array | null, entropy: Float32Array | null, entropyNorm: Float32Array | null,
  ): void;
  sampleTokensAsync(
    logits: LogitsArray, T: number, V: number, streams: BigUint64Array | null, positions: BigInt64Array | null,
    temperature: number, topK: number, topP: number, seed: bigint, threads: number,
    tokens: Int32Array, logprobs: Float32Array | null, entropy: Float32Array | null, entropyNorm: Float32Array | null,
  ): Promise<void>;
  entropyDelta(
    entropy: Float32Array, starts: BigInt64Array, ends: BigInt64Array, baseline: Int32Array | null, k: number,
    windowMean: Float32Array, windowCount: Int32Array | null, delta: Float32Array | null,
  ): void;
  policyLoss(
    logits: LogitsArray, T: number, V: number, targets: Int32Array, oldLogprobs: Float32Array, advantages: Float32Array,
    mask: Float32Array, seqIds: Int32Array | null, numSeqs: number, refLogprobs: Float32Array | null,
    config: RawPolicyLossConfig, threads: number, grad: Float32Array | null, logprobs: Float32Array | null,
    entropy: Float32Array | null,
  ): PolicyLossResult;
  policyLossAsync(
    logits: LogitsArray, T: number, V: number, targets: Int32Array, oldLogprobs: Float32Array, advantages: Float32Array,
    mask: Float32Array, seqIds: Int32Array | null, numSeqs: number, refLogprobs: Float32Array | null,
    config: RawPolicyLossConfig, threads: number, grad: Float32Array | null, logprobs: Float32Array | null,
    entropy: Float32Array | null,
  ): Promise<PolicyLossResult>;
  treeReduce(
    parent: Int32Array, leafNode: Int32Array, leafAdvantage: Float32Array,
    nodeSum: Float32Array | null, nodeMean: Float32Array | null, nodeCount: Int32Array | null,
  ): void;
  treeReduceSigned(
    parent: Int32Array, leafNode: Int32Array, leafAdvantage: Float64Array, leafWeight: Float64Array,
    posSum: Float64Array | null, negSum: Float64Array | null, weightSum: Float64Array | null,
    posCount: Int32Array | null, negCount: Int32Array | null, count: Int32Array | null,
  ): void;
  treeExpand(tokenValue: Float32Array, nodeValue: Float32Array, tokenOffset: BigInt64Array, tokenCount: BigInt64Array): void;
  /** Plain sum of the values (bandwidth baseline for bench/stats.ts). */
  benchSum(values: Float32Array, threads: number): number;
}

// ---------------------------------------------------------------- the addon
export interface NativeAddon extends NativeKernels, NativeModelAddon {
  readonly hasTorch: boolean;
  readonly hasCuda: boolean;
}

// ---------------------------------------------------------------- model (native/napi/torch)
// Owned by the model-core work (native/napi/torch/model.cc); wrapped by
// lib/model/policy-model.ts, which validates every argument first. Present on
// the addon only when it was built with libtorch (`hasTorch`).

/** The decoder architecture as the addon reads it (lib/model/checkpoint.ts ModelConfig fits it). */
export interface RawModelConfig {
  modelType: string;
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  numHiddenLayers: number;
  numAttentionHeads: number;
  numKeyValueHeads: number;
  headDim: number;
  maxPositionEmbeddings: number;
  ropeTheta: number;
  rmsNormEps: number;
  qkvBias: boolean;
  outputBias: boolean;
  mlpBias: boolean;
  tieWordEmbeddings: boolean;
  initializerRange: number;
  ropeScaling: { type: string; factor?: number; lowFreqFactor?: number; highFreqFactor?: number; originalMaxPositionEmbeddings?: number };
}
export interface RawModelOptions {
  /** Compute (and parameter) dtype. */
  dtype: 'float32' | 'bfloat16' | 'float64';
  /** cpu (default), cuda or cuda:N. */
  device?: string;
  /** libtorch intra-op threads and kernel threads; 0 = leave libtorch's default, kernels use every core. */
  threads: number;
  /** KV-cache block size in tokens, initial pool blocks, block limit (0 = grow without limit). */
  blockSize: number;
  initialBlocks: number;
  maxBlocks: number;
}
export interface RawDecodeResult {
  tokens: Int32Array;
  logprobs: Float32Array;
  entropies: Float32Array;
  normEntropies: Float32Array;
}
/** One micro-batch of packed sequences; per-token arrays aligned to tokens. */
export interface RawMicroBatch {
  tokens: Int32Array;
  lengths: Int32Array;
  mask: Float32Array;
  oldLogprobs?: Float32Array;
  advantages?: Float32Array;
  refLogprobs?: Float32Array;
}
/**
 * Per-token copy sums of the tree policy loss (float64), those of
 * arpo::kernels::policy_loss_copies before the aggregation's denominator:
 * S+ and S- (weighted advantages by sign), the weight Σw and the mask-weighted
 * copy counts by sign and in all; all 0 marks a context token.
 */
export interface TreeCopySums {
  advPos: Float64Array;
  advNeg: Float64Array;
  weight: Float64Array;
  countPos: Float64Array;
  countNeg: Float64Array;
  count: Float64Array;
}
/**
 * One micro-batch of packed rollout trees (native trainTreeStep): nodes in
 * topological order, each a run of `nodeTokens[k]` tokens of `tokens`;
 * per-token arrays aligned to tokens. The copy sums (float64) are those of
 * arpo::kernels::policy_loss_copies before the aggregation's denominator:
 * all 0 marks context. `sequences`: trajectories whose loss terms it carries.
 */
export interface RawTreeMicroBatch extends TreeCopySums {
  tokens: Int32Array;
  parent: Int32Array;
  nodeTokens: Int32Array;
  oldLogprobs: Float32Array;
  refLogprobs?: Float32Array;
  sequences: number;
}
export interface RawOptimConfig {
  lr: number;
  beta1: number;
  beta2: number;
  eps: number;
  /** Decoupled weight decay (AdamW), on every parameter. */
  weightDecay: number;
  /** Global L2 gradient-norm clip; 0 disables it. */
  maxGradNorm: number;
  warmupSteps: number;
  /** Steps of the linear / cosine decay horizon. */
  totalSteps: number;
  /** 0 constant, 1 linear, 2 cosine */
  schedule: number;
  /** Decay floor as a fraction of lr. */
  minLrRatio: number;
}
export interface RawTrainMetrics {
  loss: number;
  pgLoss: number;
  pgClipfrac: number;
  pgClipfracLower: number;
  ppoKl: number;
  entropy: number;
  kl: number;
  gradNorm: number;
  lr: number;
  tokens: number;
  /** Optimiser steps done (after this one). */
  step: number;
  /** True when the gradient norm was not finite and no update was applied. */
  skipped: boolean;
  /** Data parallel: wall time in collectives (denominators, metric sums, gradients), waiting for the slowest rank included. */
  commSeconds: number;
}
export interface RawCacheStats {
  blockSize: number;
  blocksTotal: number;
  blocksUsed: number;
  bytesPerBlock: number;
  bytesUsed: number;
  bytesUnshared: number;
  paths: number;
  tokens: number;
}
export interface RawModelInfo {
  dtype: string;
  device: string;
  numParameters: number;
  optimizerSteps: number;
  hasReference: boolean;
  threads: number;
  batchInvariant: boolean;
  fusedDecode: boolean;
}
export interface NativeModelInstance {
  initWeights(seed: bigint): Promise<void>;
  loadCheckpoint(dir: string): Promise<void>;
  saveWeights(file: string, dtype?: string): Promise<void>;
  saveOptimizer(file: string): Promise<void>;
  loadOptimizer(file: string): Promise<void>;
  newPath(stream: bigint): number;
  fork(path: number, prefixLength: number, stream: bigint): number;
  freePath(path: number): void;
  pathLength(path: number): number;
  extend(paths: Int32Array, tokens: Int32Array, lengths: Int32Array,
    sampling: { temperature: number; topK: number; topP: number; seed: bigint }): Promise<RawDecodeResult>;
  /** (P * V) float32 logits of each path's last position; appends like extend, samples nothing. */
  extendLogits(paths: Int32Array, tokens: Int32Array, lengths: Int32Array): Promise<Float32Array>;
  logprobs(tokens: Int32Array, lengths: Int32Array, temperature: number): Promise<{ logprobs: Float32Array; entropies: Float32Array }>;
  /** (N * V) float32 logits of every position (no cache). */
  forwardLogits(tokens: Int32Array, lengths: Int32Array): Promise<Float32Array>;
  trainStep(batches: RawMicroBatch[], loss: RawPolicyLossConfig, optim: RawOptimConfig, mode: 'policy' | 'sft'): Promise<RawTrainMetrics>;
  /** Per packed token (0 where no target or not wanted); `reference`: the frozen KL reference's. */
  treeLogprobs(tokens: Int32Array, parent: Int32Array, nodeTokens: Int32Array, temperature: number, wanted: Uint8Array | null, reference: boolean):
    Promise<{ logprobs: Float32Array; entropies: Float32Array }>;
  forwardTreeLogits(tokens: Int32Array, parent: Int32Array, nodeTokens: Int32Array): Promise<Float32Array>;
  /** chunkRows: LM-head rows per chunk (0: ~64 MiB of logits). */
  trainTreeStep(batches: RawTreeMicroBatch[], loss: RawPolicyLossConfig, optim: RawOptimConfig, chunkRows: number): Promise<RawTrainMetrics>;
  snapshotReference(): Promise<void>;
  /** The frozen reference from a checkpoint directory's weights. */
  loadReference(dir: string): Promise<void>;
  /** Data parallel: train steps sum over the group's ranks (null: one process). */
  setGroup(group: NativeGroupInstance | null): void;
  /** Every rank's weights (and frozen reference) become rank `root`'s. */
  broadcastParameters(root: number): Promise<void>;
  cacheStats(): RawCacheStats;
  setThreads(threads: number): void;
  setBatchInvariant(on: boolean): void;
  setFusedDecode(on: boolean): void;
  info(): RawModelInfo;
  dispose(): void;
}
export interface NativeModelConstructor {
  new (config: RawModelConfig, options: RawModelOptions): NativeModelInstance;
}
/** A c10d process group (native/napi/torch/dist.cc); wrapped by lib/train/dist.ts. */
export interface NativeGroupInstance {
  init(config: { rank: number; world: number; masterAddr: string; masterPort: number; timeoutMs: number }): Promise<void>;
  allreduceSum(values: Float64Array): Promise<Float64Array>;
  broadcast(values: Float64Array, root: number): Promise<Float64Array>;
  barrier(): Promise<void>;
  rank(): number;
  world(): number;
  close(): void;
}
/** The model part of the addon (absent in the kernels-only build). */
export interface NativeModelAddon {
  readonly NativeModel?: NativeModelConstructor;
  readonly NativeGroup?: new () => NativeGroupInstance;
  /** Built with c10d's Gloo backend (libgloo-dev): worlds of more than one rank work. */
  readonly hasGloo?: boolean;
  /** Built against a libtorch with CUDA (and the arpo CUDA kernels): models may live on cuda:N. */
  readonly cudaBuild?: boolean;
  /** The libtorch version the addon was built against ("1.13.0", "2.11.0"). */
  readonly torchVersion?: string;
}
