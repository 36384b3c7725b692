// Pure-TypeScript safetensors reader/writer (Buffer-based) with the same
// validation and messages as native/torch/safetensors.cc; used by init-model,
// tests, tools and the float64 reference forward. Format: u64 LE header length
// N, N bytes of JSON {name: {dtype, shape, data_offsets}, "__metadata__"}, data.
import * as fs from 'fs';
import * as path from 'path';
import { ArpoError } from '../errors';

/** Largest header accepted (the reference implementation's MAX_HEADER_SIZE). */
export const MAX_HEADER_BYTES = 100_000_000;

export const DTYPE_SIZES = {
  F64: 8,
  F32: 4,
  F16: 2,
  BF16: 2,
  I64: 8,
  I32: 4,
  I16: 2,
  I8: 1,
  U8: 1,
  BOOL: 1,
} as const;
export type SafetensorsDType = keyof typeof DTYPE_SIZES;
const KNOWN_DTYPES = Object.keys(DTYPE_SIZES).join(', ');

export interface TensorInfo {
  readonly dtype: SafetensorsDType;
  readonly shape: readonly number[];
  readonly begin: number; // byte offsets within the data section
  readonly end: number;
}

export interface SafetensorsHeader {
  readonly tensors: ReadonlyMap<string, TensorInfo>;
  readonly metadata: Readonly<Record<string, string>>;
}

function fileError(source: string, what: string): ArpoError {
  return new ArpoError('BAD_CHECKPOINT', `${source}: ${what}`);
}
function tensorError(source: string, name: string, what: string): ArpoError {
  return new ArpoError('BAD_CHECKPOINT', `${source}: tensor ${JSON.stringify(name)}: ${what}`);
}

function isDType(s: unknown): s is SafetensorsDType {
  return typeof s === 'string' && Object.prototype.hasOwnProperty.call(DTYPE_SIZES, s);
}

/**
 * Validates a header (the N JSON bytes) against a data section of dataBytes:
 * dtype known, shape of non-negative integers, 0 <= begin <= end <= dataBytes,
 * end - begin == numel * itemsize, no two tensors sharing bytes (gaps are fine).
 */
export function parseSafetensorsHeader(source: string, headerText: string, dataBytes: number): SafetensorsHeader {
  let root: unknown;
  try {
    root = JSON.parse(headerText);
  } catch (e) {
    throw fileError(source, `header is not valid JSON (${(e as Error).message})`);
  }
  if (root === null || typeof root !== 'object' || Array.isArray(root)) {
    throw fileError(source, `header is a JSON ${root === null ? 'null' : Array.isArray(root) ? 'array' : typeof root}, expected an object`);
  }
  const tensors = new Map<string, TensorInfo>();
  const metadata: Record<string, string> = {};
  for (const [name, entry] of Object.entries(root as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) {
        throw fileError(source, '"__metadata__" must be an object of strings');
      }
      for (const [k, v] of Object.entries(entry as Record<string, unknown>)) {
        if (typeof v !== 'string') throw fileError(source, `"__metadata__" value for ${JSON.stringify(k)} is a ${typeof v}, expected a string`);
        metadata[k] = v;
      }
      continue;
    }
    if (entry === null || typeof entry !== 'object' || Array.isArray(entry)) {
      throw tensorError(source, name, `entry is not an object`);
    }
    const e = entry as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    if (typeof e.dtype !== 'string') throw tensorError(source, name, 'missing string field "dtype"');
    if (!isDType(e.dtype)) throw tensorError(source, name, `unknown dtype ${JSON.stringify(e.dtype)} (known: ${KNOWN_DTYPES})`);
    if (!Array.isArray(e.shape)) throw tensorError(source, name, 'missing array field "shape"');
    // Byte count in BigInt: a hostile shape must not lose precision or wrap.
    let bytes = BigInt(DTYPE_SIZES[e.dtype]);
    for (const d of e.shape) {
      if (!Number.isSafeInteger(d) || (d as number) < 0) {
        throw tensorError(source, name, `shape ${JSON.stringify(e.shape)} must hold non-negative integers`);
      }
      bytes *= BigInt(d as number);
    }
    const offsets = e.data_offsets;
    if (
      !Array.isArray(offsets) ||
      offsets.length !== 2 ||
      !offsets.every((o) => Number.isSafeInteger(o) && (o as number) >= 0)
    ) {
      throw tensorError(source, name, `"data_offsets" must be [begin, end] of non-negative integers, got ${JSON.stringify(offsets) ?? 'nothing'}`);
    }
    const begin = offsets[0] as number;
    const end = offsets[1] as number;
    const range = `[${begin}, ${end}]`;
    if (end < begin) throw tensorError(source, name, `data_offsets ${range} end before they begin`);
    if (end > dataBytes) throw tensorError(source, name, `data_offsets ${range} exceed the data section of ${dataBytes} bytes`);
    if (BigInt(end - begin) !== bytes) {
      throw tensorError(
        source,
        name,
        `data_offsets ${range} hold ${end - begin} bytes but dtype ${e.dtype} and shape ${JSON.stringify(e.shape)} need ${bytes}`,
      );
    }
    tensors.set(name, Object.freeze({ dtype: e.dtype, shape: Object.freeze([...(e.shape as number[])]), begin, end }));
  }
  const byOffset = [...tensors.entries()].filter(([, t]) => t.end > t.begin).sort((a, b) => a[1].begin - b[1].begin);
  for (let i = 1; i < byOffset.length; i++) {
    const [prevName, prev] = byOffset[i - 1]!;
    const [curName, cur] = byOffset[i]!;
    if (cur.begin < prev.end) {
      throw tensorError(source, curName, `data_offsets [${cur.begin}, ${cur.end}] overlap tensor ${JSON.stringify(prevName)} at [${prev.begin}, ${prev.end}]`);
    }
  }
  return { tensors, metadata: Object.freeze(metadata) };
}

// ------------------------------------------------------------ conversions
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** float -> bfloat16 bits, round to nearest even (NaN stays a quiet NaN), as torch does. */
export function float32ToBf16Bits(x: number): number {
  f32[0] = x;
  const bits = u32[0]!;
  if ((bits & 0x7f800000) === 0x7f800000 && (bits & 0x007fffff) !== 0) return ((bits >>> 16) | 0x0040) & 0xffff;
  const rounded = bits + 0x7fff + ((bits >>> 16) & 1);
  return (rounded >>> 16) & 0xffff;
}
export function bf16BitsToFloat32(b: number): number {
  u32[0] = (b & 0xffff) << 16;
  return f32[0]!;
}
/** IEEE half bits -> number. */
export function f16BitsToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}
/** number -> IEEE half bits, round to nearest even. */
export function floatToF16Bits(x: number): number {
  if (Number.isNaN(x)) return 0x7e00;
  const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0;
  let a = Math.abs(Math.fround(x));
  if (a >= 65520) return sign | 0x7c00; // rounds to infinity
  if (a < 2 ** -14) {
    // subnormal: units of 2^-24, ties to even
    a = a / 2 ** -24;
    let m = Math.floor(a);
    const r = a - m;
    if (r > 0.5 || (r === 0.5 && m % 2 === 1)) m++;
    return sign | m;
  }
  let e = Math.floor(Math.log2(a));
  if (2 ** e > a) e--;
  if (2 ** (e + 1) <= a) e++;
  let m = a / 2 ** e - 1; // [0, 1)
  m *= 1024;
  let mi = Math.floor(m);
  const r = m - mi;
  if (r > 0.5 || (r === 0.5 && mi % 2 === 1)) mi++;
  if (mi === 1024) {
    mi = 0;
    e++;
  }
  if (e + 15 >= 31) return sign | 0x7c00;
  return sign | ((e + 15) << 10) | mi;
}

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** A typed-array view of bytes (copied first when misaligned for the element size). */
function aligned<T>(bytes: Buffer, size: number, make: (buf: ArrayBuffer, offset: number, length: number) => T): T {
  if (bytes.byteOffset % size === 0) return make(bytes.buffer as ArrayBuffer, bytes.byteOffset, bytes.length / size);
  const copy = new Uint8Array(bytes.length);
  copy.set(bytes);
  return make(copy.buffer, 0, bytes.length / size);
}

/** Decodes raw little-endian bytes of any dtype into float64 values. */
export function bytesToFloat64(dtype: SafetensorsDType, bytes: Buffer): Float64Array {
  const n = bytes.length / DTYPE_SIZES[dtype];
  const out = new Float64Array(n);
  if (LITTLE_ENDIAN && (dtype === 'F32' || dtype === 'BF16')) {
    // Typed-array fast paths (the host order is the file order).
    if (dtype === 'F32') {
      out.set(aligned(bytes, 4, (b, o, l) => new Float32Array(b, o, l)));
    } else {
      const bits = aligned(bytes, 2, (b, o, l) => new Uint16Array(b, o, l));
      const f = new Float32Array(n);
      const u = new Uint32Array(f.buffer);
      for (let i = 0; i < n; i++) u[i] = bits[i]! << 16; // bf16 is the top half of a float32
      out.set(f);
    }
    return out;
  }
  switch (dtype) {
    case 'F64':
      for (let i = 0; i < n; i++) out[i] = bytes.readDoubleLE(8 * i);
      break;
    case 'F32':
      for (let i = 0; i < n; i++) out[i] = bytes.readFloatLE(4 * i);
      break;
    case 'BF16':
      for (let i = 0; i < n; i++) out[i] = bf16BitsToFloat32(bytes.readUInt16LE(2 * i));
      break;
    case 'F16':
      for (let i = 0; i < n; i++) out[i] = f16BitsToFloat(bytes.readUInt16LE(2 * i));
      break;
    case 'I64':
      for (let i = 0; i < n; i++) out[i] = Number(bytes.readBigInt64LE(8 * i));
      break;
    case 'I32':
      for (let i = 0; i < n; i++) out[i] = bytes.readInt32LE(4 * i);
      break;
    case 'I16':
      for (let i = 0; i < n; i++) out[i] = bytes.readInt16LE(2 * i);
      break;
    case 'I8':
      for (let i = 0; i < n; i++) out[i] = bytes.readInt8(i);
      break;
    case 'U8':
    case 'BOOL':
      for (let i = 0; i < n; i++) out[i] = bytes[i]!;
      break;
  }
  return out;
}

/** Encodes values as little-endian bytes of dtype (floats rounded to nearest even, integers truncated). */
export function float64ToBytes(dtype: SafetensorsDType, values: ArrayLike<number>): Buffer {
  const n = values.length;
  if (LITTLE_ENDIAN && (dtype === 'F32' || dtype === 'BF16')) {
    const f = values instanceof Float32Array ? values : Float32Array.from(values);
    if (dtype === 'F32') return Buffer.from(f.buffer, f.byteOffset, f.byteLength);
    // float32 -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN (as torch does).
    const u = new Uint32Array(f.buffer, f.byteOffset, n);
    const bits = new Uint16Array(n);
    for (let i = 0; i < n; i++) {
      const x = u[i]!;
      bits[i] = (x & 0x7f800000) === 0x7f800000 && (x & 0x007fffff) !== 0 ? (x >>> 16) | 0x0040 : (x + 0x7fff + ((x >>> 16) & 1)) >>> 16;
    }
    return Buffer.from(bits.buffer, 0, bits.byteLength);
  }
  const out = Buffer.alloc(n * DTYPE_SIZES[dtype]);
  switch (dtype) {
    case 'F64':
      for (let i = 0; i < n; i++) out.writeDoubleLE(values[i]!, 8 * i);
      break;
    case 'F32':
      for (let i = 0; i < n; i++) out.writeFloatLE(values[i]!, 4 * i);
      break;
    case 'BF16':
      for (let i = 0; i < n; i++) out.writeUInt16LE(float32ToBf16Bits(values[i]!), 2 * i);
      break;
    case 'F16':
      for (let i = 0; i < n; i++) out.writeUInt16LE(floatToF16Bits(values[i]!), 2 * i);
      break;
    case 'I64':
      for (let i = 0; i < n; i++) out.writeBigInt64LE(BigInt(Math.trunc(values[i]!)), 8 * i);
      break;
    case 'I32':
      for (let i = 0; i < n; i++) out.writeInt32LE(Math.trunc(values[i]!), 4 * i);
      break;
    case 'I16':
      for (let i = 0; i < n; i++) out.writeInt16LE(Math.trunc(values[i]!), 2 * i);
      break;
    case 'I8':
      for (let i = 0; i < n; i++) out.writeInt8(Math.trunc(values[i]!), i);
      break;
    case 'U8':
    case 'BOOL':
      for (let i = 0; i < n; i++) out[i] = Math.trunc(values[i]!) & 0xff;
      break;
  }
  return out;
}

// ------------------------------------------------------------ reader
/** A validated safetensors file; tensor bytes are read on demand with positional reads. */
export class SafetensorsFile {
  readonly path: string;
  readonly tensors: ReadonlyMap<string, TensorInfo>;
  readonly metadata: Readonly<Record<string, string>>;
  private readonly dataStart: number;

  private constructor(file: string, header: SafetensorsHeader, dataStart: number) {
    this.path = file;
    this.tensors = header.tensors;
    this.metadata = header.metadata;
    this.dataStart = dataStart;
  }

  /** Reads and validates the header; throws ArpoError BAD_CHECKPOINT "<path>: ..." on any problem. */
  static open(file: string): SafetensorsFile {
    let fd: number;
    try {
      fd = fs.openSync(file, 'r');
    } catch (e) {
      throw fileError(file, `open failed: ${(e as Error).message}`);
    }
    try {
      const size = fs.fstatSync(fd).size;
      if (size < 8) throw fileError(file, `file is ${size} bytes, too short for the 8-byte header length`);
      const prefix = Buffer.alloc(8);
      fs.readSync(fd, prefix, 0, 8, 0);
      const n = prefix.readBigUInt64LE(0);
      if (n > BigInt(MAX_HEADER_BYTES)) throw fileError(file, `header length ${n} exceeds the limit of ${MAX_HEADER_BYTES} bytes`);
      const headerBytes = Number(n);
      if (headerBytes > size - 8) {
        throw fileError(file, `header length ${headerBytes} exceeds the ${size - 8} bytes after the length prefix (truncated file?)`);
      }
      const header = Buffer.alloc(headerBytes);
      fs.readSync(fd, header, 0, headerBytes, 8);
      if (headerBytes === 0 || header[0] !== 0x7b) throw fileError(file, "header does not start with '{'");
      return new SafetensorsFile(file, parseSafetensorsHeader(file, header.toString('utf8'), size - 8 - headerBytes), 8 + headerBytes);
    } finally {
      fs.closeSync(fd);
    }
  }

  info(name: string): TensorInfo {
    const t = this.tensors.get(name);
    if (!t) throw tensorError(this.path, name, 'not in this file');
    return t;
  }

  /** Raw little-endian bytes of a tensor (a copy). */
  loadBytes(name: string): Buffer {
    const t = this.info(name);
    const out = Buffer.alloc(t.end - t.begin);
    if (out.length === 0) return out;
    const fd = fs.openSync(this.path, 'r');
    try {
      const got = fs.readSync(fd, out, 0, out.length, this.dataStart + t.begin);
      if (got !== out.length) throw tensorError(this.path, name, `read ${got} of ${out.length} bytes (file changed underneath?)`);
    } finally {
      fs.closeSync(fd);
    }
    return out;
  }

  /** Any numeric tensor as float64 values (row-major). */
  loadFloat64(name: string): Float64Array {
    return bytesToFloat64(this.info(name).dtype, this.loadBytes(name));
  }
}

/** Tensors of an HF checkpoint directory (model.safetensors or the sharded index): name -> [file, info]. */
export function openCheckpointTensors(dir: string): Map<string, { file: SafetensorsFile; info: TensorInfo }> {
  const single = path.join(dir, 'model.safetensors');
  const indexPath = path.join(dir, 'model.safetensors.index.json');
  const out = new Map<string, { file: SafetensorsFile; info: TensorInfo }>();
  if (fs.existsSync(single)) {
    const file = SafetensorsFile.open(single);
    for (const [name, info] of [...file.tensors.entries()].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0))) {
      out.set(name, { file, info });
    }
    return out;
  }
  if (!fs.existsSync(indexPath)) throw fileError(dir, 'no model.safetensors or model.safetensors.index.json in this directory');
  let index: unknown;
  try {
    index = JSON.parse(fs.readFileSync(indexPath, 'utf8'));
  } catch (e) {
    throw fileError(indexPath, `not valid JSON (${(e as Error).message})`);
  }
  const weightMap = (index as { weight_map?: unknown } | null)?.weight_map;
  if (weightMap === null || typeof weightMap !== 'object' || Array.isArray(weightMap)) {
    throw fileError(indexPath, 'missing object field "weight_map"');
  }
  const shards = new Map<string, SafetensorsFile>();
  for (const name of Object.keys(weightMap).sort()) {
    const shard = (weightMap as Record<string, unknown>)[name];
    if (typeof shard !== 'string') throw fileError(indexPath, `weight_map entry for ${JSON.stringify(name)} is not a file name string`);
    if (shard === '' || shard.includes('/') || shard.includes('\\') || shard === '.' || shard === '..') {
      throw fileError(indexPath, `weight_map entry for ${JSON.stringify(name)} names ${JSON.stringify(shard)}, which is not a plain file name in the checkpoint directory`);
    }
    let file = shards.get(shard);
    if (!file) {
      file = SafetensorsFile.open(path.join(dir, shard));
      shards.set(shard, file);
    }
    const info = file.tensors.get(name);
    if (!info) throw fileError(indexPath, `weight_map puts tensor ${JSON.stringify(name)} in ${JSON.stringify(shard)}, which does not contain it`);
    out.set(name, { file, info });
  }
  return out;
}

// ------------------------------------------------------------ writer
/** One tensor to write: its bytes now, or a function producing them when their turn comes (keeps memory flat). */
export interface TensorToWrite {
  name: string;
  dtype: SafetensorsDType;
  shape: readonly number[];
  data: Buffer | (() => Buffer);
}

/** Header bytes (padded with spaces to a multiple of 8) for tensors sorted by name. */
function buildHeader(file: string, tensors: readonly TensorToWrite[], metadata: Record<string, string>): { header: Buffer; sorted: TensorToWrite[] } {
  const sorted = [...tensors].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const root: Record<string, unknown> = {};
  if (Object.keys(metadata).length > 0) {
    const meta: Record<string, string> = {};
    for (const k of Object.keys(metadata).sort()) {
      const v = metadata[k];
      if (typeof v !== 'string') throw fileError(file, `metadata value for ${JSON.stringify(k)} must be a string`);
      meta[k] = v;
    }
    root.__metadata__ = meta;
  }
  let offset = 0;
  for (let i = 0; i < sorted.length; i++) {
    const t = sorted[i]!;
    if (t.name === '' || t.name === '__metadata__') throw fileError(file, `cannot save a tensor named ${JSON.stringify(t.name)}`);
    if (i > 0 && sorted[i - 1]!.name === t.name) throw tensorError(file, t.name, 'given twice');
    if (!isDType(t.dtype)) throw tensorError(file, t.name, `unknown dtype ${JSON.stringify(t.dtype)} (known: ${KNOWN_DTYPES})`);
    if (!t.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) throw tensorError(file, t.name, `shape ${JSON.stringify(t.shape)} must hold non-negative integers`);
    const bytes = t.shape.reduce((a, d) => a * d, DTYPE_SIZES[t.dtype]);
    root[t.name] = { dtype: t.dtype, shape: [...t.shape], data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let text = JSON.stringify(root);
  const len = Buffer.byteLength(text, 'utf8');
  text += ' '.repeat((8 - (len % 8)) % 8);
  return { header: Buffer.from(text, 'utf8'), sorted };
}

/**
 * Writes tensors as one safetensors file, atomically: to `file.tmp-<pid>`,
 * fsync, rename over `file`. Each tensor's byte length is checked against
 * its dtype and shape before anything lands in place.
 */
export function writeSafetensors(file: string, tensors: readonly TensorToWrite[], metadata: Record<string, string> = {}): void {
  const { header, sorted } = buildHeader(file, tensors, metadata);
  const tmp = `${file}.tmp-${process.pid}`;
  const fd = fs.openSync(tmp, 'w', 0o644);
  try {
    const prefix = Buffer.alloc(8);
    prefix.writeBigUInt64LE(BigInt(header.length), 0);
    fs.writeSync(fd, prefix);
    fs.writeSync(fd, header);
    for (const t of sorted) {
      const data = typeof t.data === 'function' ? t.data() : t.data;
      const want = t.shape.reduce((a, d) => a * d, DTYPE_SIZES[t.dtype]);
      if (data.length !== want) {
        throw tensorError(file, t.name, `has ${data.length} bytes but dtype ${t.dtype} and shape ${JSON.stringify(t.shape)} need ${want}`);
      }
      let written = 0;
      while (written < data.length) written += fs.writeSync(fd, data, written, data.length - written);
    }
    fs.fsyncSync(fd);
    fs.closeSync(fd);
  } catch (e) {
    try {
      fs.closeSync(fd);
    } catch {
      /* already closed */
    }
    fs.rmSync(tmp, { force: true });
    throw e;
  }
  fs.renameSync(tmp, file);
}
