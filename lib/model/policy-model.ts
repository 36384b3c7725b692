// PolicyModel: the libtorch policy (Qwen2 / Qwen3 / Llama) behind one typed
// class: HF checkpoint load/save, the GenerationEngine (paged KV cache with
// forks), cache-free logprobs, and the training step (fused loss + AdamW).
import * as fs from 'fs';
import * as path from 'path';
import { ArpoError, invalidArgument } from '../errors';
import { loadNative } from '../native/loader';
import { policyLossConfig, type PolicyLossKernelSettings } from '../native/kernels';
import type { NativeGroupInstance, NativeModelAddon, NativeModelInstance, RawMicroBatch, RawModelConfig, RawOptimConfig, RawTrainMetrics, RawTreeMicroBatch } from '../native/types';
import { checkInteger, checkNumber, checkOptions, DEVICE_PATTERN, toSeed } from '../native/validate';
import { parseModelConfig, readModelConfig, writeCheckpointDir, type ModelConfig } from './checkpoint';
import type { DecodeResult, GenerationEngine, SamplingOptions } from './types';

export type ComputeDType = 'float32' | 'bfloat16' | 'float64';
const COMPUTE_DTYPES: readonly ComputeDType[] = ['float32', 'bfloat16', 'float64'];

export interface PolicyModelOptions {
  /** Compute and parameter dtype (float32 default; float64 for gradient checks). */
  dtype?: ComputeDType;
  /**
   * Where the weights, KV cache, activations and optimiser state live: cpu
   * (default), cuda or cuda:N. CUDA needs the addon built against a PyTorch
   * with CUDA (`cudaBuild` in the addon); otherwise the model refuses to start.
   */
  device?: string;
  /** libtorch intra-op threads and kernel threads (0 = all cores). */
  threads?: number;
  /** Random-init seed (create only). */
  seed?: number | bigint;
  /** KV cache: tokens per block (16), initial blocks (64), block limit (0 = grow without limit). */
  blockSize?: number;
  initialBlocks?: number;
  maxBlocks?: number;
  /** load only: also restore optimizer.safetensors when the directory has one (default true). */
  loadOptimizer?: boolean;
  /**
   * Batch-invariant decoding (default false): each path's logits, hence its
   * samples, are bitwise the same whichever paths share an engine call, so a
   * rollout's numbers do not depend on tool latencies (train.deterministic).
   */
  batchInvariant?: boolean;
  /**
   * The engine's decode-time CPU kernels for RMSNorm, RoPE and paged attention
   * (default true) instead of compositions of torch ops; the same numbers
   * within float rounding (native/test/torch/fused_inference_test.cc). false
   * is the plain path, for comparison (the bench's decode part runs both).
   */
  fusedDecode?: boolean;
}

export interface SaveOptions {
  /** Weight dtype on disk (default: the model's: float32, bfloat16, or float64 so that a float64 run resumes exactly). */
  dtype?: 'float32' | 'bfloat16' | 'float64';
  /** Also write optimizer.safetensors (AdamW moments + step) for exact resume (default true once trained). */
  optimizer?: boolean;
  /** Directory whose tokenizer files are copied along. */
  tokenizerDir?: string;
  /** Further files (e.g. trainer state). */
  extraFiles?: Record<string, string | Buffer>;
}

/** One training sequence; per-token arrays are aligned to `tokens` (entry t: token t given the tokens before it; entry 0 is ignored). */
export interface TrainSequence {
  tokens: Int32Array | readonly number[];
  /** 1 for tokens the policy produced (trained), 0 for prompt and tool-result tokens. */
  mask: ArrayLike<number>;
  /** Rollout-policy log-probabilities (policy mode). */
  oldLogprobs?: ArrayLike<number>;
  /** Advantage per token (policy mode). */
  advantages?: ArrayLike<number>;
  /** Reference-policy log-probabilities; when absent and klCoef != 0 the frozen reference computes them. */
  refLogprobs?: ArrayLike<number>;
}

/**
 * A forest of packed rollout trees: nodes in topological order (parent[k] is
 * -1 or an earlier node), node k owns the next nodeTokens[k] tokens; a token
 * sees its ancestors' tokens and the earlier ones of its node, at its
 * position along its root-to-leaf path (lib/train/tree-batch.ts builds them).
 */
export interface PackedForest {
  tokens: Int32Array | readonly number[];
  parent: Int32Array | readonly number[];
  nodeTokens: Int32Array | readonly number[];
}

/**
 * One micro-batch of packed trees for the policy loss; per-token arrays are
 * aligned to `tokens` (entry i: token i as predicted from the tokens before
 * it on its path). The copy sums are over the flattened copies i of each
 * token, before the aggregation's denominator: advPos = Σ_{A>0} w·A,
 * advNeg = Σ_{A<0} w·A, weight = Σ w, and the mask-weighted copy counts by
 * sign (w = mask, times 1/length for seq-mean-token-mean). All 0: context.
 */
export interface TrainTreeBatch extends PackedForest {
  oldLogprobs: ArrayLike<number>;
  /** When absent and klCoef != 0 the frozen reference computes them. */
  refLogprobs?: ArrayLike<number>;
  advPos: ArrayLike<number>;
  advNeg: ArrayLike<number>;
  weight: ArrayLike<number>;
  countPos: ArrayLike<number>;
  countNeg: ArrayLike<number>;
  count: ArrayLike<number>;
  /** Trajectories whose loss terms this micro-batch carries (seq-mean denominators). */
  sequences: number;
}

export interface TrainTreeStepOptions {
  loss?: Partial<PolicyLossKernelSettings>;
  optimizer?: Partial<OptimizerSettings>;
  /** LM-head rows per chunk of the fused head + loss (0: ~64 MiB of float32 logits). */
  chunkRows?: number;
}

export type Schedule = 'constant' | 'linear' | 'cosine';
const SCHEDULES: readonly Schedule[] = ['constant', 'linear', 'cosine'];

/** AdamW and schedule settings: the native step's fields (lib/native/types.ts RawOptimConfig), with the schedule by name. */
export interface OptimizerSettings extends Omit<RawOptimConfig, 'schedule'> {
  schedule: Schedule;
}
const DEFAULT_OPTIMIZER: OptimizerSettings = {
  lr: 1e-6, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0.01, maxGradNorm: 1, warmupSteps: 0, totalSteps: 0,
  schedule: 'constant', minLrRatio: 0,
};

export interface TrainStepOptions {
  /** policy: clipped-ratio loss (ARPO.md section 4); sft: token cross-entropy -sum(mask logp) / sum(mask). */
  mode?: 'policy' | 'sft';
  loss?: Partial<PolicyLossKernelSettings>;
  optimizer?: Partial<OptimizerSettings>;
}

/** Metrics of one optimiser step (verl's actor/* names in camelCase), as the native step returns them. */
export type TrainMetrics = RawTrainMetrics;

export interface SequenceScores {
  /** Per sequence, aligned to its tokens: log p(token t | tokens < t); entry 0 is 0. */
  logprobs: Float32Array[];
  /** Entropy (nats) of the distribution that predicted token t; entry 0 is 0. */
  entropies: Float32Array[];
}

export interface GenerateOptions {
  maxNewTokens: number;
  stopTokenIds?: readonly number[];
  sampling: SamplingOptions;
  /** Samples per prompt (forks of one prefilled prompt). */
  n?: number;
  /** Stream of sample j of prompt i: streamBase + i * n + j. */
  streamBase?: number | bigint;
}
export interface Generation {
  prompt: number;
  tokens: Int32Array;
  logprobs: Float32Array;
  entropies: Float32Array;
  normEntropies: Float32Array;
  finishReason: 'stop' | 'length';
}

export interface CacheStats {
  blockSize: number;
  blocksTotal: number;
  blocksUsed: number;
  bytesPerBlock: number;
  /** Bytes of K/V held by used blocks (shared blocks counted once). */
  bytesUsed: number;
  /** What the live paths would hold with private copies of their prefixes. */
  bytesUnshared: number;
  paths: number;
  tokens: number;
}

function toRawConfig(c: ModelConfig): RawModelConfig {
  const rs = c.ropeScaling;
  return {
    modelType: c.modelType, vocabSize: c.vocabSize, hiddenSize: c.hiddenSize, intermediateSize: c.intermediateSize,
    numHiddenLayers: c.numHiddenLayers, numAttentionHeads: c.numAttentionHeads, numKeyValueHeads: c.numKeyValueHeads,
    headDim: c.headDim, maxPositionEmbeddings: c.maxPositionEmbeddings, ropeTheta: c.ropeTheta, rmsNormEps: c.rmsNormEps,
    qkvBias: c.qkvBias, outputBias: c.outputBias, mlpBias: c.mlpBias, tieWordEmbeddings: c.tieWordEmbeddings,
    initializerRange: c.initializerRange,
    ropeScaling: rs.type === 'llama3'
      ? { type: 'llama3', factor: rs.factor, lowFreqFactor: rs.lowFreqFactor, highFreqFactor: rs.highFreqFactor, originalMaxPositionEmbeddings: rs.originalMaxPositionEmbeddings }
      : rs.type === 'linear' ? { type: 'linear', factor: rs.factor } : { type: 'none' },
  };
}

/**
 * Native errors become ArpoError('NATIVE_OP_FAILED', 'PolicyModel.<op>: <message>').
 * Read `message` structurally: errors made by the addon may come from another
 * realm (e.g. Jest's sandbox), where `instanceof Error` is false.
 */
function modelError(op: string, e: unknown, caller?: Error): ArpoError {
  if (e instanceof ArpoError) return e;
  const m = e !== null && typeof e === 'object' && typeof (e as { message?: unknown }).message === 'string' ? (e as { message: string }).message : String(e);
  const err = new ArpoError('NATIVE_OP_FAILED', `PolicyModel.${op}: ${m.replace(/^[a-z_]+: /, '')}`, { cause: e });
  // Async rejections carry no frame of the caller: reuse the stack captured before the call
  // (formatted only now: reading .stack on every call cost ~11 µs, more under source maps).
  const callerStack = caller?.stack;
  if (callerStack) err.stack = `${err.name}: ${err.message}\n${callerStack.split('\n').slice(1).join('\n')}`;
  return err;
}

function nativeModelClass(): NonNullable<NativeModelAddon['NativeModel']> {
  const addon = loadNative() as unknown as NativeModelAddon & { hasTorch: boolean };
  if (!addon.hasTorch || !addon.NativeModel) {
    throw new ArpoError('NATIVE_NOT_BUILT', 'PolicyModel needs the full addon built with libtorch (npm run build:native); the loaded addon is kernels-only');
  }
  return addon.NativeModel;
}

function checkOptionsKeys(o: object, name: string, known: readonly string[]): void {
  for (const key of Object.keys(o)) if (!known.includes(key)) throw invalidArgument(`one of the keys ${known.join(', ')}`, `${name}.${key}`, key);
}

/** Token ids in [0, vocab) as an Int32Array (a fresh copy). */
function tokenArray(value: unknown, name: string, vocab: number, allowEmpty = false): Int32Array {
  if (!(value instanceof Int32Array) && !Array.isArray(value)) throw invalidArgument('an Int32Array or array of token ids', name, value);
  const arr = value as ArrayLike<unknown>;
  if (arr.length === 0 && !allowEmpty) throw invalidArgument('a non-empty array of token ids', name, value);
  const out = new Int32Array(arr.length);
  for (let i = 0; i < arr.length; i++) {
    const t = arr[i];
    if (typeof t !== 'number' || !Number.isInteger(t) || t < 0 || t >= vocab) throw invalidArgument(`a token id in [0, ${vocab})`, `${name}[${i}]`, t);
    out[i] = t;
  }
  return out;
}

/** Finite numbers (>= 0, or <= 0 with sign -1) as a Float64Array of `length`. */
function doubleArray(value: unknown, name: string, length: number, sign: 1 | -1 | 0 = 0): Float64Array {
  if (value === null || typeof value !== 'object' || typeof (value as ArrayLike<unknown>).length !== 'number' || (value as ArrayLike<unknown>).length !== length) {
    throw invalidArgument(`an array of ${length} numbers`, name, value);
  }
  const arr = value as ArrayLike<unknown>;
  const out = new Float64Array(length);
  const what = sign === 1 ? 'a finite number >= 0' : sign === -1 ? 'a finite number <= 0' : 'a finite number';
  for (let i = 0; i < length; i++) {
    const x = arr[i];
    if (typeof x !== 'number' || !Number.isFinite(x) || x * sign < 0) throw invalidArgument(what, `${name}[${i}]`, x);
    out[i] = x;
  }
  return out;
}

function floatArray(value: unknown, name: string, length: number): Float32Array {
  if (value === null || typeof value !== 'object' || typeof (value as ArrayLike<unknown>).length !== 'number' || (value as ArrayLike<unknown>).length !== length) {
    throw invalidArgument(`an array of ${length} numbers`, name, value);
  }
  const arr = value as ArrayLike<unknown>;
  const out = new Float32Array(length);
  for (let i = 0; i < length; i++) {
    const x = arr[i];
    if (typeof x !== 'number' || Number.isNaN(x)) throw invalidArgument('a number', `${name}[${i}]`, x);
    out[i] = x;
  }
  return out;
}

export class PolicyModel implements GenerationEngine {
  readonly config: ModelConfig;
  readonly dtype: ComputeDType;
  private readonly rawConfig: Record<string, unknown>;
  private native: NativeModelInstance | undefined;
  private tail: Promise<unknown> = Promise.resolve();
  private distributed = false;
  private readonly livePaths = new Set<number>();

  private constructor(config: ModelConfig, rawConfig: Record<string, unknown>, native: NativeModelInstance, dtype: ComputeDType) {
    this.config = config;
    this.rawConfig = rawConfig;
    this.native = native;
    this.dtype = dtype;
  }

  get vocabSize(): number {
    return this.config.vocabSize;
  }

  private static construct(rawConfig: Record<string, unknown>, source: string, options: PolicyModelOptions | undefined): PolicyModel {
    const o = checkOptions(options, 'options');
    checkOptionsKeys(o, 'options', ['dtype', 'device', 'threads', 'seed', 'blockSize', 'initialBlocks', 'maxBlocks', 'loadOptimizer', 'batchInvariant', 'fusedDecode']);
    if (o.device !== undefined && (typeof o.device !== 'string' || !DEVICE_PATTERN.test(o.device))) throw invalidArgument('cpu, cuda or cuda:N', 'options.device', o.device);
    if (o.batchInvariant !== undefined && typeof o.batchInvariant !== 'boolean') throw invalidArgument('a boolean', 'options.batchInvariant', o.batchInvariant);
    if (o.fusedDecode !== undefined && typeof o.fusedDecode !== 'boolean') throw invalidArgument('a boolean', 'options.fusedDecode', o.fusedDecode);
    const config = parseModelConfig(rawConfig, source);
    const dtype = o.dtype ?? 'float32';
    if (!COMPUTE_DTYPES.includes(dtype)) throw invalidArgument(`one of ${COMPUTE_DTYPES.join(', ')}`, 'options.dtype', dtype);
    const nativeOptions = {
      dtype,
      device: o.device ?? 'cpu',
      threads: o.threads === undefined ? 0 : checkInteger(o.threads, 'options.threads', 0, 1024),
      blockSize: o.blockSize === undefined ? 16 : checkInteger(o.blockSize, 'options.blockSize', 1, 65536),
      initialBlocks: o.initialBlocks === undefined ? 64 : checkInteger(o.initialBlocks, 'options.initialBlocks', 1),
      maxBlocks: o.maxBlocks === undefined ? 0 : checkInteger(o.maxBlocks, 'options.maxBlocks', 0),
    };
    const Native = nativeModelClass();
    let native: NativeModelInstance;
    try {
      native = new Native(toRawConfig(config), nativeOptions);
    } catch (e) {
      throw modelError('create', e);
    }
    if (o.batchInvariant) native.setBatchInvariant(true);
    if (o.fusedDecode === false) native.setFusedDecode(false);
    return new PolicyModel(config, { ...rawConfig }, native, dtype);
  }

  /** A randomly initialised model (normal(0, initializer_range), norms 1, biases 0) from a HF config.json object. */
  static async create(rawConfig: Record<string, unknown>, options?: PolicyModelOptions): Promise<PolicyModel> {
    const model = PolicyModel.construct(rawConfig, 'config', options);
    const seed = toSeed(options?.seed, 'options.seed');
    await model.enqueue('create', (n) => n.initWeights(seed));
    return model;
  }

  /** Loads a HF checkpoint directory (config.json + model.safetensors or shards; optimizer.safetensors when present). */
  static async load(dir: string, options?: PolicyModelOptions): Promise<PolicyModel> {
    if (typeof dir !== 'string' || dir === '') throw invalidArgument('a checkpoint directory path', 'dir', dir);
    const { raw } = readModelConfig(dir);
    const model = PolicyModel.construct({ ...raw }, path.join(dir, 'config.json'), options);
    try {
      await model.enqueue('load', (n) => n.loadCheckpoint(dir));
      const opt = path.join(dir, 'optimizer.safetensors');
      if (options?.loadOptimizer !== false && fs.existsSync(opt)) await model.enqueue('load', (n) => n.loadOptimizer(opt));
    } catch (e) {
      model.dispose();
      throw e;
    }
    return model;
  }

  /** Writes an HF checkpoint directory atomically: config.json, model.safetensors (+ optimizer.safetensors). */
  async save(dir: string, options?: SaveOptions): Promise<void> {
    if (typeof dir !== 'string' || dir === '') throw invalidArgument('a checkpoint directory path', 'dir', dir);
    const o = checkOptions(options, 'options');
    checkOptionsKeys(o, 'options', ['dtype', 'optimizer', 'tokenizerDir', 'extraFiles']);
    const dtype = o.dtype ?? this.dtype;
    if (dtype !== 'float32' && dtype !== 'bfloat16' && dtype !== 'float64') throw invalidArgument('float32, bfloat16 or float64', 'options.dtype', dtype);
    const withOptimizer = o.optimizer ?? this.info().optimizerSteps > 0;
    await this.enqueue('save', async (n) => {
      await writeCheckpointDir(dir, {
        config: { ...this.rawConfig, torch_dtype: dtype },
        tokenizerDir: o.tokenizerDir,
        extraFiles: o.extraFiles,
        writeWeights: async (staging) => {
          await n.saveWeights(path.join(staging, 'model.safetensors'), dtype);
          if (withOptimizer) await n.saveOptimizer(path.join(staging, 'optimizer.safetensors'));
        },
      });
    });
  }

  // ---------------------------------------------------------------- generation engine

  newPath(stream: bigint | number): number {
    const s = toSeed(stream, 'stream');
    const id = this.sync('newPath', (n) => n.newPath(s));
    this.livePaths.add(id);
    return id;
  }

  fork(pathId: number, prefixLength: number, stream: bigint | number): number {
    this.checkPath(pathId, 'path');
    checkInteger(prefixLength, 'prefixLength', 0);
    const s = toSeed(stream, 'stream');
    const id = this.sync('fork', (n) => n.fork(pathId, prefixLength, s));
    this.livePaths.add(id);
    return id;
  }

  freePath(pathId: number): void {
    this.checkPath(pathId, 'path');
    this.sync('freePath', (n) => n.freePath(pathId));
    this.livePaths.delete(pathId);
  }

  pathLength(pathId: number): number {
    this.checkPath(pathId, 'path');
    return this.sync('pathLength', (n) => n.pathLength(pathId));
  }

  async extend(paths: readonly number[], inputs: readonly Int32Array[], sampling: SamplingOptions): Promise<DecodeResult> {
    const packed = this.packExtend(paths, inputs);
    const s = checkOptions(sampling, 'sampling');
    const raw = {
      temperature: checkNumber(s.temperature, 'sampling.temperature', 'a finite number >= 0 (0 = greedy)', (x) => x >= 0),
      topK: s.topK === undefined ? 0 : checkInteger(s.topK, 'sampling.topK', 0),
      topP: s.topP === undefined ? 1 : checkNumber(s.topP, 'sampling.topP', 'a number in (0, 1]', (x) => x > 0 && x <= 1),
      seed: toSeed(s.seed, 'sampling.seed'),
    };
    return this.enqueue('extend', (n) => n.extend(packed.paths, packed.tokens, packed.lengths, raw));
  }

  /** Like extend, but returns each path's last-position logits (P rows of V, float32) instead of sampling. */
  async extendLogits(paths: readonly number[], inputs: readonly Int32Array[]): Promise<Float32Array> {
    const packed = this.packExtend(paths, inputs);
    return this.enqueue('extendLogits', (n) => n.extendLogits(packed.paths, packed.tokens, packed.lengths));
  }

  /** Samples up to maxNewTokens continuations (n per prompt: one prefill, then forks). */
  async generate(prompts: ReadonlyArray<Int32Array | readonly number[]>, options: GenerateOptions): Promise<Generation[]> {
    if (!Array.isArray(prompts) || prompts.length === 0) throw invalidArgument('a non-empty array of prompts', 'prompts', prompts);
    const o = checkOptions(options, 'options');
    const maxNew = checkInteger(o.maxNewTokens, 'options.maxNewTokens', 1);
    const n = o.n === undefined ? 1 : checkInteger(o.n, 'options.n', 1);
    const stops = new Set((o.stopTokenIds ?? []).map((t, i) => checkInteger(t, `options.stopTokenIds[${i}]`, 0, this.vocabSize - 1)));
    const base = toSeed(o.streamBase, 'options.streamBase');
    const sampling = o.sampling;
    if (sampling === null || typeof sampling !== 'object') throw invalidArgument('sampling options { temperature, seed, ... }', 'options.sampling', sampling);
    const promptIds = prompts.map((p, i) => tokenArray(p, `prompts[${i}]`, this.vocabSize));
    const owned: number[] = [];
    try {
      // Prefill all but the last prompt token once per prompt, then fork n paths
      // that each start from the last prompt token (so each samples its own first token).
      const seqs: Array<{ prompt: number; path: number; input: Int32Array; out: number[]; lp: number[]; ent: number[]; ne: number[]; done: boolean; reason: 'stop' | 'length' }> = [];
      const prefill: number[] = [];
      const prefillInputs: Int32Array[] = [];
      promptIds.forEach((ids, i) => {
        const root = this.newPath(base + BigInt(i * n));
        owned.push(root);
        if (ids.length > 1) {
          prefill.push(root);
          prefillInputs.push(ids.subarray(0, ids.length - 1));
        }
      });
      if (prefill.length > 0) await this.extend(prefill, prefillInputs, sampling);
      promptIds.forEach((ids, i) => {
        const root = owned[i] as number;
        for (let j = 0; j < n; j++) {
          const p = j === 0 ? root : this.fork(root, ids.length - 1, base + BigInt(i * n + j));
          if (j > 0) owned.push(p);
          seqs.push({ prompt: i, path: p, input: ids.subarray(ids.length - 1), out: [], lp: [], ent: [], ne: [], done: false, reason: 'length' });
        }
      });
      for (let step = 0; step < maxNew; step++) {
        const active = seqs.filter((s) => !s.done);
        if (active.length === 0) break;
        const r = await this.extend(active.map((s) => s.path), active.map((s) => s.input), sampling);
        active.forEach((s, k) => {
          const tok = r.tokens[k] as number;
          s.out.push(tok);
          s.lp.push(r.logprobs[k] as number);
          s.ent.push(r.entropies[k] as number);
          s.ne.push(r.normEntropies[k] as number);
          s.input = Int32Array.of(tok);
          if (stops.has(tok)) {
            s.done = true;
            s.reason = 'stop';
          } else if (s.out.length >= maxNew) s.done = true;
        });
      }
      return seqs.map((s) => ({
        prompt: s.prompt, tokens: Int32Array.from(s.out), logprobs: Float32Array.from(s.lp), entropies: Float32Array.from(s.ent),
        normEntropies: Float32Array.from(s.ne), finishReason: s.reason,
      }));
    } finally {
      if (this.native) for (const p of owned) if (this.livePaths.has(p)) this.freePath(p);
    }
  }

  // ---------------------------------------------------------------- scoring and training

  /** Per-token logprob and entropy of whole sequences under softmax(logits / temperature), no cache. */
  async logprobs(sequences: ReadonlyArray<Int32Array | readonly number[]>, options?: { temperature?: number }): Promise<SequenceScores> {
    const { tokens, lengths } = this.packSequences(sequences, 'sequences');
    const o = checkOptions(options, 'options');
    const temperature = o.temperature === undefined ? 1 : checkNumber(o.temperature, 'options.temperature', 'a finite number > 0', (x) => x > 0);
    const r = await this.enqueue('logprobs', (n) => n.logprobs(tokens, lengths, temperature));
    return { logprobs: split(r.logprobs, lengths), entropies: split(r.entropies, lengths) };
  }

  /** Logits of every position of each sequence (rows of V, float32), for checks against references. */
  async forwardLogits(sequences: ReadonlyArray<Int32Array | readonly number[]>): Promise<Float32Array> {
    const { tokens, lengths } = this.packSequences(sequences, 'sequences');
    return this.enqueue('forwardLogits', (n) => n.forwardLogits(tokens, lengths));
  }

  /**
   * One optimiser step over micro-batches (gradient accumulation: the loss
   * denominator is the whole batch's, so the micro-batches add up to it).
   */
  async trainStep(microBatches: ReadonlyArray<readonly TrainSequence[]>, options?: TrainStepOptions): Promise<TrainMetrics> {
    if (!Array.isArray(microBatches) || (microBatches.length === 0 && !this.distributed)) throw invalidArgument('a non-empty array of micro-batches', 'microBatches', microBatches);
    const o = checkOptions(options, 'options');
    checkOptionsKeys(o, 'options', ['mode', 'loss', 'optimizer']);
    const mode = o.mode ?? 'policy';
    if (mode !== 'policy' && mode !== 'sft') throw invalidArgument('"policy" or "sft"', 'options.mode', mode);
    const loss = policyLossConfig(o.loss);
    const optim = optimizerConfig(o.optimizer);
    const batches = microBatches.map((mb, b) => this.packMicroBatch(mb, `microBatches[${b}]`, mode));
    return this.enqueue('trainStep', (n) => n.trainStep(batches, loss, optim, mode));
  }

  /**
   * Per-token logprob and entropy of a packed forest under softmax(logits /
   * temperature), every shared token computed once (0 where a token is no
   * target, i.e. a root's first token, or where `wanted` is 0). `reference`:
   * the frozen KL reference's log-probs instead of the policy's.
   */
  async treeLogprobs(forest: PackedForest, options?: { temperature?: number; wanted?: Uint8Array; reference?: boolean }): Promise<{ logprobs: Float32Array; entropies: Float32Array }> {
    const f = this.packForest(forest, 'forest');
    const o = checkOptions(options, 'options');
    checkOptionsKeys(o, 'options', ['temperature', 'wanted', 'reference']);
    const temperature = o.temperature === undefined ? 1 : checkNumber(o.temperature, 'options.temperature', 'a finite number > 0', (x) => x > 0);
    if (o.wanted !== undefined && (!(o.wanted instanceof Uint8Array) || o.wanted.length !== f.tokens.length)) {
      throw invalidArgument(`a Uint8Array of ${f.tokens.length} flags`, 'options.wanted', o.wanted);
    }
    if (o.reference !== undefined && typeof o.reference !== 'boolean') throw invalidArgument('a boolean', 'options.reference', o.reference);
    const wanted = o.wanted ?? null;
    return this.enqueue('treeLogprobs', (n) => n.treeLogprobs(f.tokens, f.parent, f.nodeTokens, temperature, wanted, o.reference === true));
  }

  /** Logits of every packed token of a forest (rows of V, float32), for checks against the flattened trajectories. */
  async forwardTreeLogits(forest: PackedForest): Promise<Float32Array> {
    const f = this.packForest(forest, 'forest');
    return this.enqueue('forwardTreeLogits', (n) => n.forwardTreeLogits(f.tokens, f.parent, f.nodeTokens));
  }

  /**
   * One optimiser step over micro-batches of packed trees: the policy loss of
   * the flattened trajectories, every shared token computed once, through a
   * chunked LM head (no (tokens, V) logits buffer). Denominators are the
   * whole step's (token-mean: Σ count; seq-mean-*: Σ sequences).
   */
  async trainTreeStep(batches: readonly TrainTreeBatch[], options?: TrainTreeStepOptions): Promise<TrainMetrics> {
    if (!Array.isArray(batches) || (batches.length === 0 && !this.distributed)) throw invalidArgument('a non-empty array of tree micro-batches', 'batches', batches);
    const o = checkOptions(options, 'options');
    checkOptionsKeys(o, 'options', ['loss', 'optimizer', 'chunkRows']);
    const loss = policyLossConfig(o.loss);
    const optim = optimizerConfig(o.optimizer);
    const chunkRows = o.chunkRows === undefined ? 0 : checkInteger(o.chunkRows, 'options.chunkRows', 0, 2 ** 31 - 1);
    const raw = batches.map((b, i) => this.packTreeBatch(b, `batches[${i}]`));
    return this.enqueue('trainTreeStep', (n) => n.trainTreeStep(raw, loss, optim, chunkRows));
  }

  /** The frozen KL reference becomes a copy of the current weights (made automatically at the first KL step otherwise). */
  async snapshotReference(): Promise<void> {
    await this.enqueue('snapshotReference', (n) => n.snapshotReference());
  }

  /** The frozen KL reference becomes the weights of an HF checkpoint directory (a resumed run's initial policy). */
  async loadReference(dir: string): Promise<void> {
    if (typeof dir !== 'string' || dir === '') throw invalidArgument('a checkpoint directory path', 'dir', dir);
    await this.enqueue('loadReference', (n) => n.loadReference(dir));
  }

  /**
   * Data parallel (lib/train/dist.ts): with a group of more than one rank,
   * trainStep / trainTreeStep take this rank's share of the step (possibly no
   * micro-batch at all) and every rank must call them the same number of
   * times; denominators, metrics and gradients are the global batch's.
   * null: one process again.
   */
  setProcessGroup(group: { readonly world: number; readonly native: NativeGroupInstance } | null): void {
    this.sync('setProcessGroup', (n) => n.setGroup(group ? group.native : null));
    this.distributed = group !== null && group.world > 1;
  }

  /** Every rank's weights become rank `root`'s (after setProcessGroup). */
  async broadcastParameters(root = 0): Promise<void> {
    await this.enqueue('broadcastParameters', (n) => n.broadcastParameters(root));
  }

  cacheStats(): CacheStats {
    return this.sync('cacheStats', (n) => n.cacheStats());
  }

  /** libtorch intra-op threads (process-wide) and kernel threads; 0 = all cores for the kernels. */
  setThreads(threads: number): void {
    checkInteger(threads, 'threads', 0, 1024);
    this.sync('setThreads', (n) => n.setThreads(threads));
  }

  info(): { dtype: string; device: string; numParameters: number; optimizerSteps: number; hasReference: boolean; threads: number; batchInvariant: boolean; fusedDecode: boolean } {
    return this.sync('info', (n) => n.info());
  }

  /** Frees the weights, cache and optimiser (waits for a running call); later calls throw DISPOSED. */
  dispose(): void {
    const n = this.native;
    this.native = undefined;
    this.livePaths.clear();
    n?.dispose();
  }

  get disposed(): boolean {
    return this.native === undefined;
  }

  // ---------------------------------------------------------------- internals

  private live(op: string): NativeModelInstance {
    if (!this.native) throw new ArpoError('DISPOSED', `PolicyModel.${op}: the model was disposed`);
    return this.native;
  }

  private sync<R>(op: string, fn: (n: NativeModelInstance) => R): R {
    const n = this.live(op);
    try {
      return fn(n);
    } catch (e) {
      throw modelError(op, e);
    }
  }

  /** Serialises async calls on this model: each starts after the previous settles. */
  private enqueue<R>(op: string, fn: (n: NativeModelInstance) => Promise<R>): Promise<R> {
    this.live(op);
    const caller = new Error();
    const run = this.tail.then(async () => {
      try {
        return await fn(this.live(op));
      } catch (e) {
        throw modelError(op, e, caller);
      }
    });
    this.tail = run.catch(() => undefined);
    return run;
  }

  private checkPath(p: unknown, name: string): void {
    this.live('path');
    if (typeof p !== 'number' || !this.livePaths.has(p)) throw invalidArgument('a live path id (from newPath or fork)', name, p);
  }

  private packExtend(paths: readonly number[], inputs: readonly Int32Array[]): { paths: Int32Array; tokens: Int32Array; lengths: Int32Array } {
    this.live('extend');
    if (!Array.isArray(paths) || paths.length === 0) throw invalidArgument('a non-empty array of path ids', 'paths', paths);
    if (!Array.isArray(inputs) || inputs.length !== paths.length) throw invalidArgument(`an array of ${paths.length} token arrays`, 'inputs', inputs);
    const seen = new Set<number>();
    const parts: Int32Array[] = [];
    paths.forEach((p, i) => {
      this.checkPath(p, `paths[${i}]`);
      if (seen.has(p)) throw invalidArgument('distinct path ids', `paths[${i}]`, p);
      seen.add(p);
      parts.push(tokenArray(inputs[i], `inputs[${i}]`, this.vocabSize));
    });
    return { paths: Int32Array.from(paths), ...concat(parts) };
  }

  private packSequences(sequences: ReadonlyArray<Int32Array | readonly number[]>, name: string): { tokens: Int32Array; lengths: Int32Array } {
    this.live(name);
    if (!Array.isArray(sequences) || sequences.length === 0) throw invalidArgument('a non-empty array of token sequences', name, sequences);
    const parts = sequences.map((s, i) => tokenArray(s, `${name}[${i}]`, this.vocabSize));
    parts.forEach((p, i) => {
      if (p.length > this.config.maxPositionEmbeddings) throw invalidArgument(`at most ${this.config.maxPositionEmbeddings} tokens`, `${name}[${i}]`, sequences[i]);
    });
    return concat(parts);
  }

  private packForest(forest: PackedForest, name: string): { tokens: Int32Array; parent: Int32Array; nodeTokens: Int32Array } {
    this.live(name);
    if (forest === null || typeof forest !== 'object') throw invalidArgument('a packed forest { tokens, parent, nodeTokens }', name, forest);
    const tokens = tokenArray(forest.tokens, `${name}.tokens`, this.vocabSize);
    const K = (forest.parent as ArrayLike<number> | undefined)?.length;
    if (typeof K !== 'number' || K < 1) throw invalidArgument('a non-empty array of parent node indices', `${name}.parent`, forest.parent);
    const parent = new Int32Array(K);
    const nodeTokens = new Int32Array(K);
    const nt = forest.nodeTokens as ArrayLike<number> | undefined;
    if (nt?.length !== K) throw invalidArgument(`an array of ${K} token counts (one per node)`, `${name}.nodeTokens`, forest.nodeTokens);
    let total = 0;
    for (let k = 0; k < K; k++) {
      const p = forest.parent[k];
      if (typeof p !== 'number' || !Number.isInteger(p) || p < -1 || p >= k) throw invalidArgument(`-1 (a root) or an earlier node in [0, ${k})`, `${name}.parent[${k}]`, p);
      const n = nt[k];
      if (typeof n !== 'number' || !Number.isInteger(n) || n < (p < 0 ? 1 : 0)) throw invalidArgument(p < 0 ? 'an integer >= 1 (a root starts its sequence)' : 'an integer >= 0', `${name}.nodeTokens[${k}]`, n);
      parent[k] = p;
      nodeTokens[k] = n;
      total += n;
    }
    if (total !== tokens.length) throw invalidArgument(`node token counts that sum to the ${tokens.length} tokens`, `${name}.nodeTokens`, total);
    return { tokens, parent, nodeTokens };
  }

  private packTreeBatch(b: TrainTreeBatch, name: string): RawTreeMicroBatch {
    if (b === null || typeof b !== 'object') throw invalidArgument('a tree micro-batch { tokens, parent, nodeTokens, oldLogprobs, advPos, ... }', name, b);
    const f = this.packForest(b, name);
    const N = f.tokens.length;
    const out: RawTreeMicroBatch = {
      ...f,
      oldLogprobs: floatArray(b.oldLogprobs, `${name}.oldLogprobs`, N),
      advPos: doubleArray(b.advPos, `${name}.advPos`, N, 1),
      advNeg: doubleArray(b.advNeg, `${name}.advNeg`, N, -1),
      weight: doubleArray(b.weight, `${name}.weight`, N, 1),
      countPos: doubleArray(b.countPos, `${name}.countPos`, N, 1),
      countNeg: doubleArray(b.countNeg, `${name}.countNeg`, N, 1),
      count: doubleArray(b.count, `${name}.count`, N, 1),
      sequences: checkInteger(b.sequences, `${name}.sequences`, 0, 2 ** 31 - 1),
    };
    if (b.refLogprobs !== undefined) out.refLogprobs = floatArray(b.refLogprobs, `${name}.refLogprobs`, N);
    return out;
  }

  private packMicroBatch(mb: readonly TrainSequence[], name: string, mode: 'policy' | 'sft'): RawMicroBatch {
    if (!Array.isArray(mb) || mb.length === 0) throw invalidArgument('a non-empty array of training sequences', name, mb);
    const toks: Int32Array[] = [];
    const masks: Float32Array[] = [];
    const olds: Float32Array[] = [];
    const advs: Float32Array[] = [];
    const refs: Float32Array[] = [];
    let withRef = 0;
    mb.forEach((s, i) => {
      const at = `${name}[${i}]`;
      if (s === null || typeof s !== 'object') throw invalidArgument('a training sequence { tokens, mask, ... }', at, s);
      const t = tokenArray(s.tokens, `${at}.tokens`, this.vocabSize);
      if (t.length > this.config.maxPositionEmbeddings) throw invalidArgument(`at most ${this.config.maxPositionEmbeddings} tokens`, `${at}.tokens`, s.tokens);
      toks.push(t);
      masks.push(floatArray(s.mask, `${at}.mask`, t.length));
      if (mode === 'policy') {
        olds.push(floatArray(s.oldLogprobs, `${at}.oldLogprobs`, t.length));
        advs.push(floatArray(s.advantages, `${at}.advantages`, t.length));
      }
      if (s.refLogprobs !== undefined) {
        refs.push(floatArray(s.refLogprobs, `${at}.refLogprobs`, t.length));
        withRef++;
      }
    });
    if (withRef !== 0 && withRef !== mb.length) throw invalidArgument('refLogprobs on every sequence of a micro-batch or on none', `${name}.refLogprobs`, withRef);
    // Without refLogprobs (and klCoef != 0) the native side scores with the frozen reference copy.
    const { tokens, lengths } = concat(toks);
    const out: RawMicroBatch = { tokens, lengths, mask: concatF(masks) };
    if (mode === 'policy') {
      out.oldLogprobs = concatF(olds);
      out.advantages = concatF(advs);
    }
    if (withRef > 0) out.refLogprobs = concatF(refs);
    return out;
  }
}

function concat(parts: readonly Int32Array[]): { tokens: Int32Array; lengths: Int32Array } {
  const lengths = Int32Array.from(parts.map((p) => p.length));
  const tokens = new Int32Array(lengths.reduce((a, b) => a + b, 0));
  let at = 0;
  for (const p of parts) {
    tokens.set(p, at);
    at += p.length;
  }
  return { tokens, lengths };
}

function concatF(parts: readonly Float32Array[]): Float32Array {
  const out = new Float32Array(parts.reduce((a, p) => a + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

function split(values: Float32Array, lengths: Int32Array): Float32Array[] {
  const out: Float32Array[] = [];
  let at = 0;
  for (const n of lengths) {
    out.push(values.slice(at, at + n));
    at += n;
  }
  return out;
}

/** Validates optimiser settings and converts them to the addon's numeric form. */
export function optimizerConfig(settings: Partial<OptimizerSettings> | undefined): RawOptimConfig {
  const s = { ...DEFAULT_OPTIMIZER, ...checkOptions(settings, 'optimizer') };
  checkOptionsKeys(s, 'optimizer', Object.keys(DEFAULT_OPTIMIZER));
  if (!SCHEDULES.includes(s.schedule)) throw invalidArgument(`one of ${SCHEDULES.join(', ')}`, 'optimizer.schedule', s.schedule);
  const unit = (x: number): boolean => x >= 0 && x < 1;
  return {
    lr: checkNumber(s.lr, 'optimizer.lr', 'a finite number >= 0', (x) => x >= 0),
    beta1: checkNumber(s.beta1, 'optimizer.beta1', 'a number in [0, 1)', unit),
    beta2: checkNumber(s.beta2, 'optimizer.beta2', 'a number in [0, 1)', unit),
    eps: checkNumber(s.eps, 'optimizer.eps', 'a finite number > 0', (x) => x > 0),
    weightDecay: checkNumber(s.weightDecay, 'optimizer.weightDecay', 'a finite number >= 0', (x) => x >= 0),
    maxGradNorm: checkNumber(s.maxGradNorm, 'optimizer.maxGradNorm', 'a finite number >= 0 (0 = no clipping)', (x) => x >= 0),
    warmupSteps: checkInteger(s.warmupSteps, 'optimizer.warmupSteps', 0),
    totalSteps: checkInteger(s.totalSteps, 'optimizer.totalSteps', 0),
    schedule: SCHEDULES.indexOf(s.schedule),
    minLrRatio: checkNumber(s.minLrRatio, 'optimizer.minLrRatio', 'a number in [0, 1]', (x) => x >= 0 && x <= 1),
  };
}
