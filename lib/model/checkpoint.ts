// Hugging Face checkpoint directories: config.json validation into a typed,
// frozen ModelConfig (qwen2 | qwen3 | llama), atomic directory writes, and the
// tiny standard configs used by tests and the demo.
import * as fs from 'fs';
import * as path from 'path';
import { ArpoError, describeType, describeValue } from '../errors';

export const MODEL_TYPES = ['qwen2', 'qwen3', 'llama'] as const;
export type ModelType = (typeof MODEL_TYPES)[number];
export const TORCH_DTYPES = ['float32', 'bfloat16', 'float16', 'float64'] as const;
export type TorchDType = (typeof TORCH_DTYPES)[number];

/** RoPE frequency scaling (HF `rope_scaling`): none, linear (positions / factor) or llama3 (frequency-dependent). */
export type RopeScaling =
  | { readonly type: 'none' }
  | { readonly type: 'linear'; readonly factor: number }
  | {
      readonly type: 'llama3';
      readonly factor: number;
      readonly lowFreqFactor: number;
      readonly highFreqFactor: number;
      readonly originalMaxPositionEmbeddings: number;
    };

/** The validated architecture of a checkpoint; every field documented by its HF name. */
export interface ModelConfig {
  readonly modelType: ModelType;
  readonly vocabSize: number; // vocab_size
  readonly hiddenSize: number; // hidden_size (H)
  readonly intermediateSize: number; // intermediate_size (I, SwiGLU width)
  readonly numHiddenLayers: number; // num_hidden_layers
  readonly numAttentionHeads: number; // num_attention_heads
  readonly numKeyValueHeads: number; // num_key_value_heads (GQA; divides the heads)
  readonly headDim: number; // head_dim (default hidden_size / num_attention_heads)
  readonly ropeTheta: number; // rope_theta
  readonly ropeScaling: RopeScaling; // rope_scaling
  readonly rmsNormEps: number; // rms_norm_eps
  /** Biases on q/k/v projections: qwen2 always; llama/qwen3 when `attention_bias`. */
  readonly qkvBias: boolean;
  /** Bias on o_proj: llama/qwen3 when `attention_bias` (qwen2 never). */
  readonly outputBias: boolean;
  /** Biases on gate/up/down (llama `mlp_bias`). */
  readonly mlpBias: boolean;
  /** Per-head RMSNorm of q and k before rotary (qwen3). */
  readonly qkNorm: boolean;
  readonly tieWordEmbeddings: boolean; // tie_word_embeddings
  readonly maxPositionEmbeddings: number; // max_position_embeddings
  readonly torchDtype: TorchDType; // torch_dtype (or `dtype`)
  readonly initializerRange: number; // initializer_range (std of the normal init)
  readonly bosTokenId: readonly number[]; // bos_token_id (number or array; [] when absent)
  readonly eosTokenId: readonly number[]; // eos_token_id (number or array; [] when absent)
}

export interface LoadedModelConfig {
  readonly config: ModelConfig;
  /** The config.json object as read, for saving back unchanged. */
  readonly raw: Readonly<Record<string, unknown>>;
}

/** `<source>: expected <what> for <field> but received <value> of type <type>` (arrays shown in full: they are small in configs). */
function badConfig(source: string, field: string, what: string, value: unknown): ArpoError {
  let shown = describeValue(value);
  if (Array.isArray(value) && value.length <= 64) {
    try {
      shown = describeValue(JSON.stringify(value)).slice(1, -1);
    } catch {
      // too deep to print (a fuzzed or hostile file): keep Array(n)
    }
  }
  return new ArpoError('BAD_CONFIG', `${source}: expected ${what} for ${field} but received ${shown} of type ${describeType(value)}`);
}

/** Validates a parsed config.json; `source` names it in messages (e.g. the file path). */
export function parseModelConfig(json: unknown, source = 'config.json'): ModelConfig {
  if (json === null || typeof json !== 'object' || Array.isArray(json)) throw badConfig(source, 'config', 'an object', json);
  const raw = json as Record<string, unknown>;

  const int = (field: string, opts: { min?: number; fallback?: number } = {}): number => {
    const v = raw[field] ?? opts.fallback;
    const min = opts.min ?? 1;
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min) throw badConfig(source, field, `an integer >= ${min}`, raw[field]);
    return v;
  };
  const positive = (field: string, fallback: number): number => {
    const v = raw[field] ?? fallback;
    if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) throw badConfig(source, field, 'a positive number', raw[field]);
    return v;
  };
  const bool = (field: string, fallback: boolean): boolean => {
    const v = raw[field] ?? fallback;
    if (typeof v !== 'boolean') throw badConfig(source, field, 'a boolean', raw[field]);
    return v;
  };
  const ids = (field: string): number[] => {
    const v = raw[field];
    if (v === undefined || v === null) return [];
    const list = Array.isArray(v) ? v : [v];
    if (!list.every((x) => typeof x === 'number' && Number.isSafeInteger(x) && x >= 0)) {
      throw badConfig(source, field, 'a token id or an array of token ids', v);
    }
    return list as number[];
  };

  const modelType = raw.model_type;
  if (typeof modelType !== 'string' || !(MODEL_TYPES as readonly string[]).includes(modelType)) {
    throw badConfig(source, 'model_type', `one of ${MODEL_TYPES.join(', ')}`, modelType);
  }
  const type = modelType as ModelType;
  const act = raw.hidden_act ?? 'silu';
  if (act !== 'silu') throw badConfig(source, 'hidden_act', '"silu" (the only activation of these decoders)', act);
  if (raw.use_sliding_window === true) {
    throw badConfig(source, 'use_sliding_window', 'false (sliding-window attention is not supported)', raw.use_sliding_window);
  }

  const hiddenSize = int('hidden_size');
  const numAttentionHeads = int('num_attention_heads');
  const numKeyValueHeads = int('num_key_value_heads', { fallback: numAttentionHeads });
  if (numAttentionHeads % numKeyValueHeads !== 0) {
    throw badConfig(source, 'num_key_value_heads', `a divisor of num_attention_heads (${numAttentionHeads})`, numKeyValueHeads);
  }
  // HF: head_dim defaults to hidden_size / num_attention_heads (llama, qwen2);
  // Qwen3Config's own default is 128, which its attention then uses.
  const headDimDefault = type === 'qwen3' ? 128 : hiddenSize / numAttentionHeads;
  if ((raw.head_dim === undefined || raw.head_dim === null) && !Number.isInteger(headDimDefault)) {
    throw badConfig(source, 'hidden_size', `a multiple of num_attention_heads (${numAttentionHeads}) when head_dim is absent`, hiddenSize);
  }
  const headDim = int('head_dim', { fallback: headDimDefault });
  if (headDim % 2 !== 0) throw badConfig(source, 'head_dim', 'an even number (rotary pairs halves)', headDim);

  const attentionBias = bool('attention_bias', false);
  const ropeScaling = parseRopeScaling(source, raw.rope_scaling);
  const dtypeRaw = raw.torch_dtype ?? raw.dtype ?? 'float32';
  if (typeof dtypeRaw !== 'string' || !(TORCH_DTYPES as readonly string[]).includes(dtypeRaw)) {
    throw badConfig(source, raw.torch_dtype !== undefined ? 'torch_dtype' : 'dtype', `one of ${TORCH_DTYPES.join(', ')}`, dtypeRaw);
  }
  const mlpBias = type === 'llama' ? bool('mlp_bias', false) : false;

  return Object.freeze({
    modelType: type,
    vocabSize: int('vocab_size'),
    hiddenSize,
    intermediateSize: int('intermediate_size'),
    numHiddenLayers: int('num_hidden_layers'),
    numAttentionHeads,
    numKeyValueHeads,
    headDim,
    ropeTheta: positive('rope_theta', 10000),
    ropeScaling,
    rmsNormEps: positive('rms_norm_eps', 1e-6),
    qkvBias: type === 'qwen2' ? true : attentionBias,
    outputBias: type === 'qwen2' ? false : attentionBias,
    mlpBias,
    qkNorm: type === 'qwen3',
    tieWordEmbeddings: bool('tie_word_embeddings', false),
    maxPositionEmbeddings: int('max_position_embeddings', { fallback: type === 'llama' ? 2048 : 32768 }),
    torchDtype: dtypeRaw as TorchDType,
    initializerRange: positive('initializer_range', 0.02),
    bosTokenId: Object.freeze(ids('bos_token_id')),
    eosTokenId: Object.freeze(ids('eos_token_id')),
  });
}

function parseRopeScaling(source: string, v: unknown): RopeScaling {
  if (v === undefined || v === null) return Object.freeze({ type: 'none' });
  if (typeof v !== 'object' || Array.isArray(v)) throw badConfig(source, 'rope_scaling', 'an object or null', v);
  const r = v as Record<string, unknown>;
  const kind = r.rope_type ?? r.type ?? 'default';
  const num = (field: string, fallback?: number): number => {
    const x = r[field] ?? fallback;
    if (typeof x !== 'number' || !Number.isFinite(x) || x <= 0) throw badConfig(source, `rope_scaling.${field}`, 'a positive number', r[field]);
    return x;
  };
  switch (kind) {
    case 'default':
      return Object.freeze({ type: 'none' });
    case 'linear':
      return Object.freeze({ type: 'linear', factor: num('factor') });
    case 'llama3': {
      const lowFreqFactor = num('low_freq_factor');
      const highFreqFactor = num('high_freq_factor');
      if (highFreqFactor <= lowFreqFactor) {
        throw badConfig(source, 'rope_scaling.high_freq_factor', `a number > low_freq_factor (${lowFreqFactor})`, highFreqFactor);
      }
      return Object.freeze({
        type: 'llama3',
        factor: num('factor'),
        lowFreqFactor,
        highFreqFactor,
        originalMaxPositionEmbeddings: num('original_max_position_embeddings'),
      });
    }
    default:
      throw badConfig(source, 'rope_scaling.rope_type', 'one of default, linear, llama3', kind);
  }
}

/** Reads and validates `<dir>/config.json`. */
export function readModelConfig(dir: string): LoadedModelConfig {
  const file = path.join(dir, 'config.json');
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new ArpoError('BAD_CHECKPOINT', `${file}: cannot read (${(e as Error).message})`);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new ArpoError('BAD_CONFIG', `${file}: not valid JSON (${(e as Error).message})`);
  }
  const config = parseModelConfig(raw, file);
  return Object.freeze({ config, raw: Object.freeze(raw as Record<string, unknown>) });
}

/** Tokenizer files copied along with a checkpoint (those present are copied). */
export const TOKENIZER_FILES = [
  'tokenizer.json',
  'tokenizer_config.json',
  'special_tokens_map.json',
  'added_tokens.json',
  'vocab.json',
  'merges.txt',
  'tokenizer.model',
  'chat_template.jinja',
  'chat_template.json',
] as const;

export interface WriteCheckpointOptions {
  /** config.json contents (raw HF form, snake_case). */
  config: Record<string, unknown>;
  /** Writes the weights (model.safetensors or shards) into the staging directory. */
  writeWeights: (stagingDir: string) => Promise<void> | void;
  /** Directory holding the tokenizer files to copy. */
  tokenizerDir?: string;
  /** generation_config.json contents; default from the config's bos/eos ids. */
  generationConfig?: Record<string, unknown>;
  /** Further files: name -> contents (e.g. arpo_state.json). */
  extraFiles?: Record<string, string | Buffer>;
}

let stagingCounter = 0;

/**
 * Builds a checkpoint directory aside (`dir.tmp-<pid>-<n>`) and swaps it into
 * place with renames (old `dir` moved to `dir.old-<pid>-<n>`, then removed), so
 * a crash mid-save leaves either the old or the new directory, never half of one.
 */
export async function writeCheckpointDir(dir: string, options: WriteCheckpointOptions): Promise<void> {
  const target = path.resolve(dir);
  const n = stagingCounter++;
  const staging = `${target}.tmp-${process.pid}-${n}`;
  const old = `${target}.old-${process.pid}-${n}`;
  parseModelConfig(options.config, `${target}/config.json`); // never write an unloadable checkpoint
  fs.mkdirSync(path.dirname(target), { recursive: true });
  recoverCheckpointDir(target);
  fs.rmSync(staging, { recursive: true, force: true });
  fs.mkdirSync(staging);
  try {
    fs.writeFileSync(path.join(staging, 'config.json'), `${JSON.stringify(options.config, null, 2)}\n`);
    const generation = options.generationConfig ?? defaultGenerationConfig(options.config);
    fs.writeFileSync(path.join(staging, 'generation_config.json'), `${JSON.stringify(generation, null, 2)}\n`);
    if (options.tokenizerDir !== undefined) {
      let copied = 0;
      for (const name of TOKENIZER_FILES) {
        const src = path.join(options.tokenizerDir, name);
        if (fs.existsSync(src)) {
          fs.copyFileSync(src, path.join(staging, name));
          copied++;
        }
      }
      if (copied === 0) {
        throw new ArpoError('BAD_CHECKPOINT', `${options.tokenizerDir}: no tokenizer files (${TOKENIZER_FILES.join(', ')}) to copy`);
      }
    }
    for (const [name, contents] of Object.entries(options.extraFiles ?? {})) {
      if (name === '' || name.includes('/') || name.includes('\\') || name === '.' || name === '..') {
        throw new ArpoError('INVALID_ARGUMENT', `Expected a plain file name for extraFiles key but received ${JSON.stringify(name)}`);
      }
      fs.writeFileSync(path.join(staging, name), contents);
    }
    await options.writeWeights(staging);
    fsyncDir(staging);
  } catch (e) {
    fs.rmSync(staging, { recursive: true, force: true });
    throw e;
  }
  // The swap: two renames. Between them `dir` is briefly absent but `old`
  // holds the previous checkpoint intact.
  const hadOld = fs.existsSync(target);
  if (hadOld) fs.renameSync(target, old);
  try {
    fs.renameSync(staging, target);
  } catch (e) {
    if (hadOld) fs.renameSync(old, target);
    fs.rmSync(staging, { recursive: true, force: true });
    throw e;
  }
  fsyncDir(path.dirname(target));
  if (hadOld) fs.rmSync(old, { recursive: true, force: true });
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM'; // exists, owned by someone else
  }
}

/**
 * Repairs what a crashed writer (a process no longer running) left beside
 * `dir`: if `dir` is missing but `dir.old-<pid>-<n>` exists, the crash came
 * between the two renames and the old checkpoint is renamed back; stale
 * `dir.tmp-*` staging directories and `dir.old-*` leftovers are removed.
 * Writers still running are left alone. Returns what it did, for logs.
 */
export function recoverCheckpointDir(dir: string): string[] {
  const target = path.resolve(dir);
  const parent = path.dirname(target);
  const base = path.basename(target);
  const actions: string[] = [];
  let entries: string[];
  try {
    entries = fs.readdirSync(parent);
  } catch {
    return actions;
  }
  const pattern = /^\.(tmp|old)-(\d+)-(\d+)$/;
  const stale = entries
    .filter((e) => e.startsWith(`${base}.`))
    .map((e) => ({ name: e, m: pattern.exec(e.slice(base.length)) }))
    .filter((x): x is { name: string; m: RegExpExecArray } => x.m !== null && !processAlive(Number(x.m[2])));
  if (!fs.existsSync(target)) {
    const old = stale.filter((x) => x.m[1] === 'old').sort((a, b) => Number(b.m[3]) - Number(a.m[3]))[0];
    if (old) {
      fs.renameSync(path.join(parent, old.name), target);
      actions.push(`restored ${old.name} to ${base}`);
    }
  }
  for (const x of stale) {
    const p = path.join(parent, x.name);
    if (fs.existsSync(p)) {
      fs.rmSync(p, { recursive: true, force: true });
      actions.push(`removed ${x.name}`);
    }
  }
  return actions;
}

function fsyncDir(dir: string): void {
  let fd: number | undefined;
  try {
    fd = fs.openSync(dir, 'r');
    fs.fsyncSync(fd);
  } catch {
    /* some filesystems cannot fsync directories; the renames are still atomic */
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
  }
}

function defaultGenerationConfig(config: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (config.bos_token_id !== undefined) out.bos_token_id = config.bos_token_id;
  if (config.eos_token_id !== undefined) out.eos_token_id = config.eos_token_id;
  return out;
}

/**
 * Tiny configs for tests and the demo: real architecture, toy sizes (GQA with
 * 4 heads over 2 kv heads, 2 layers). Overrides are raw config.json fields.
 */
export function tinyConfig(type: ModelType, overrides: Record<string, unknown> = {}): Record<string, unknown> {
  const common: Record<string, unknown> = {
    model_type: type,
    architectures: [{ qwen2: 'Qwen2ForCausalLM', qwen3: 'Qwen3ForCausalLM', llama: 'LlamaForCausalLM' }[type]],
    vocab_size: 96,
    hidden_size: 32,
    intermediate_size: 64,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    hidden_act: 'silu',
    max_position_embeddings: 256,
    rms_norm_eps: 1e-6,
    rope_theta: 10000,
    initializer_range: 0.02,
    tie_word_embeddings: false,
    torch_dtype: 'float32',
    bos_token_id: 1,
    eos_token_id: 2,
  };
  if (type === 'qwen3') {
    Object.assign(common, { head_dim: 16, attention_bias: false, rope_theta: 1000000 });
  } else if (type === 'llama') {
    Object.assign(common, {
      attention_bias: false,
      mlp_bias: false,
      rope_theta: 500000,
      // original 256 puts one of the 4 rotary frequencies in llama3's interpolated band (wavelength 166 in [64, 256]).
      rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 256 },
    });
  }
  return { ...common, ...overrides };
}

/** HF tensor names and shapes of a config (the order is the model's, not sorted). */
export function expectedTensorShapes(config: ModelConfig): Array<[string, number[]]> {
  const { hiddenSize: H, intermediateSize: I, vocabSize: V, headDim: hd } = config;
  const q = config.numAttentionHeads * hd;
  const kv = config.numKeyValueHeads * hd;
  const out: Array<[string, number[]]> = [['model.embed_tokens.weight', [V, H]]];
  for (let i = 0; i < config.numHiddenLayers; i++) {
    const p = `model.layers.${i}`;
    out.push([`${p}.input_layernorm.weight`, [H]]);
    out.push([`${p}.self_attn.q_proj.weight`, [q, H]], [`${p}.self_attn.k_proj.weight`, [kv, H]], [`${p}.self_attn.v_proj.weight`, [kv, H]]);
    if (config.qkvBias) out.push([`${p}.self_attn.q_proj.bias`, [q]], [`${p}.self_attn.k_proj.bias`, [kv]], [`${p}.self_attn.v_proj.bias`, [kv]]);
    out.push([`${p}.self_attn.o_proj.weight`, [H, q]]);
    if (config.outputBias) out.push([`${p}.self_attn.o_proj.bias`, [H]]);
    if (config.qkNorm) out.push([`${p}.self_attn.q_norm.weight`, [hd]], [`${p}.self_attn.k_norm.weight`, [hd]]);
    out.push([`${p}.post_attention_layernorm.weight`, [H]]);
    out.push([`${p}.mlp.gate_proj.weight`, [I, H]], [`${p}.mlp.up_proj.weight`, [I, H]], [`${p}.mlp.down_proj.weight`, [H, I]]);
    if (config.mlpBias) out.push([`${p}.mlp.gate_proj.bias`, [I]], [`${p}.mlp.up_proj.bias`, [I]], [`${p}.mlp.down_proj.bias`, [H]]);
  }
  out.push(['model.norm.weight', [H]]);
  if (!config.tieWordEmbeddings) out.push(['lm_head.weight', [V, H]]);
  return out;
}
