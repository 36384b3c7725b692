// GGUF (llama.cpp's model file, version 3) for `arpo export --format gguf`:
// a trained HF checkpoint directory (qwen2 / qwen3 / llama, as init-model
// writes them) -> one .gguf with the weights (F32, or F16 matrices with F32
// norms and biases, as llama.cpp's converter does) and the tokenizer.
//
// Layout (github.com/ggml-org/ggml docs/gguf.md): "GGUF", version u32,
// tensor count u64, metadata count u64; metadata (key string, value type u32,
// value); tensor infos (name, n_dims u32, ne[] u64 innermost first, type
// u32, offset u64 from the data start); padding to general.alignment (32);
// the tensor data, each aligned. Strings are u64 length + UTF-8 bytes.
//
// Names and metadata follow convert_hf_to_gguf.py: token_embd, blk.N.attn_q
// / attn_k / attn_v / attn_output, attn_q_norm / attn_k_norm (qwen3),
// attn_norm, ffn_norm, ffn_gate / ffn_up / ffn_down, output_norm, output
// (absent when tied). llama's q / k rows are permuted from HF's half-split
// rotary layout to llama.cpp's interleaved one; llama3 frequency scaling
// becomes the rope_freqs tensor. The tokenizer is exported as `gpt2` (byte-
// level BPE: tokens, merges, token types, special ids, chat template).
// llama.cpp selects its pre-tokenizer regex by name: a Qwen2-style Split
// regex is tagged `qwen2`; any other (the demo's own) has no llama.cpp name
// and is tagged `default` (GPT-2's), so text may split differently there
// while token ids, the vocabulary and the merges are exact.
import * as fs from 'fs';
import * as path from 'path';
import { ArpoError } from '../errors';
import { readModelConfig, type ModelConfig } from './checkpoint';
import { bytesToFloat64, floatToF16Bits, openCheckpointTensors } from './safetensors';

export const GGUF_MAGIC = 0x46554747; // "GGUF" little-endian
export const GGUF_VERSION = 3;
export const GGUF_ALIGNMENT = 32;

/** Metadata value types (gguf.md). */
export enum GgufType {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
}
/** Tensor types written here (ggml_type). */
export enum GgmlType {
  F32 = 0,
  F16 = 1,
}

export type GgufValue =
  | { type: GgufType.UINT32 | GgufType.INT32 | GgufType.FLOAT32 | GgufType.UINT64 | GgufType.FLOAT64 | GgufType.UINT8 | GgufType.INT8 | GgufType.UINT16 | GgufType.INT16 | GgufType.INT64; value: number }
  | { type: GgufType.BOOL; value: boolean }
  | { type: GgufType.STRING; value: string }
  | { type: GgufType.ARRAY; itemType: GgufType.STRING; value: readonly string[] }
  | { type: GgufType.ARRAY; itemType: GgufType.INT32 | GgufType.UINT32 | GgufType.FLOAT32; value: readonly number[] };

export interface GgufTensor {
  name: string;
  /** PyTorch order (outermost first); written reversed, as ggml's ne[]. */
  shape: readonly number[];
  type: GgmlType;
  /** Row-major values. */
  values: Float32Array | Float64Array;
}

// ------------------------------------------------------------ writer

class ByteSink {
  private chunks: Buffer[] = [];
  length = 0;
  push(b: Buffer): void {
    this.chunks.push(b);
    this.length += b.length;
  }
  u32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v >>> 0);
    this.push(b);
  }
  u64(v: number): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.push(b);
  }
  str(s: string): void {
    const b = Buffer.from(s, 'utf8');
    this.u64(b.length);
    this.push(b);
  }
  scalar(type: GgufType, v: number | boolean | string): void {
    const b = Buffer.alloc(8);
    switch (type) {
      case GgufType.UINT8: b.writeUInt8(v as number); return this.push(b.subarray(0, 1));
      case GgufType.INT8: b.writeInt8(v as number); return this.push(b.subarray(0, 1));
      case GgufType.UINT16: b.writeUInt16LE(v as number); return this.push(b.subarray(0, 2));
      case GgufType.INT16: b.writeInt16LE(v as number); return this.push(b.subarray(0, 2));
      case GgufType.UINT32: b.writeUInt32LE(v as number); return this.push(b.subarray(0, 4));
      case GgufType.INT32: b.writeInt32LE(v as number); return this.push(b.subarray(0, 4));
      case GgufType.FLOAT32: b.writeFloatLE(v as number); return this.push(b.subarray(0, 4));
      case GgufType.BOOL: b.writeUInt8(v ? 1 : 0); return this.push(b.subarray(0, 1));
      case GgufType.UINT64: b.writeBigUInt64LE(BigInt(v as number)); return this.push(b);
      case GgufType.INT64: b.writeBigInt64LE(BigInt(v as number)); return this.push(b);
      case GgufType.FLOAT64: b.writeDoubleLE(v as number); return this.push(b);
      case GgufType.STRING: return this.str(v as string);
      default: throw new ArpoError('INVALID_ARGUMENT', `gguf: cannot write a scalar of type ${type}`);
    }
  }
  pad(to: number): void {
    const n = (to - (this.length % to)) % to;
    if (n) this.push(Buffer.alloc(n));
  }
  concat(): Buffer {
    return Buffer.concat(this.chunks, this.length);
  }
}

function tensorBytes(t: GgufTensor): Buffer {
  const n = t.values.length;
  if (t.type === GgmlType.F32) {
    const b = Buffer.alloc(n * 4);
    for (let i = 0; i < n; i++) b.writeFloatLE(t.values[i]!, i * 4);
    return b;
  }
  const b = Buffer.alloc(n * 2);
  for (let i = 0; i < n; i++) b.writeUInt16LE(floatToF16Bits(t.values[i]!), i * 2);
  return b;
}

/** Writes a GGUF v3 file (atomically: a temp file renamed into place). */
export function writeGguf(file: string, metadata: ReadonlyArray<readonly [string, GgufValue]>, tensors: readonly GgufTensor[]): void {
  const head = new ByteSink();
  head.u32(GGUF_MAGIC);
  head.u32(GGUF_VERSION);
  head.u64(tensors.length);
  head.u64(metadata.length);
  for (const [key, v] of metadata) {
    head.str(key);
    head.u32(v.type);
    if (v.type === GgufType.ARRAY) {
      head.u32(v.itemType);
      head.u64(v.value.length);
      for (const x of v.value) head.scalar(v.itemType, x);
    } else {
      head.scalar(v.type, v.value);
    }
  }
  const data: Buffer[] = [];
  let offset = 0;
  for (const t of tensors) {
    const count = t.shape.reduce((a, b) => a * b, 1);
    if (count !== t.values.length) throw new ArpoError('INVALID_ARGUMENT', `gguf: tensor ${t.name} has ${t.values.length} values for shape [${t.shape.join(', ')}]`);
    head.str(t.name);
    head.u32(t.shape.length);
    for (const d of [...t.shape].reverse()) head.u64(d);
    head.u32(t.type);
    head.u64(offset);
    const bytes = tensorBytes(t);
    const padded = Math.ceil(bytes.length / GGUF_ALIGNMENT) * GGUF_ALIGNMENT;
    data.push(bytes, Buffer.alloc(padded - bytes.length));
    offset += padded;
  }
  head.pad(GGUF_ALIGNMENT);
  const tmp = `${file}.tmp-${process.pid}`;
  fs.mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
  const fd = fs.openSync(tmp, 'w');
  try {
    fs.writeSync(fd, head.concat());
    for (const b of data) if (b.length) fs.writeSync(fd, b);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(tmp, file);
}

// ------------------------------------------------------------ reader (for checks and tests)

export interface GgufFile {
  version: number;
  metadata: Map<string, unknown>;
  tensors: Map<string, { shape: number[]; type: GgmlType; values: Float64Array }>;
}

/** Parses a GGUF v3 file written with F32 / F16 tensors; errors name the file and the offset. */
export function readGguf(file: string): GgufFile {
  const buf = fs.readFileSync(file);
  let at = 0;
  const fail = (what: string): never => {
    throw new ArpoError('BAD_CHECKPOINT', `${file}: ${what} at byte ${at}`);
  };
  const need = (n: number): void => {
    if (at + n > buf.length) fail(`truncated (need ${n} bytes)`);
  };
  const u32 = (): number => (need(4), (at += 4), buf.readUInt32LE(at - 4));
  const u64 = (): number => {
    need(8);
    const v = buf.readBigUInt64LE(at);
    at += 8;
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) fail(`length ${v} too large`);
    return Number(v);
  };
  const str = (): string => {
    const n = u64();
    need(n);
    at += n;
    return buf.toString('utf8', at - n, at);
  };
  const scalar = (type: number): unknown => {
    switch (type) {
      case GgufType.UINT8: return (need(1), (at += 1), buf.readUInt8(at - 1));
      case GgufType.INT8: return (need(1), (at += 1), buf.readInt8(at - 1));
      case GgufType.UINT16: return (need(2), (at += 2), buf.readUInt16LE(at - 2));
      case GgufType.INT16: return (need(2), (at += 2), buf.readInt16LE(at - 2));
      case GgufType.UINT32: return u32();
      case GgufType.INT32: return (need(4), (at += 4), buf.readInt32LE(at - 4));
      case GgufType.FLOAT32: return (need(4), (at += 4), buf.readFloatLE(at - 4));
      case GgufType.BOOL: return (need(1), (at += 1), buf.readUInt8(at - 1) !== 0);
      case GgufType.STRING: return str();
      case GgufType.UINT64: return u64();
      case GgufType.INT64: return (need(8), (at += 8), Number(buf.readBigInt64LE(at - 8)));
      case GgufType.FLOAT64: return (need(8), (at += 8), buf.readDoubleLE(at - 8));
      default: return fail(`unknown value type ${type}`);
    }
  };
  if (u32() !== GGUF_MAGIC) fail('not a GGUF file (magic)');
  const version = u32();
  if (version !== GGUF_VERSION) fail(`version ${version} (expected ${GGUF_VERSION})`);
  const nTensors = u64();
  const nMeta = u64();
  const metadata = new Map<string, unknown>();
  for (let i = 0; i < nMeta; i++) {
    const key = str();
    const type = u32();
    if (type === GgufType.ARRAY) {
      const item = u32();
      const n = u64();
      const arr: unknown[] = [];
      for (let j = 0; j < n; j++) arr.push(scalar(item));
      metadata.set(key, arr);
    } else {
      metadata.set(key, scalar(type));
    }
  }
  const infos: { name: string; shape: number[]; type: GgmlType; offset: number }[] = [];
  for (let i = 0; i < nTensors; i++) {
    const name = str();
    const nd = u32();
    if (nd < 1 || nd > 4) fail(`tensor ${name}: ${nd} dimensions`);
    const ne: number[] = [];
    for (let d = 0; d < nd; d++) ne.push(u64());
    const type = u32();
    if (type !== GgmlType.F32 && type !== GgmlType.F16) fail(`tensor ${name}: type ${type} (only F32 / F16 are read here)`);
    infos.push({ name, shape: ne.reverse(), type, offset: u64() });
  }
  const alignment = typeof metadata.get('general.alignment') === 'number' ? (metadata.get('general.alignment') as number) : GGUF_ALIGNMENT;
  const dataStart = Math.ceil(at / alignment) * alignment;
  const tensors = new Map<string, { shape: number[]; type: GgmlType; values: Float64Array }>();
  for (const t of infos) {
    const n = t.shape.reduce((a, b) => a * b, 1);
    const start = dataStart + t.offset;
    const bytes = n * (t.type === GgmlType.F32 ? 4 : 2);
    if (t.offset % alignment !== 0 || start + bytes > buf.length) throw new ArpoError('BAD_CHECKPOINT', `${file}: tensor ${t.name}: data [${start}, ${start + bytes}) outside the file or unaligned`);
    tensors.set(t.name, { shape: t.shape, type: t.type, values: bytesToFloat64(t.type === GgmlType.F32 ? 'F32' : 'F16', buf.subarray(start, start + bytes)) });
  }
  return { version, metadata, tensors };
}

// ------------------------------------------------------------ HF checkpoint -> GGUF

/** HF tensor name -> llama.cpp's, per layer. */
const LAYER_NAMES: ReadonlyArray<readonly [string, string]> = [
  ['input_layernorm.weight', 'attn_norm.weight'],
  ['self_attn.q_proj.weight', 'attn_q.weight'],
  ['self_attn.q_proj.bias', 'attn_q.bias'],
  ['self_attn.k_proj.weight', 'attn_k.weight'],
  ['self_attn.k_proj.bias', 'attn_k.bias'],
  ['self_attn.v_proj.weight', 'attn_v.weight'],
  ['self_attn.v_proj.bias', 'attn_v.bias'],
  ['self_attn.o_proj.weight', 'attn_output.weight'],
  ['self_attn.o_proj.bias', 'attn_output.bias'],
  ['self_attn.q_norm.weight', 'attn_q_norm.weight'],
  ['self_attn.k_norm.weight', 'attn_k_norm.weight'],
  ['post_attention_layernorm.weight', 'ffn_norm.weight'],
  ['mlp.gate_proj.weight', 'ffn_gate.weight'],
  ['mlp.gate_proj.bias', 'ffn_gate.bias'],
  ['mlp.up_proj.weight', 'ffn_up.weight'],
  ['mlp.up_proj.bias', 'ffn_up.bias'],
  ['mlp.down_proj.weight', 'ffn_down.weight'],
  ['mlp.down_proj.bias', 'ffn_down.bias'],
];

/** llama.cpp's name of an HF tensor, or null for one it does not take. */
export function ggufTensorName(hf: string): string | null {
  if (hf === 'model.embed_tokens.weight') return 'token_embd.weight';
  if (hf === 'model.norm.weight') return 'output_norm.weight';
  if (hf === 'lm_head.weight') return 'output.weight';
  const m = /^model\.layers\.(\d+)\.(.+)$/.exec(hf);
  if (!m) return null;
  const to = LAYER_NAMES.find(([from]) => from === m[2]);
  return to ? `blk.${m[1]}.${to[1]}` : null;
}

/**
 * HF's rotary layout (each head's first half / second half pair up) to
 * llama.cpp's interleaved pairs for llama: convert_hf_to_gguf's permute,
 * rows of a q / k weight (or bias) regrouped per head as (2, d/2) -> (d/2, 2).
 */
export function permuteRotary(values: Float64Array, rows: number, cols: number, heads: number): Float64Array {
  const headDim = rows / heads;
  const half = headDim / 2;
  const out = new Float64Array(values.length);
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < half; i++) {
      for (let j = 0; j < 2; j++) {
        const from = h * headDim + j * half + i;
        const to = h * headDim + i * 2 + j;
        out.set(values.subarray(from * cols, (from + 1) * cols), to * cols);
      }
    }
  }
  return out;
}

/** llama3 frequency scaling as llama.cpp's rope_freqs factors (one per rotary pair), as the converter computes them. */
export function llama3RopeFactors(c: ModelConfig): Float64Array {
  const s = c.ropeScaling;
  if (s.type !== 'llama3') throw new ArpoError('INVALID_ARGUMENT', 'llama3RopeFactors: not llama3 scaling');
  const half = c.headDim / 2;
  const out = new Float64Array(half);
  const lowWavelen = s.originalMaxPositionEmbeddings / s.lowFreqFactor;
  const highWavelen = s.originalMaxPositionEmbeddings / s.highFreqFactor;
  for (let i = 0; i < half; i++) {
    const freq = 1 / Math.pow(c.ropeTheta, (2 * i) / c.headDim);
    const wavelen = (2 * Math.PI) / freq;
    if (wavelen < highWavelen) out[i] = 1;
    else if (wavelen > lowWavelen) out[i] = s.factor;
    else {
      const smooth = (s.originalMaxPositionEmbeddings / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor);
      out[i] = 1 / ((1 - smooth) / s.factor + smooth);
    }
  }
  return out;
}

/** What the exported tokenizer supports, for the CLI and the bench to report. */
export interface GgufExportSummary {
  file: string;
  architecture: string;
  tensors: number;
  vocab: number;
  preTokenizer: string;
  /** True when llama.cpp will split text exactly as the HF tokenizer does. */
  textExact: boolean;
  bytes: number;
}

const QWEN2_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function readJson(file: string): Record<string, unknown> {
  try {
    return JSON.parse(fs.readFileSync(file, 'utf8')) as Record<string, unknown>;
  } catch (e) {
    throw new ArpoError('BAD_CHECKPOINT', `${file}: cannot read a JSON object (${(e as Error).message})`);
  }
}

/** The tokenizer's GGUF metadata from tokenizer.json (+ tokenizer_config.json), vocabulary padded to the model's rows. */
function tokenizerMetadata(dir: string, vocabSize: number): { meta: [string, GgufValue][]; pre: string; exact: boolean; vocab: number } {
  const tj = readJson(path.join(dir, 'tokenizer.json'));
  const model = tj.model as { type?: string; vocab?: Record<string, number>; merges?: unknown[] } | undefined;
  if (!model || model.type !== 'BPE' || !model.vocab || !Array.isArray(model.merges)) {
    throw new ArpoError('BAD_CHECKPOINT', `${path.join(dir, 'tokenizer.json')}: expected a byte-level BPE model (model.type "BPE" with vocab and merges) but received model.type ${JSON.stringify(model?.type ?? null)}`);
  }
  const tokens: string[] = new Array(vocabSize).fill('');
  const types: number[] = new Array(vocabSize).fill(5); // UNUSED until filled
  for (const [tok, id] of Object.entries(model.vocab)) {
    if (!Number.isInteger(id) || id < 0 || id >= vocabSize) throw new ArpoError('BAD_CHECKPOINT', `tokenizer.json: token ${JSON.stringify(tok)} has id ${id}, outside the model's ${vocabSize} rows`);
    tokens[id] = tok;
    types[id] = 1; // NORMAL
  }
  const added = Array.isArray(tj.added_tokens) ? (tj.added_tokens as { id: number; content: string; special?: boolean }[]) : [];
  for (const t of added) {
    if (!Number.isInteger(t.id) || t.id < 0 || t.id >= vocabSize) throw new ArpoError('BAD_CHECKPOINT', `tokenizer.json: added token ${JSON.stringify(t.content)} has id ${t.id}, outside the model's ${vocabSize} rows`);
    tokens[t.id] = t.content;
    types[t.id] = t.special ? 3 : 4; // CONTROL : USER_DEFINED
  }
  for (let i = 0; i < vocabSize; i++) if (types[i] === 5) tokens[i] = `[PAD${i}]`;
  const merges = (model.merges as unknown[]).map((m) => (Array.isArray(m) ? m.join(' ') : String(m)));
  // The pre-tokenizer: Qwen2's split regex has a llama.cpp name; others do not.
  const splits = JSON.stringify(tj.pre_tokenizer ?? null);
  const exact = splits.includes(JSON.stringify(QWEN2_SPLIT).slice(1, -1));
  const pre = exact ? 'qwen2' : 'default';
  const cfgFile = path.join(dir, 'tokenizer_config.json');
  const tc = fs.existsSync(cfgFile) ? readJson(cfgFile) : {};
  const idOf = (v: unknown): number | undefined => {
    const content = typeof v === 'string' ? v : v && typeof v === 'object' ? (v as { content?: string }).content : undefined;
    if (content === undefined) return undefined;
    const i = tokens.indexOf(content);
    return i >= 0 ? i : undefined;
  };
  const meta: [string, GgufValue][] = [
    ['tokenizer.ggml.model', { type: GgufType.STRING, value: 'gpt2' }],
    ['tokenizer.ggml.pre', { type: GgufType.STRING, value: pre }],
    ['tokenizer.ggml.tokens', { type: GgufType.ARRAY, itemType: GgufType.STRING, value: tokens }],
    ['tokenizer.ggml.token_type', { type: GgufType.ARRAY, itemType: GgufType.INT32, value: types }],
    ['tokenizer.ggml.merges', { type: GgufType.ARRAY, itemType: GgufType.STRING, value: merges }],
  ];
  const eos = idOf(tc.eos_token);
  const bos = idOf(tc.bos_token);
  const pad = idOf(tc.pad_token);
  if (eos !== undefined) meta.push(['tokenizer.ggml.eos_token_id', { type: GgufType.UINT32, value: eos }]);
  if (bos !== undefined) meta.push(['tokenizer.ggml.bos_token_id', { type: GgufType.UINT32, value: bos }]);
  if (pad !== undefined) meta.push(['tokenizer.ggml.padding_token_id', { type: GgufType.UINT32, value: pad }]);
  meta.push(['tokenizer.ggml.add_bos_token', { type: GgufType.BOOL, value: tc.add_bos_token === true }]);
  if (typeof tc.chat_template === 'string') meta.push(['tokenizer.chat_template', { type: GgufType.STRING, value: tc.chat_template }]);
  return { meta, pre, exact, vocab: Object.keys(model.vocab).length + added.length };
}

/**
 * Exports an HF checkpoint directory (config.json, safetensors weights,
 * tokenizer.json) as GGUF: F32 everywhere, or F16 matrices (2-D weights) with
 * F32 norms, biases and rope factors.
 */
export function exportGguf(dir: string, file: string, options: { dtype?: 'f32' | 'f16'; name?: string } = {}): GgufExportSummary {
  const dtype = options.dtype ?? 'f32';
  if (dtype !== 'f32' && dtype !== 'f16') throw new ArpoError('INVALID_ARGUMENT', `export: --dtype ${JSON.stringify(dtype)}: expected f32 or f16`);
  const { config: c } = readModelConfig(dir);
  const arch = c.modelType;
  const tok = tokenizerMetadata(dir, c.vocabSize);
  const meta: [string, GgufValue][] = [
    ['general.architecture', { type: GgufType.STRING, value: arch }],
    ['general.name', { type: GgufType.STRING, value: options.name ?? path.basename(path.resolve(dir)) }],
    ['general.alignment', { type: GgufType.UINT32, value: GGUF_ALIGNMENT }],
    ['general.file_type', { type: GgufType.UINT32, value: dtype === 'f32' ? 0 : 1 }],
    [`${arch}.context_length`, { type: GgufType.UINT32, value: c.maxPositionEmbeddings }],
    [`${arch}.embedding_length`, { type: GgufType.UINT32, value: c.hiddenSize }],
    [`${arch}.block_count`, { type: GgufType.UINT32, value: c.numHiddenLayers }],
    [`${arch}.feed_forward_length`, { type: GgufType.UINT32, value: c.intermediateSize }],
    [`${arch}.attention.head_count`, { type: GgufType.UINT32, value: c.numAttentionHeads }],
    [`${arch}.attention.head_count_kv`, { type: GgufType.UINT32, value: c.numKeyValueHeads }],
    [`${arch}.attention.key_length`, { type: GgufType.UINT32, value: c.headDim }],
    [`${arch}.attention.value_length`, { type: GgufType.UINT32, value: c.headDim }],
    [`${arch}.rope.freq_base`, { type: GgufType.FLOAT32, value: c.ropeTheta }],
    [`${arch}.rope.dimension_count`, { type: GgufType.UINT32, value: c.headDim }],
    [`${arch}.attention.layer_norm_rms_epsilon`, { type: GgufType.FLOAT32, value: c.rmsNormEps }],
    [`${arch}.vocab_size`, { type: GgufType.UINT32, value: c.vocabSize }],
  ];
  if (c.ropeScaling.type === 'linear') {
    meta.push([`${arch}.rope.scaling.type`, { type: GgufType.STRING, value: 'linear' }], [`${arch}.rope.scaling.factor`, { type: GgufType.FLOAT32, value: c.ropeScaling.factor }]);
  }
  meta.push(...tok.meta);

  const source = openCheckpointTensors(dir);
  const tensors: GgufTensor[] = [];
  for (const [hf, { file: sf, info }] of source) {
    if (hf === 'lm_head.weight' && c.tieWordEmbeddings) continue; // llama.cpp reuses token_embd
    const name = ggufTensorName(hf);
    if (name === null) {
      if (/rotary_emb\.inv_freq$/.test(hf)) continue; // a buffer some checkpoints carry; recomputed from the config
      throw new ArpoError('BAD_CHECKPOINT', `${dir}: tensor ${hf} has no GGUF counterpart for ${arch}`);
    }
    let values = bytesToFloat64(info.dtype, sf.loadBytes(hf));
    const shape = [...info.shape];
    if (arch === 'llama' && /\.(q|k)_proj\.(weight|bias)$/.test(hf)) {
      const heads = hf.includes('.q_proj.') ? c.numAttentionHeads : c.numKeyValueHeads;
      values = permuteRotary(values, shape[0]!, shape.length > 1 ? shape[1]! : 1, heads);
    }
    tensors.push({ name, shape, type: dtype === 'f16' && shape.length === 2 ? GgmlType.F16 : GgmlType.F32, values });
  }
  if (c.ropeScaling.type === 'llama3') tensors.push({ name: 'rope_freqs.weight', shape: [c.headDim / 2], type: GgmlType.F32, values: llama3RopeFactors(c) });
  // llama.cpp's order: the embedding, the blocks in order, the output norm and head.
  const rank = (n: string): [number, number, string] => {
    if (n === 'token_embd.weight') return [0, 0, n];
    if (n === 'rope_freqs.weight') return [1, 0, n];
    const m = /^blk\.(\d+)\./.exec(n);
    if (m) return [2, Number(m[1]), n];
    return [3, 0, n];
  };
  tensors.sort((a, b) => {
    const x = rank(a.name);
    const y = rank(b.name);
    return x[0] - y[0] || x[1] - y[1] || (x[2] < y[2] ? -1 : x[2] > y[2] ? 1 : 0);
  });
  writeGguf(file, meta, tensors);
  return { file, architecture: arch, tensors: tensors.length, vocab: tok.vocab, preTokenizer: tok.pre, textExact: tok.exact, bytes: fs.statSync(file).size };
}
