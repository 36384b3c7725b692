// Raw row readers: parquet (hyparquet, with zstd/gzip/brotli/lz4 from
// hyparquet-compressors) and JSONL, each returning plain objects per row.
import * as fs from 'fs';
import { decompress as decompressZstd } from 'fzstd';
import { parquetReadObjects, type Compressors } from 'hyparquet';
import { decompressBrotli } from 'hyparquet-compressors/src/brotli.js';
import { gunzip } from 'hyparquet-compressors/src/gzip.js';
import { decompressLz4, decompressLz4Raw } from 'hyparquet-compressors/src/lz4.js';
import { ArpoError } from '../errors';

/**
 * hyparquet-compressors' codec table, assembled from its modules: its index
 * also loads hysnappy (wasm, ESM) which Jest cannot require; SNAPPY falls back
 * to hyparquet's built-in pure-JS decoder, which gives the same bytes.
 */
const compressors: Compressors = {
  GZIP: (input, length) => gunzip(input, new Uint8Array(length)),
  BROTLI: decompressBrotli,
  ZSTD: (input) => decompressZstd(input),
  LZ4: decompressLz4,
  LZ4_RAW: decompressLz4Raw,
};

/** A raw row, or the reason it could not be read (a JSONL line that is not JSON). */
export type RawRow = { readonly ok: true; readonly value: unknown } | { readonly ok: false; readonly field: string; readonly message: string };

function readBytes(file: string): Buffer {
  try {
    return fs.readFileSync(file);
  } catch (e) {
    throw new ArpoError('BAD_DATA', `Cannot read dataset ${file}: ${(e as Error).message}`, { cause: e });
  }
}

/** Every row of a parquet file as an object (nested lists and structs assembled). */
export async function readParquetRows(file: string): Promise<RawRow[]> {
  const buf = readBytes(file);
  const bytes = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength) as ArrayBuffer;
  let rows: Record<string, unknown>[];
  try {
    rows = await parquetReadObjects({ file: bytes, compressors });
  } catch (e) {
    throw new ArpoError('BAD_DATA', `Cannot parse parquet file ${file}: ${(e as Error).message}`, { cause: e });
  }
  return rows.map((value) => ({ ok: true, value }));
}

/** Every non-blank line of a JSONL file, parsed (a bad line is a per-row failure, not a throw). */
export function readJsonlRows(file: string): RawRow[] {
  const text = readBytes(file).toString('utf8');
  const out: RawRow[] = [];
  for (const line of text.split(/\r?\n/)) {
    if (line.trim().length === 0) continue;
    try {
      out.push({ ok: true, value: JSON.parse(line) as unknown });
    } catch (e) {
      out.push({ ok: false, field: '(json)', message: `not valid JSON: ${(e as Error).message}` });
    }
  }
  return out;
}
