// The native PolicyModel's logits against the float64 reference forward
// (test/model/reference.ts) for tiny random qwen2 / qwen3 / llama checkpoints
// made by initModel: the packed cache-free forward, the paged-KV-cache path
// (prefill, decode, fork) and a bfloat16 checkpoint loaded into float32.
// Needs the full addon (ARPO_ADDON=/path/arpo.node); FAILS when it lacks libtorch.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { initModel, NormalSampler } from '../../lib/cli/init-model';
import { tinyConfig, type ModelType } from '../../lib/model/checkpoint';
import { PolicyModel } from '../../lib/model/policy-model';
import { SafetensorsFile, float64ToBytes, writeSafetensors } from '../../lib/model/safetensors';
import { hasTorch } from '../../lib/native/loader';
import { loadReferenceModel, referenceForward } from './reference';

const TYPES: readonly ModelType[] = ['qwen2', 'qwen3', 'llama'];
let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-fwd-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

/** max |got - ref| / max |ref| over all entries (llm.c-style scale-aware error; elementwise ratios blow up near 0). */
function relativeError(got: ArrayLike<number>, ref: ArrayLike<number>): number {
  expect(got.length).toBe(ref.length);
  let num = 0;
  let den = 0;
  for (let i = 0; i < ref.length; i++) {
    num = Math.max(num, Math.abs(got[i]! - ref[i]!));
    den = Math.max(den, Math.abs(ref[i]!));
  }
  return num / den;
}

/**
 * A tiny checkpoint whose norms and biases are random too (initModel makes
 * them 1 and 0, which would hide a missing or misplaced norm/bias), with a
 * larger init std so attention is far from uniform.
 */
async function makeModel(type: ModelType, name: string, dtype: 'float32' | 'bfloat16' = 'float32'): Promise<string> {
  const out = path.join(dir, name);
  const config = tinyConfig(type, type === 'llama' ? { attention_bias: true, mlp_bias: true } : {});
  await initModel({ config: { ...config, initializer_range: 0.25 }, out, seed: 2024, dtype });
  const file = path.join(out, 'model.safetensors');
  const f = SafetensorsFile.open(file);
  const rng = new NormalSampler(99n, name);
  const tensors = [...f.tensors.entries()].map(([tensor, info]) => {
    const values = f.loadFloat64(tensor);
    if (tensor.endsWith('norm.weight')) for (let i = 0; i < values.length; i++) values[i] = 1 + 0.3 * rng.nextNormal();
    if (tensor.endsWith('.bias')) for (let i = 0; i < values.length; i++) values[i] = 0.2 * rng.nextNormal();
    return { name: tensor, dtype: info.dtype, shape: info.shape, data: float64ToBytes(info.dtype, values) };
  });
  writeSafetensors(file, tensors, { format: 'pt' });
  return out;
}

const SEQUENCES = [
  [1, 17, 42, 5, 88, 23, 23, 60, 3, 91, 14, 7],
  [2, 95, 0, 33],
  [70],
];

test('the loaded addon has the libtorch model layer', () => {
  if (!hasTorch()) {
    throw new Error(
      'The loaded arpo addon was built without libtorch (hasTorch() is false), so the native forward cannot be checked. ' +
        'Build the full addon (npx cmake-js compile -O <dir>) and run with ARPO_ADDON=<dir>/Release/arpo.node.',
    );
  }
});

describe.each(TYPES)('%s', (type) => {
  let ckpt: string;
  beforeAll(async () => {
    ckpt = await makeModel(type, `${type}-f32`);
  });

  test('packed forward (float32 and float64) matches the float64 reference', async () => {
    const ref = loadReferenceModel(ckpt);
    const expected = SEQUENCES.map((ids) => referenceForward(ref, ids));
    const packedRef = Float64Array.from(expected.flatMap((e) => Array.from(e)));
    // forwardLogits returns float32, so even a float64 model is only exact to
    // float32 rounding of the output (half an ulp: 6e-8 relative).
    for (const [dtype, tol] of [['float32', 1e-4], ['float64', 1.5e-7]] as const) {
      const model = await PolicyModel.load(ckpt, { dtype, threads: 1 });
      try {
        const got = await model.forwardLogits(SEQUENCES.map((s) => Int32Array.from(s)));
        const err = relativeError(got, packedRef);
        if (process.env.ARPO_VERBOSE) process.stdout.write(`${type} ${dtype}: relative error ${err.toExponential(2)}\n`);
        expect({ dtype, err, ok: err < tol }).toEqual({ dtype, err, ok: true });
      } finally {
        model.dispose();
      }
    }
  });

  test('KV-cache path: prefill, one-token decode and a fork give the reference last-position logits', async () => {
    const ref = loadReferenceModel(ckpt);
    const V = ref.config.vocabSize;
    const ids = SEQUENCES[0]!;
    const refRows = referenceForward(ref, ids);
    const row = (t: number): Float64Array => refRows.subarray(t * V, (t + 1) * V);
    const model = await PolicyModel.load(ckpt, { dtype: 'float32', threads: 1, blockSize: 4 });
    try {
      const p = model.newPath(1);
      // Prefill 7 tokens (spans two 4-token blocks), then decode the rest one at a time.
      let got = await model.extendLogits([p], [Int32Array.from(ids.slice(0, 7))]);
      expect(relativeError(got, row(6))).toBeLessThan(1e-4);
      for (let t = 7; t < ids.length; t++) {
        got = await model.extendLogits([p], [Int32Array.of(ids[t]!)]);
        expect(relativeError(got, row(t))).toBeLessThan(1e-4);
      }
      // Fork after 5 tokens (inside a block) and continue with other tokens.
      const q = model.fork(p, 5, 2);
      const alt = [...ids.slice(0, 5), 50, 51];
      const altRef = referenceForward(ref, alt);
      got = await model.extendLogits([q], [Int32Array.of(50, 51)]);
      expect(relativeError(got, altRef.subarray(6 * V, 7 * V))).toBeLessThan(1e-4);
      // The parent path is untouched by the fork's writes.
      got = await model.extendLogits([p], [Int32Array.of(9)]);
      const longer = referenceForward(ref, [...ids, 9]);
      expect(relativeError(got, longer.subarray(ids.length * V))).toBeLessThan(1e-4);
    } finally {
      model.dispose();
    }
  });
});

test('native save (C++ safetensors writer) reads back in TS bit-identically; its bf16 rounding equals the TS one', async () => {
  const src = await makeModel('qwen2', 'qwen2-save');
  const model = await PolicyModel.load(src, { dtype: 'float32', threads: 1 });
  const f32Dir = path.join(dir, 'saved-f32');
  const bf16Dir = path.join(dir, 'saved-bf16');
  try {
    await model.save(f32Dir, { dtype: 'float32' });
    await model.save(bf16Dir, { dtype: 'bfloat16' });
  } finally {
    model.dispose();
  }
  const a = SafetensorsFile.open(path.join(src, 'model.safetensors'));
  const b = SafetensorsFile.open(path.join(f32Dir, 'model.safetensors'));
  const h = SafetensorsFile.open(path.join(bf16Dir, 'model.safetensors'));
  expect([...b.tensors.keys()].sort()).toEqual([...a.tensors.keys()].sort());
  for (const name of a.tensors.keys()) {
    expect({ name, same: b.loadBytes(name).equals(a.loadBytes(name)) }).toEqual({ name, same: true });
    expect({ name, same: h.loadBytes(name).equals(float64ToBytes('BF16', a.loadFloat64(name))) }).toEqual({ name, same: true });
  }
});

test('a bfloat16 checkpoint loaded as float32 matches the reference on the same bf16 values', async () => {
  const ckpt = await makeModel('qwen3', 'qwen3-bf16', 'bfloat16');
  expect(SafetensorsFile.open(path.join(ckpt, 'model.safetensors')).info('model.embed_tokens.weight').dtype).toBe('BF16');
  const ref = loadReferenceModel(ckpt);
  const model = await PolicyModel.load(ckpt, { dtype: 'float32', threads: 1 });
  try {
    const got = await model.forwardLogits([Int32Array.from(SEQUENCES[0]!)]);
    expect(relativeError(got, referenceForward(ref, SEQUENCES[0]!))).toBeLessThan(1e-4);
  } finally {
    model.dispose();
  }
});
