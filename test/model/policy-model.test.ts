// PolicyModel: HF checkpoints load into logits equal to the float64 TS
// reference forward (qwen2 / qwen3 / llama, every tensor random, biases and
// norms included), save/load round trips, argument errors, DISPOSED, native
// errors as NATIVE_OP_FAILED, and serialised concurrent calls.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { ArpoError } from '../../lib/errors';
import { expectedTensorShapes, parseModelConfig, tinyConfig, writeCheckpointDir } from '../../lib/model/checkpoint';
import { PolicyModel } from '../../lib/model/policy-model';
import { float64ToBytes, writeSafetensors } from '../../lib/model/safetensors';
import { loadReferenceModel, referenceForward } from './reference';

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-policy-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

/** Deterministic pseudo-random values in [-scale, scale] (mulberry32). */
function randomValues(n: number, seed: number, scale: number, offset = 0): number[] {
  let a = seed >>> 0;
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    out.push(offset + scale * (2 * (((t ^ (t >>> 14)) >>> 0) / 4294967296) - 1));
  }
  return out;
}

/** A checkpoint whose every tensor is random (norm weights around 1, biases nonzero). */
async function writeRandomCheckpoint(name: string, raw: Record<string, unknown>, dtype: 'F32' | 'BF16' = 'F32'): Promise<string> {
  const out = path.join(dir, name);
  const config = parseModelConfig(raw);
  await writeCheckpointDir(out, {
    config: raw,
    writeWeights: (staging) =>
      writeSafetensors(
        path.join(staging, 'model.safetensors'),
        expectedTensorShapes(config).map(([n, shape], i) => {
          const count = shape.reduce((a, b) => a * b, 1);
          const norm = n.endsWith('norm.weight');
          return { name: n, dtype, shape, data: float64ToBytes(dtype, randomValues(count, 1000 + i, norm ? 0.3 : 0.25, norm ? 1 : 0)) };
        }),
      ),
  });
  return out;
}

function maxRelErr(out: Float32Array, ref: Float64Array, atol: number): number {
  expect(out.length).toBe(ref.length);
  let worst = 0;
  for (let i = 0; i < ref.length; i++) worst = Math.max(worst, Math.abs(out[i]! - ref[i]!) / (atol + Math.abs(ref[i]!)));
  return worst;
}

const CONFIGS: Array<[string, Record<string, unknown>]> = [
  ['qwen2', tinyConfig('qwen2', { max_position_embeddings: 512 })],
  ['qwen3 (tied, head_dim 16)', tinyConfig('qwen3', { tie_word_embeddings: true, max_position_embeddings: 512 })],
  ['llama (llama3 rope, attention + mlp bias)', tinyConfig('llama', { attention_bias: true, mlp_bias: true, max_position_embeddings: 512 })],
  ['llama (linear rope)', tinyConfig('llama', { rope_scaling: { rope_type: 'linear', factor: 2 }, max_position_embeddings: 512 })],
];

test.each(CONFIGS)('%s: logits equal the float64 reference forward (f32: |d| < 1e-3 (1e-2 rms + |ref|); bf16: 5% relative L2)', async (_name, raw) => {
  const ckpt = await writeRandomCheckpoint(`ref-${_name.split(' ')[0]}-${Object.keys(raw).length}`, raw);
  const ref = loadReferenceModel(ckpt);
  const ids = Array.from({ length: 300 }, (_, t) => (t * 37 + 11) % 96); // > original_max_position_embeddings 256
  const expected = referenceForward(ref, ids);
  const model = await PolicyModel.load(ckpt, { threads: 1 });
  try {
    const logits = await model.forwardLogits([ids]);
    // Absolute floor: 1e-2 of the logits' RMS (float32 dot products err in proportion to the terms' scale, not to a
    // result near 0, and the error's size follows the BLAS kernel OpenBLAS picks for the CPU: 1.3e-3 at a floor of 1e-3).
    const rms = Math.sqrt(expected.reduce((a, x) => a + x * x, 0) / expected.length);
    expect(maxRelErr(logits, expected, 1e-2 * rms)).toBeLessThan(1e-3);
  } finally {
    model.dispose();
  }
  const bf = await PolicyModel.load(ckpt, { threads: 1, dtype: 'bfloat16' });
  try {
    const logits = await bf.forwardLogits([ids.slice(0, 40)]);
    let num = 0;
    let den = 0;
    for (let i = 0; i < logits.length; i++) {
      num += (logits[i]! - expected[i]!) ** 2;
      den += expected[i]! ** 2;
    }
    expect(Math.sqrt(num / den)).toBeLessThan(0.05);
  } finally {
    bf.dispose();
  }
}, 60000);

test('create -> save -> load reproduces the logits; bf16 save; optimizer.safetensors only once trained', async () => {
  const model = await PolicyModel.create(tinyConfig('qwen2'), { seed: 5, threads: 1 });
  const again = await PolicyModel.create(tinyConfig('qwen2'), { seed: 5, threads: 1 });
  const other = await PolicyModel.create(tinyConfig('qwen2'), { seed: 6, threads: 1 });
  const seq = [3, 1, 4, 1, 5, 9, 2, 6];
  const a = await model.forwardLogits([seq]);
  expect(await again.forwardLogits([seq])).toEqual(a);
  expect(await other.forwardLogits([seq])).not.toEqual(a);
  const out = path.join(dir, 'saved');
  await model.save(out);
  expect(fs.existsSync(path.join(out, 'model.safetensors'))).toBe(true);
  expect(fs.existsSync(path.join(out, 'optimizer.safetensors'))).toBe(false);
  const loaded = await PolicyModel.load(out, { threads: 1 });
  expect(await loaded.forwardLogits([seq])).toEqual(a);
  const outBf = path.join(dir, 'saved-bf16');
  await model.save(outBf, { dtype: 'bfloat16' });
  expect(JSON.parse(fs.readFileSync(path.join(outBf, 'config.json'), 'utf8')).torch_dtype).toBe('bfloat16');
  const fromBf = await PolicyModel.load(outBf, { threads: 1 });
  const b = await fromBf.forwardLogits([seq]);
  expect(maxRelErr(b, Float64Array.from(a), 0.05)).toBeLessThan(0.1);
  expect(b).not.toEqual(a); // really rounded to bf16
  for (const m of [model, again, other, loaded, fromBf]) m.dispose();
});

test('argument errors name the field and value before any native call', async () => {
  const model = await PolicyModel.create(tinyConfig('qwen3'), { threads: 1 });
  const p = model.newPath(0);
  await expect(model.extend([p], [Int32Array.of(96)], { temperature: 1, seed: 1 })).rejects.toThrow(
    'Expected a token id in [0, 96) for inputs[0][0] but received 96 of type number',
  );
  await expect(model.extend([p, p], [Int32Array.of(1), Int32Array.of(2)], { temperature: 1, seed: 1 })).rejects.toThrow(
    'Expected distinct path ids for paths[1] but received 0 of type number',
  );
  await expect(model.extend([p], [Int32Array.of(1)], { temperature: -1, seed: 1 })).rejects.toThrow(
    'Expected a finite number >= 0 (0 = greedy) for sampling.temperature but received -1 of type number',
  );
  expect(() => model.fork(42, 0, 1)).toThrow('Expected a live path id (from newPath or fork) for path but received 42 of type number');
  expect(() => model.fork(p, 1.5, 1)).toThrow('Expected an integer >= 0 for prefixLength but received 1.5 of type number');
  await expect(model.trainStep([[{ tokens: [1, 2, 3], mask: [0, 1] }]], { mode: 'sft' })).rejects.toThrow(
    'Expected an array of 3 numbers for microBatches[0][0].mask but received Array(2) of type array',
  );
  await expect(model.trainStep([[{ tokens: [1, 2], mask: [0, 1] }]], { optimizer: { schedule: 'step' as never } })).rejects.toThrow(
    'Expected one of constant, linear, cosine for optimizer.schedule but received "step" of type string',
  );
  await expect(PolicyModel.create(tinyConfig('qwen2'), { dtype: 'float16' as never })).rejects.toThrow(
    'Expected one of float32, bfloat16, float64 for options.dtype but received "float16" of type string',
  );
  await expect(PolicyModel.create(tinyConfig('qwen2', { num_key_value_heads: 3 }))).rejects.toMatchObject({ code: 'BAD_CONFIG' });
  model.dispose();
});

test('native failures reject as NATIVE_OP_FAILED naming the op; disposed models throw DISPOSED', async () => {
  const model = await PolicyModel.create(tinyConfig('qwen2'), { threads: 1, blockSize: 4, initialBlocks: 1, maxBlocks: 2 });
  const p = model.newPath(0);
  const err = await model.extend([p], [new Int32Array(9).fill(1)], { temperature: 0, seed: 0 }).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(ArpoError);
  expect((err as ArpoError).code).toBe('NATIVE_OP_FAILED');
  expect((err as ArpoError).message).toMatch(/^PolicyModel\.extend: KV cache exhausted: 2 blocks of 4 tokens/);
  expect((err as Error).stack).toContain('policy-model.test.ts'); // the caller's frame survives the async hop
  // The model still works after the failure.
  const ok = await model.extend([p], [new Int32Array(8).fill(1)], { temperature: 0, seed: 0 });
  expect(ok.tokens.length).toBe(1);
  const missing = await PolicyModel.load(path.join(dir, 'nowhere')).catch((e: unknown) => e);
  expect((missing as ArpoError).code).toBe('BAD_CHECKPOINT');
  model.dispose();
  expect(model.disposed).toBe(true);
  expect(() => model.newPath(1)).toThrow(expect.objectContaining({ code: 'DISPOSED', message: 'PolicyModel.newPath: the model was disposed' }));
  await expect(model.logprobs([[1, 2]])).rejects.toMatchObject({ code: 'DISPOSED' });
});

test('a checkpoint with a wrongly shaped tensor fails naming the tensor and both shapes', async () => {
  const raw = tinyConfig('qwen2');
  const ckpt = await writeRandomCheckpoint('bad-shape', raw);
  const wrong = { ...raw, intermediate_size: 48 };
  fs.writeFileSync(path.join(ckpt, 'config.json'), JSON.stringify(wrong));
  const err = (await PolicyModel.load(ckpt).catch((e: unknown) => e)) as ArpoError;
  expect(err.code).toBe('NATIVE_OP_FAILED');
  expect(err.message).toContain('PolicyModel.load: tensor model.layers.0.mlp.gate_proj.weight: expected shape (48, 32) but received (64, 32)');
});

test('calls issued without awaiting run one at a time, in order', async () => {
  const model = await PolicyModel.create(tinyConfig('llama'), { threads: 1, seed: 2 });
  const p = model.newPath(7);
  const seq = [5, 6, 7, 8];
  // Not awaited in between: the queue must keep prefill before the decode steps.
  const r1 = model.extend([p], [Int32Array.from(seq)], { temperature: 0, seed: 0 });
  const r2 = model.extend([p], [Int32Array.of(9)], { temperature: 0, seed: 0 });
  const scores = model.logprobs([[...seq, 9, 10]]);
  const [a, b, s] = await Promise.all([r1, r2, scores]);
  expect(model.pathLength(p)).toBe(5);
  const full = await model.forwardLogits([[...seq, 9]]);
  const V = model.vocabSize;
  const argmax = (row: number) => {
    let best = 0;
    for (let j = 1; j < V; j++) if (full[row * V + j]! > full[row * V + best]!) best = j;
    return best;
  };
  expect(a.tokens[0]).toBe(argmax(3));
  expect(b.tokens[0]).toBe(argmax(4));
  expect(s.logprobs[0]!.length).toBe(6);
  model.dispose();
});

test('small engine calls run on the JS thread, settle like the pooled ones and keep queue order', async () => {
  // Two models with the same weights: one does the calls interleaved (a pooled
  // prefill, then small decode calls queued behind it without awaiting), the
  // other the same calls one at a time.
  const make = () => PolicyModel.create(tinyConfig('qwen3', { max_position_embeddings: 1024 }), { threads: 1, seed: 5 });
  const [a, b] = await Promise.all([make(), make()]);
  const sampling = { temperature: 1, seed: 9 };
  const long = Int32Array.from({ length: 300 }, (_, i) => (i * 7) % 50);
  const run = async (m: PolicyModel, interleave: boolean) => {
    const p = m.newPath(1);
    const q = m.newPath(2);
    await m.extend([q], [Int32Array.of(3, 4)], sampling);
    const calls = [() => m.extend([p], [long], sampling), () => m.extend([q], [Int32Array.of(5)], sampling), () => m.extend([q], [Int32Array.of(6)], sampling)];
    if (interleave) return Promise.all(calls.map((c) => c()));
    const out = [];
    for (const c of calls) out.push(await c());
    return out;
  };
  const [x, y] = [await run(a, true), await run(b, false)];
  for (let i = 0; i < x.length; i++) {
    expect(Array.from(x[i]!.tokens)).toEqual(Array.from(y[i]!.tokens));
    expect(Array.from(x[i]!.logprobs)).toEqual(Array.from(y[i]!.logprobs));
  }
  // The native call: a small one has run when it returns (the path already
  // holds its tokens before any await); its promise carries the result.
  type Raw = {
    extend(p: Int32Array, t: Int32Array, l: Int32Array, s: object): Promise<{ tokens: Int32Array }>;
    pathLength(p: number): number;
  };
  const native = (a as unknown as { native: Raw }).native;
  const raw = { temperature: 1, topK: 0, topP: 1, seed: 3n };
  const small = a.newPath(3);
  const pending = native.extend(Int32Array.of(small), Int32Array.of(1, 2), Int32Array.of(2), raw);
  expect(native.pathLength(small)).toBe(2);
  expect((await pending).tokens.length).toBe(1);
  // An error in a small call rejects its promise (no synchronous throw).
  const bad = native.extend(Int32Array.of(12345), Int32Array.of(1), Int32Array.of(1), raw);
  await expect(bad).rejects.toThrow('unknown or freed path 12345');
  a.dispose();
  b.dispose();
});
