// Seeded mutators for the parser fuzzers: byte edits (bit flips, truncations,
// insertions, length fields), JSON value edits (huge counts, NaN/Inf, wrong
// types, deep nesting, missing keys) and JSON text edits (duplicate keys,
// broken tokens). Every choice comes from one counter-based stream, so a case
// is replayed from (seed, index) alone. The generator is the demo world's
// mulberry32 (lib/envs/demo/rng.ts).
import { Rng } from '../../lib/envs/demo/rng';

/** The stream of case `index` of a run seeded with `seed`. */
export function caseRng(seed: number, index: number): Rng {
  return new Rng(Math.imul(seed ^ 0x9e3779b9, 0x85ebca6b) ^ Math.imul(index + 1, 0xc2b2ae35));
}

const INTERESTING_BYTES = [0x00, 0x01, 0x7f, 0x80, 0xff, 0x22, 0x5c, 0x7b, 0x7d, 0x5b, 0x5d, 0x2c, 0x3a];

/** One to four random byte-level edits of `buf` (a new buffer). */
export function mutateBytes(rng: Rng, buf: Buffer): Buffer {
  let b = Buffer.from(buf);
  const edits = 1 + rng.int(0, 3);
  for (let e = 0; e < edits; e++) {
    const at = b.length === 0 ? 0 : rng.int(0, b.length - 1);
    switch (rng.int(0, 6)) {
      case 0: // bit flip
        if (b.length > 0) b[at] = (b[at] as number) ^ (1 << rng.int(0, 7));
        break;
      case 1: // interesting byte
        if (b.length > 0) b[at] = rng.pick(INTERESTING_BYTES);
        break;
      case 2: // truncate
        b = b.subarray(0, at);
        break;
      case 3: {
        // insert random bytes
        const n = 1 + rng.int(0, 15);
        const ins = Buffer.alloc(n);
        for (let i = 0; i < n; i++) ins[i] = rng.int(0, 255);
        b = Buffer.concat([b.subarray(0, at), ins, b.subarray(at)]);
        break;
      }
      case 4: // delete a range
        b = Buffer.concat([b.subarray(0, at), b.subarray(Math.min(b.length, at + 1 + rng.int(0, 31)))]);
        break;
      case 5: {
        // duplicate a range
        const end = Math.min(b.length, at + 1 + rng.int(0, 63));
        b = Buffer.concat([b.subarray(0, end), b.subarray(at, end), b.subarray(end)]);
        break;
      }
      default: // a random 8-byte little-endian integer somewhere (lengths, counts)
        if (b.length >= 8) b.writeBigUInt64LE(rng.pick([0n, 1n, 7n, 0xffffffffn, 0x7fffffffffffffffn, 0xffffffffffffffffn, BigInt(rng.int(0, (1 << 30) - 1))]), rng.int(0, b.length - 8));
    }
  }
  return b;
}

/** Values a parser must refuse or handle: huge, negative, fractional, non-finite, wrong types, deep. */
export function interestingValue(rng: Rng): unknown {
  const deep = (n: number): unknown => {
    let v: unknown = 1;
    for (let i = 0; i < n; i++) v = rng.next() < 0.5 ? [v] : { a: v };
    return v;
  };
  return rng.pick<() => unknown>([
    () => 0, () => -1, () => 1.5, () => 2 ** 53, () => 2 ** 64, () => 1e308, () => -1e308, () => NaN, () => Infinity, () => -Infinity,
    () => '', () => 'x'.repeat(1 + rng.int(0, 4999)), () => '\u0000', () => '\ud800', () => 'NaN', () => '-1', () => '1e999',
    () => null, () => true, () => false, () => [], () => {}, () => [1, 2, 3], () => ({ x: 1 }), () => deep(2 + rng.int(0, 39)), () => deep(2000),
    () => [2 ** 31, 2 ** 31], () => [-1], () => ['a'],
  ])();
}

type Json = unknown;

/** Paths to every node of `v` (arrays and objects descended). */
function nodePaths(v: Json, prefix: Array<string | number> = [], out: Array<Array<string | number>> = []): Array<Array<string | number>> {
  out.push(prefix);
  if (out.length > 5000) return out;
  if (Array.isArray(v)) v.forEach((x, i) => nodePaths(x, [...prefix, i], out));
  else if (v !== null && typeof v === 'object') for (const [k, x] of Object.entries(v)) nodePaths(x, [...prefix, k], out);
  return out;
}

/** One to three edits of a JSON-like value (a deep copy; `structuredClone` keeps NaN and Infinity out of it). */
export function mutateJson(rng: Rng, value: Json): Json {
  let root = JSON.parse(JSON.stringify(value)) as Json;
  const edits = 1 + rng.int(0, 2);
  for (let e = 0; e < edits; e++) {
    const paths = nodePaths(root);
    const p = rng.pick(paths);
    if (p.length === 0) {
      if (rng.next() < 0.1) root = interestingValue(rng);
      continue;
    }
    const parent = p.slice(0, -1).reduce<Json>((o, k) => (o as Record<string | number, Json>)[k], root) as Record<string | number, Json> | Json[];
    const key = p[p.length - 1] as string | number;
    const cur = (parent as Record<string | number, Json>)[key];
    switch (rng.int(0, 4)) {
      case 0: // delete
        if (Array.isArray(parent)) parent.splice(key as number, 1);
        else delete (parent as Record<string, Json>)[key as string];
        break;
      case 1: // wrong type of the same "size"
        (parent as Record<string | number, Json>)[key] = typeof cur === 'number' ? String(cur) : typeof cur === 'string' ? cur.length : Array.isArray(cur) ? { ...cur } : cur === null ? 0 : [cur];
        break;
      case 2: // numeric edge of a number, else an interesting value
        (parent as Record<string | number, Json>)[key] = typeof cur === 'number' ? rng.pick([cur + 1, cur - 1, -cur, cur * 1e9, cur + 0.5, NaN, Infinity, 0]) : interestingValue(rng);
        break;
      case 3: // a new key beside it
        if (!Array.isArray(parent)) (parent as Record<string, Json>)[rng.pick(['__proto__', 'constructor', 'extra', String(key).toUpperCase(), `${String(key)}_`])] = interestingValue(rng);
        else parent.push(interestingValue(rng));
        break;
      default:
        (parent as Record<string | number, Json>)[key] = interestingValue(rng);
    }
  }
  return root;
}

/** JSON text of `value` with text-level edits: duplicate keys, bare NaN/Infinity, cut tokens, deep brackets. */
export function mutateJsonText(rng: Rng, value: Json): string {
  let s = JSON.stringify(mutateJson(rng, value)) ?? 'null';
  const op = rng.int(0, 5);
  if (op === 0) {
    // duplicate the first key of some object with another value
    const m = [...s.matchAll(/\{"([^"\\]*)":/g)];
    if (m.length > 0) {
      const hit = rng.pick(m);
      const at = (hit.index as number) + 1;
      s = `${s.slice(0, at)}"${hit[1]}":${JSON.stringify(interestingValue(rng)) ?? '1'},${s.slice(at)}`;
    }
  } else if (op === 1) {
    s = s.replace(/\d+(\.\d+)?/, rng.pick(['NaN', 'Infinity', '-Infinity', '1e999', '-0', '00', '0x10']));
  } else if (op === 2) {
    s = s.slice(0, rng.int(0, s.length));
  } else if (op === 3) {
    const n = 100 + rng.int(0, 19999);
    s = `${'['.repeat(n)}${']'.repeat(rng.next() < 0.5 ? n : n - 1)}`;
  } else if (op === 4) {
    s = mutateBytes(rng, Buffer.from(s, 'utf8')).toString('utf8');
  }
  return s;
}
