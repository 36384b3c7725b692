// lib/model/safetensors.ts: exact bytes against a hand-built reference file,
// round trips, float conversions against known IEEE bit patterns, sharded
// checkpoints, and every malformed header -> an error naming file and tensor.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import {
  bf16BitsToFloat32,
  bytesToFloat64,
  f16BitsToFloat,
  float32ToBf16Bits,
  float64ToBytes,
  floatToF16Bits,
  openCheckpointTensors,
  SafetensorsFile,
  writeSafetensors,
  type SafetensorsDType,
} from '../../lib/model/safetensors';

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-st-ts-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

function u64le(n: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(BigInt(n));
  return b;
}
function makeFile(name: string, header: string, data: Buffer = Buffer.alloc(0)): string {
  const file = path.join(dir, name);
  fs.writeFileSync(file, Buffer.concat([u64le(Buffer.byteLength(header)), Buffer.from(header), data]));
  return file;
}

describe('writer', () => {
  test('bytes equal the hand-built reference layout (metadata first, names sorted, space padding)', () => {
    const file = path.join(dir, 'exact.safetensors');
    writeSafetensors(
      file,
      [
        { name: 'b', dtype: 'F32', shape: [2], data: float64ToBytes('F32', [1.0, -2.5]) },
        { name: 'a', dtype: 'I64', shape: [1], data: () => float64ToBytes('I64', [7]) },
      ],
      { format: 'pt' },
    );
    let header =
      '{"__metadata__":{"format":"pt"},"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},' +
      '"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}';
    header += ' '.repeat((8 - (header.length % 8)) % 8);
    const data = Buffer.from([7, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0]);
    expect(fs.readFileSync(file).equals(Buffer.concat([u64le(header.length), Buffer.from(header), data]))).toBe(true);
    expect(fs.readdirSync(dir).filter((f) => f.includes('.tmp-'))).toEqual([]);
  });

  test('round trip of every dtype is bit-identical, and re-saving reproduces the file', () => {
    const dtypes: Array<[SafetensorsDType, number[]]> = [
      ['F64', [Math.PI, -1e300, 0]],
      ['F32', [0.1, -3.5, 1e-30]],
      ['BF16', [1, -2.5, 0.1]],
      ['F16', [1, -2, 0.1, 65504]],
      ['I64', [-(2 ** 40), 5, 2 ** 52]],
      ['I32', [-7, 2 ** 31 - 1]],
      ['I16', [-300, 300]],
      ['I8', [-128, 127]],
      ['U8', [0, 255]],
      ['BOOL', [0, 1, 1]],
    ];
    const file = path.join(dir, 'rt.safetensors');
    const tensors = dtypes.map(([dtype, values]) => ({ name: `t.${dtype}`, dtype, shape: [values.length], data: float64ToBytes(dtype, values) }));
    tensors.push({ name: 'empty', dtype: 'F32', shape: [0, 3], data: Buffer.alloc(0) });
    tensors.push({ name: 'scalar', dtype: 'F32', shape: [], data: float64ToBytes('F32', [2.25]) });
    writeSafetensors(file, tensors, { k: 'v' });
    const f = SafetensorsFile.open(file);
    expect(f.metadata).toEqual({ k: 'v' });
    for (const t of tensors) {
      expect(f.info(t.name).shape).toEqual(t.shape);
      expect(f.loadBytes(t.name).equals(t.data)).toBe(true);
    }
    expect(Array.from(f.loadFloat64('t.I64'))).toEqual([-(2 ** 40), 5, 2 ** 52]);
    expect(Array.from(f.loadFloat64('t.F64'))).toEqual([Math.PI, -1e300, 0]);
    expect(Array.from(f.loadFloat64('scalar'))).toEqual([2.25]);
    const again = path.join(dir, 'rt2.safetensors');
    writeSafetensors(
      again,
      [...f.tensors.entries()].map(([name, info]) => ({ name, dtype: info.dtype, shape: info.shape, data: f.loadBytes(name) })),
      f.metadata,
    );
    expect(fs.readFileSync(again).equals(fs.readFileSync(file))).toBe(true);
    expect(fs.readFileSync(file).readBigUInt64LE(0) % 8n).toBe(0n);
  });

  test('rejects bad input and leaves nothing behind', () => {
    const file = path.join(dir, 'bad-write.safetensors');
    expect(() => writeSafetensors(file, [{ name: 'x', dtype: 'F32', shape: [3], data: Buffer.alloc(8) }])).toThrow(
      `${file}: tensor "x": has 8 bytes but dtype F32 and shape [3] need 12`,
    );
    expect(() =>
      writeSafetensors(file, [
        { name: 'x', dtype: 'F32', shape: [1], data: Buffer.alloc(4) },
        { name: 'x', dtype: 'F32', shape: [1], data: Buffer.alloc(4) },
      ]),
    ).toThrow('tensor "x": given twice');
    expect(() => writeSafetensors(file, [{ name: '__metadata__', dtype: 'F32', shape: [1], data: Buffer.alloc(4) }])).toThrow('cannot save a tensor named "__metadata__"');
    expect(() => writeSafetensors(file, [{ name: 'x', dtype: 'F8' as SafetensorsDType, shape: [1], data: Buffer.alloc(1) }])).toThrow('unknown dtype "F8"');
    expect(fs.existsSync(file)).toBe(false);
    expect(fs.readdirSync(dir).filter((f) => f.includes('.tmp-'))).toEqual([]);
  });
});

describe('float conversions', () => {
  test('bfloat16: round to nearest even, known bit patterns', () => {
    expect(float32ToBf16Bits(1)).toBe(0x3f80);
    expect(float32ToBf16Bits(-2.5)).toBe(0xc020);
    expect(float32ToBf16Bits(1 + 2 ** -8)).toBe(0x3f80); // tie -> even (down)
    expect(float32ToBf16Bits(1 + 3 * 2 ** -8)).toBe(0x3f82); // tie -> even (up)
    expect(float32ToBf16Bits(1 + 2 ** -8 + 2 ** -20)).toBe(0x3f81); // above the tie
    expect(float32ToBf16Bits(Infinity)).toBe(0x7f80);
    expect(Number.isNaN(bf16BitsToFloat32(float32ToBf16Bits(NaN)))).toBe(true);
    expect(bf16BitsToFloat32(0x3f81)).toBe(1 + 2 ** -7);
    // Every bf16 value survives bits -> float -> bits.
    const bad: number[] = [];
    for (let b = 0; b < 0x10000; b++) {
      const x = bf16BitsToFloat32(b);
      if (!Number.isNaN(x) && float32ToBf16Bits(x) !== b) bad.push(b);
    }
    expect(bad.slice(0, 5)).toEqual([]);
  });

  test('float16: known bit patterns, subnormals, overflow, exhaustive round trip', () => {
    expect(floatToF16Bits(1)).toBe(0x3c00);
    expect(floatToF16Bits(-2)).toBe(0xc000);
    expect(floatToF16Bits(65504)).toBe(0x7bff);
    expect(floatToF16Bits(65520)).toBe(0x7c00);
    expect(floatToF16Bits(2 ** -24)).toBe(0x0001);
    expect(floatToF16Bits(0.1)).toBe(0x2e66);
    expect(floatToF16Bits(1 + 2 ** -11)).toBe(0x3c00); // tie -> even
    expect(floatToF16Bits(1 + 3 * 2 ** -11)).toBe(0x3c02);
    expect(f16BitsToFloat(0x3555)).toBeCloseTo(1 / 3, 3);
    const bad: number[] = [];
    for (let h = 0; h < 0x10000; h++) {
      const x = f16BitsToFloat(h);
      if (!Number.isNaN(x) && floatToF16Bits(x) !== h) bad.push(h);
    }
    expect(bad.slice(0, 5)).toEqual([]);
  });

  test('typed-array fast paths agree with the scalar conversions (random bit patterns, ties, NaN, misaligned buffers)', () => {
    const rng = new Uint32Array(1 << 16);
    let state = 12345;
    for (let i = 0; i < rng.length; i++) {
      state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
      rng[i] = state;
    }
    rng[0] = 0x3f808000; // exact tie, even below
    rng[1] = 0x3f818000; // exact tie, odd below
    rng[2] = 0x7fc00001; // NaN
    rng[3] = 0xff800000; // -inf
    const values = new Float32Array(rng.buffer);
    const fast = float64ToBytes('BF16', values);
    const bad: number[] = [];
    for (let i = 0; i < values.length; i++) {
      if (fast.readUInt16LE(2 * i) !== float32ToBf16Bits(values[i]!)) bad.push(i);
    }
    expect(bad.slice(0, 5)).toEqual([]);
    // Decoding from a buffer at an odd offset (not 4-byte aligned) reads the same values.
    const f32 = float64ToBytes('F32', [1.5, -2.25, 1e-7]);
    const odd = Buffer.alloc(f32.length + 1);
    f32.copy(odd, 1);
    expect(Array.from(bytesToFloat64('F32', odd.subarray(1)))).toEqual([1.5, -2.25, Math.fround(1e-7)]);
    const bf = float64ToBytes('BF16', [1, -3]);
    const oddBf = Buffer.alloc(bf.length + 1);
    bf.copy(oddBf, 1);
    expect(Array.from(bytesToFloat64('BF16', oddBf.subarray(1)))).toEqual([1, -3]);
  });

  test('bytesToFloat64 of BF16 matches the bit-level decode', () => {
    const bytes = float64ToBytes('BF16', [0.1, -7, 3.14159]);
    expect(Array.from(bytesToFloat64('BF16', bytes))).toEqual([bf16BitsToFloat32(0x3dcd), -7, bf16BitsToFloat32(0x4049)]);
  });
});

describe('reader validation', () => {
  const good = '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}';
  const data8 = Buffer.alloc(8, 1);
  const cases: Array<[string, () => string, string]> = [
    ['file shorter than 8 bytes', () => (fs.writeFileSync(path.join(dir, 'short.st'), 'abc'), path.join(dir, 'short.st')), 'too short for the 8-byte header length'],
    ['header length beyond the file', () => {
      const f = path.join(dir, 'trunc-header.st');
      fs.writeFileSync(f, Buffer.concat([u64le(500), Buffer.from(good)]));
      return f;
    }, 'header length 500 exceeds'],
    ['header over 100 MB', () => {
      const f = path.join(dir, 'huge.st');
      fs.writeFileSync(f, Buffer.concat([u64le(200_000_000), Buffer.from(good)]));
      return f;
    }, 'exceeds the limit of 100000000 bytes'],
    ['truncated data', () => makeFile('trunc-data.st', good, data8.subarray(0, 5)), 'tensor "w": data_offsets [0, 8] exceed the data section of 5 bytes'],
    ['bad JSON', () => makeFile('badjson.st', '{"w": {"dtype": ', data8), 'header is not valid JSON'],
    ['array header', () => makeFile('arr.st', '[]'), "header does not start with '{'"],
    ['unknown dtype', () => makeFile('dtype.st', '{"w":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}}', data8), 'tensor "w": unknown dtype "F7"'],
    ['negative shape', () => makeFile('neg.st', '{"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', data8), 'tensor "w": shape [-2] must hold non-negative integers'],
    ['wrong byte length', () => makeFile('len.st', '{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', data8), 'tensor "w": data_offsets [0, 8] hold 8 bytes but dtype F32 and shape [3] need 12'],
    ['reversed offsets', () => makeFile('rev.st', '{"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}', data8), 'end before they begin'],
    ['offsets of the wrong arity', () => makeFile('arity.st', '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}}', data8), '"data_offsets" must be [begin, end]'],
    ['missing dtype', () => makeFile('nodtype.st', '{"w":{"shape":[2],"data_offsets":[0,8]}}', data8), 'missing string field "dtype"'],
    ['overlap', () => makeFile('overlap.st', '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', data8), 'tensor "b": data_offsets [4, 8] overlap tensor "a" at [0, 8]'],
    ['metadata not strings', () => makeFile('meta.st', '{"__metadata__":{"n":1}}'), '"__metadata__" value for "n" is a number'],
    ['missing file', () => path.join(dir, 'nope.st'), 'open failed'],
  ];
  test.each(cases)('%s', (_what, make, message) => {
    const file = make();
    let err: unknown;
    try {
      SafetensorsFile.open(file);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toContain(`${file}: `);
    expect((err as Error).message).toContain(message);
    expect((err as { code?: string }).code).toBe('BAD_CHECKPOINT');
  });

  test('gaps between tensors are allowed; absent tensors are named', () => {
    const file = makeFile(
      'gap.st',
      '{"a":{"dtype":"U8","shape":[2],"data_offsets":[6,8]},"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}',
      Buffer.from([1, 2, 9, 9, 9, 9, 3, 4]),
    );
    const f = SafetensorsFile.open(file);
    expect(Array.from(f.loadFloat64('a'))).toEqual([3, 4]);
    expect(Array.from(f.loadFloat64('b'))).toEqual([1, 2]);
    expect(() => f.loadBytes('zz')).toThrow(`${file}: tensor "zz": not in this file`);
  });
});

describe('checkpoint directories', () => {
  test('single file and sharded index give the same tensors; index errors are named', () => {
    const single = path.join(dir, 'single');
    const sharded = path.join(dir, 'sharded');
    fs.mkdirSync(single);
    fs.mkdirSync(sharded);
    const a = { name: 'a', dtype: 'F32' as const, shape: [2], data: float64ToBytes('F32', [1, 2]) };
    const b = { name: 'b', dtype: 'BF16' as const, shape: [1], data: float64ToBytes('BF16', [3]) };
    writeSafetensors(path.join(single, 'model.safetensors'), [b, a]);
    writeSafetensors(path.join(sharded, 'model-00001-of-00002.safetensors'), [a]);
    writeSafetensors(path.join(sharded, 'model-00002-of-00002.safetensors'), [b]);
    const index = path.join(sharded, 'model.safetensors.index.json');
    fs.writeFileSync(index, JSON.stringify({ metadata: {}, weight_map: { b: 'model-00002-of-00002.safetensors', a: 'model-00001-of-00002.safetensors' } }));
    for (const d of [single, sharded]) {
      const t = openCheckpointTensors(d);
      expect([...t.keys()]).toEqual(['a', 'b']);
      expect(Array.from(t.get('a')!.file.loadFloat64('a'))).toEqual([1, 2]);
      expect(Array.from(t.get('b')!.file.loadFloat64('b'))).toEqual([3]);
    }
    fs.writeFileSync(index, JSON.stringify({ weight_map: { b: 'model-00001-of-00002.safetensors' } }));
    expect(() => openCheckpointTensors(sharded)).toThrow('weight_map puts tensor "b" in "model-00001-of-00002.safetensors", which does not contain it');
    fs.writeFileSync(index, JSON.stringify({ weight_map: { b: '../single/model.safetensors' } }));
    expect(() => openCheckpointTensors(sharded)).toThrow('not a plain file name');
    fs.writeFileSync(index, '{"weights": {}}');
    expect(() => openCheckpointTensors(sharded)).toThrow('missing object field "weight_map"');
    expect(() => openCheckpointTensors(path.join(dir, 'nothing'))).toThrow('no model.safetensors or model.safetensors.index.json');
  });
});
