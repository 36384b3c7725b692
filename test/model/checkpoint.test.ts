// lib/model/checkpoint.ts and lib/cli/init-model.ts: config.json validation
// (real released configs and every bad field), atomic checkpoint directories,
// and seeded init checked against the HF init rule and normal statistics.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { expectedTensorShapes, parseModelConfig, readModelConfig, recoverCheckpointDir, tinyConfig, writeCheckpointDir } from '../../lib/model/checkpoint';
import { SafetensorsFile, bf16BitsToFloat32, float32ToBf16Bits } from '../../lib/model/safetensors';
import { initModel, initModelCommand, NormalSampler, TINY_TOKENIZER_POSITIONS, TINY_TOKENIZER_WORDS } from '../../lib/cli/init-model';
import { buildTinyBpeTokenizer, Tokenizer, writeTokenizerFiles } from '../../lib/model/tokenizer';

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-ckpt-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

// Released configs (values as published on the Hugging Face hub).
const QWEN25_05B = {
  architectures: ['Qwen2ForCausalLM'], attention_dropout: 0.0, bos_token_id: 151643, eos_token_id: 151645, hidden_act: 'silu',
  hidden_size: 896, initializer_range: 0.02, intermediate_size: 4864, max_position_embeddings: 32768, max_window_layers: 21,
  model_type: 'qwen2', num_attention_heads: 14, num_hidden_layers: 24, num_key_value_heads: 2, rms_norm_eps: 1e-6,
  rope_theta: 1000000.0, sliding_window: 32768, tie_word_embeddings: true, torch_dtype: 'bfloat16', use_cache: true,
  use_sliding_window: false, vocab_size: 151936,
};
const QWEN3_06B = {
  architectures: ['Qwen3ForCausalLM'], attention_bias: false, attention_dropout: 0.0, bos_token_id: 151643, eos_token_id: 151645,
  head_dim: 128, hidden_act: 'silu', hidden_size: 1024, initializer_range: 0.02, intermediate_size: 3072, max_position_embeddings: 40960,
  max_window_layers: 28, model_type: 'qwen3', num_attention_heads: 16, num_hidden_layers: 28, num_key_value_heads: 8, rms_norm_eps: 1e-6,
  rope_scaling: null, rope_theta: 1000000, sliding_window: null, tie_word_embeddings: true, torch_dtype: 'bfloat16', use_cache: true,
  use_sliding_window: false, vocab_size: 151936,
};
const LLAMA32_1B = {
  architectures: ['LlamaForCausalLM'], attention_bias: false, attention_dropout: 0.0, bos_token_id: 128000, eos_token_id: [128001, 128008, 128009],
  head_dim: 64, hidden_act: 'silu', hidden_size: 2048, initializer_range: 0.02, intermediate_size: 8192, max_position_embeddings: 131072,
  mlp_bias: false, model_type: 'llama', num_attention_heads: 32, num_hidden_layers: 16, num_key_value_heads: 8, pretraining_tp: 1,
  rms_norm_eps: 1e-5, rope_scaling: { factor: 32.0, high_freq_factor: 4.0, low_freq_factor: 1.0, original_max_position_embeddings: 8192, rope_type: 'llama3' },
  rope_theta: 500000.0, tie_word_embeddings: true, torch_dtype: 'bfloat16', use_cache: true, vocab_size: 128256,
};

describe('parseModelConfig', () => {
  test('released qwen2.5 / qwen3 / llama3.2 configs', () => {
    const q2 = parseModelConfig(QWEN25_05B);
    expect(q2).toMatchObject({ modelType: 'qwen2', hiddenSize: 896, headDim: 64, numKeyValueHeads: 2, qkvBias: true, outputBias: false, qkNorm: false, tieWordEmbeddings: true, torchDtype: 'bfloat16', ropeScaling: { type: 'none' }, eosTokenId: [151645], bosTokenId: [151643] });
    const q3 = parseModelConfig(QWEN3_06B);
    expect(q3).toMatchObject({ modelType: 'qwen3', headDim: 128, numAttentionHeads: 16, qkvBias: false, outputBias: false, qkNorm: true, ropeTheta: 1000000 });
    const l = parseModelConfig(LLAMA32_1B);
    expect(l).toMatchObject({
      modelType: 'llama', headDim: 64, rmsNormEps: 1e-5, qkvBias: false, mlpBias: false, eosTokenId: [128001, 128008, 128009],
      ropeScaling: { type: 'llama3', factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 },
    });
    expect(Object.isFrozen(l)).toBe(true);
    expect(Object.isFrozen(l.eosTokenId)).toBe(true);
    // Parameter count of Qwen2.5-0.5B from its tensor shapes: 494,032,768 (as published).
    const params = expectedTensorShapes(q2).reduce((a, [, s]) => a + s.reduce((x, d) => x * d, 1), 0);
    expect(params).toBe(494032768);
  });

  test('defaults follow the HF config classes', () => {
    const base = { model_type: 'llama', vocab_size: 10, hidden_size: 8, intermediate_size: 16, num_hidden_layers: 1, num_attention_heads: 2 };
    expect(parseModelConfig(base)).toMatchObject({ numKeyValueHeads: 2, headDim: 4, ropeTheta: 10000, rmsNormEps: 1e-6, qkvBias: false, outputBias: false, tieWordEmbeddings: false, torchDtype: 'float32', eosTokenId: [] });
    expect(parseModelConfig({ ...base, attention_bias: true })).toMatchObject({ qkvBias: true, outputBias: true });
    expect(parseModelConfig({ ...base, model_type: 'qwen2' })).toMatchObject({ qkvBias: true, outputBias: false });
    expect(parseModelConfig({ ...base, model_type: 'qwen3' })).toMatchObject({ headDim: 128, qkNorm: true }); // Qwen3Config default
    expect(parseModelConfig({ ...base, rope_scaling: { type: 'linear', factor: 2 } }).ropeScaling).toEqual({ type: 'linear', factor: 2 });
    expect(parseModelConfig({ ...base, dtype: 'bfloat16' }).torchDtype).toBe('bfloat16');
  });

  const tiny = tinyConfig('qwen2');
  test.each<[string, Record<string, unknown>, string]>([
    ['model_type', { model_type: 'gpt2' }, 'expected one of qwen2, qwen3, llama for model_type but received "gpt2" of type string'],
    ['hidden_size', { hidden_size: 0 }, 'expected an integer >= 1 for hidden_size but received 0 of type number'],
    ['intermediate_size', { intermediate_size: 1.5 }, 'expected an integer >= 1 for intermediate_size but received 1.5 of type number'],
    ['num_hidden_layers', { num_hidden_layers: '2' }, 'expected an integer >= 1 for num_hidden_layers but received "2" of type string'],
    ['num_key_value_heads', { num_key_value_heads: 3 }, 'expected a divisor of num_attention_heads (4) for num_key_value_heads but received 3 of type number'],
    ['head_dim odd', { head_dim: 7 }, 'expected an even number (rotary pairs halves) for head_dim but received 7 of type number'],
    ['hidden not divisible', { hidden_size: 30 }, 'expected a multiple of num_attention_heads (4) when head_dim is absent for hidden_size but received 30'],
    ['rope_theta', { rope_theta: -1 }, 'expected a positive number for rope_theta but received -1 of type number'],
    ['rms_norm_eps', { rms_norm_eps: null, rope_theta: 'x' }, 'for rope_theta but received "x"'],
    ['rope_scaling type', { rope_scaling: { rope_type: 'yarn', factor: 4 } }, 'expected one of default, linear, llama3 for rope_scaling.rope_type but received "yarn"'],
    ['rope_scaling field', { rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4 } }, 'for rope_scaling.original_max_position_embeddings but received undefined'],
    ['tie_word_embeddings', { tie_word_embeddings: 'yes' }, 'expected a boolean for tie_word_embeddings but received "yes" of type string'],
    ['torch_dtype', { torch_dtype: 'int8' }, 'expected one of float32, bfloat16, float16, float64 for torch_dtype but received "int8"'],
    ['eos_token_id', { eos_token_id: [2, -1] }, 'expected a token id or an array of token ids for eos_token_id but received [2,-1] of type array'],
    ['hidden_act', { hidden_act: 'gelu' }, 'for hidden_act but received "gelu"'],
    ['sliding window', { use_sliding_window: true }, 'sliding-window attention is not supported'],
  ])('bad %s', (_what, override, message) => {
    let err: unknown;
    try {
      parseModelConfig({ ...tiny, ...override }, 'x/config.json');
    } catch (e) {
      err = e;
    }
    expect((err as Error).message).toContain(`x/config.json: ${message.startsWith('expected') ? message : ''}`);
    expect((err as Error).message).toContain(message);
    expect((err as { code?: string }).code).toBe('BAD_CONFIG');
  });
});

describe('writeCheckpointDir', () => {
  test('writes config, generation config, tokenizer and extra files; replaces an existing dir atomically', async () => {
    const tok = path.join(dir, 'tok');
    fs.mkdirSync(tok);
    fs.writeFileSync(path.join(tok, 'tokenizer.json'), '{"t":1}');
    fs.writeFileSync(path.join(tok, 'tokenizer_config.json'), '{"c":1}');
    const out = path.join(dir, 'ckpt');
    fs.mkdirSync(out);
    fs.writeFileSync(path.join(out, 'stale.txt'), 'old');
    await writeCheckpointDir(out, {
      config: tinyConfig('qwen3'),
      tokenizerDir: tok,
      extraFiles: { 'arpo_state.json': '{"step":3}' },
      writeWeights: (staging) => fs.writeFileSync(path.join(staging, 'model.safetensors'), 'w'),
    });
    expect(fs.readdirSync(out).sort()).toEqual(['arpo_state.json', 'config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']);
    expect(readModelConfig(out).config.modelType).toBe('qwen3');
    expect(JSON.parse(fs.readFileSync(path.join(out, 'generation_config.json'), 'utf8'))).toEqual({ bos_token_id: 1, eos_token_id: 2 });
    expect(fs.readdirSync(dir).filter((f) => f.includes('.tmp-') || f.includes('.old-'))).toEqual([]);
  });

  test('a failure while writing weights leaves the old directory intact and no staging behind', async () => {
    const out = path.join(dir, 'ckpt2');
    fs.mkdirSync(out);
    fs.writeFileSync(path.join(out, 'model.safetensors'), 'previous');
    await expect(
      writeCheckpointDir(out, {
        config: tinyConfig('llama'),
        writeWeights: (staging) => {
          fs.writeFileSync(path.join(staging, 'model.safetensors'), 'half');
          throw new Error('disk full');
        },
      }),
    ).rejects.toThrow('disk full');
    expect(fs.readFileSync(path.join(out, 'model.safetensors'), 'utf8')).toBe('previous');
    expect(fs.readdirSync(dir).filter((f) => f.startsWith('ckpt2.'))).toEqual([]);
    await expect(writeCheckpointDir(out, { config: { model_type: 'bert' }, writeWeights: () => undefined })).rejects.toThrow('model_type');
    await expect(writeCheckpointDir(out, { config: tinyConfig('llama'), tokenizerDir: dir + '/none', writeWeights: () => undefined })).rejects.toThrow('no tokenizer files');
  });

  test('recovery after a crash between the renames: the old checkpoint comes back, stale staging goes', () => {
    const dead = 4194305; // above Linux's largest pid_max: never a live process
    const out = path.join(dir, 'crashed');
    fs.mkdirSync(`${out}.old-${dead}-0`);
    fs.writeFileSync(path.join(`${out}.old-${dead}-0`, 'model.safetensors'), 'previous');
    fs.mkdirSync(`${out}.tmp-${dead}-1`);
    fs.mkdirSync(`${out}.tmp-${process.pid}-77`); // a live writer's staging: untouched
    expect(recoverCheckpointDir(out).sort()).toEqual([`removed crashed.tmp-${dead}-1`, `restored crashed.old-${dead}-0 to crashed`]);
    expect(fs.readFileSync(path.join(out, 'model.safetensors'), 'utf8')).toBe('previous');
    expect(fs.existsSync(`${out}.tmp-${process.pid}-77`)).toBe(true);
    fs.rmSync(`${out}.tmp-${process.pid}-77`, { recursive: true });
    expect(recoverCheckpointDir(out)).toEqual([]);
  });
});

describe('initModel', () => {
  test('NormalSampler: moments of N(0,1), different streams independent', () => {
    const n = 200000;
    const a = new NormalSampler(42n, 'a');
    const b = new NormalSampler(42n, 'b');
    let s1 = 0, s2 = 0, s4 = 0, sab = 0;
    for (let i = 0; i < n; i++) {
      const x = a.nextNormal();
      const y = b.nextNormal();
      s1 += x; s2 += x * x; s4 += x ** 4; sab += x * y;
    }
    // Standard errors: mean 1/sqrt(n) = 0.0022, var sqrt(2/n) = 0.0032, 4th moment sqrt(96/n) = 0.022.
    expect(Math.abs(s1 / n)).toBeLessThan(0.011);
    expect(Math.abs(s2 / n - 1)).toBeLessThan(0.016);
    expect(Math.abs(s4 / n - 3)).toBeLessThan(0.11);
    expect(Math.abs(sab / n)).toBeLessThan(0.011);
  });

  test('tiny models: HF names and shapes, init rule, bit-reproducible, tied embeddings', async () => {
    for (const type of ['qwen2', 'qwen3', 'llama'] as const) {
      const out = path.join(dir, `init-${type}`);
      const r = await initModel({ config: tinyConfig(type, { tie_word_embeddings: type === 'llama' }), out, seed: 7 });
      const f = SafetensorsFile.open(path.join(out, 'model.safetensors'));
      const want = expectedTensorShapes(r.config);
      expect([...f.tensors.keys()].sort()).toEqual(want.map(([n]) => n).sort());
      for (const [name, shape] of want) {
        expect(f.info(name).shape).toEqual(shape);
        expect(f.info(name).dtype).toBe('F32');
        const v = f.loadFloat64(name);
        if (name.endsWith('norm.weight')) expect(v.every((x) => x === 1)).toBe(true);
        else if (name.endsWith('.bias')) expect(v.every((x) => x === 0)).toBe(true);
        else {
          const mean = v.reduce((a, x) => a + x, 0) / v.length;
          const std = Math.sqrt(v.reduce((a, x) => a + (x - mean) ** 2, 0) / v.length);
          expect(std).toBeGreaterThan(0.02 * (1 - 5 / Math.sqrt(2 * v.length)));
          expect(std).toBeLessThan(0.02 * (1 + 5 / Math.sqrt(2 * v.length)));
        }
      }
      expect(f.tensors.has('lm_head.weight')).toBe(type !== 'llama');
      if (type === 'qwen2') expect(f.tensors.has('model.layers.0.self_attn.q_proj.bias')).toBe(true);
      if (type === 'qwen3') expect(f.tensors.has('model.layers.1.self_attn.k_norm.weight')).toBe(true);
      expect(f.metadata).toEqual({ format: 'pt' });
      expect(r.parameters).toBe(want.reduce((a, [, s]) => a + s.reduce((x, d) => x * d, 1), 0));
    }
    const again = path.join(dir, 'init-qwen2-again');
    await initModel({ config: tinyConfig('qwen2'), out: again, seed: 7 });
    expect(fs.readFileSync(path.join(again, 'model.safetensors')).equals(fs.readFileSync(path.join(dir, 'init-qwen2', 'model.safetensors')))).toBe(true);
    const other = path.join(dir, 'init-qwen2-seed8');
    await initModel({ config: tinyConfig('qwen2'), out: other, seed: 8 });
    expect(fs.readFileSync(path.join(other, 'model.safetensors')).equals(fs.readFileSync(path.join(again, 'model.safetensors')))).toBe(false);
  });

  test('bfloat16 weights are the round-to-nearest-even of the float32 ones; config records the dtype', async () => {
    const f32 = path.join(dir, 'init-f32');
    const bf16 = path.join(dir, 'init-bf16');
    await initModel({ configPath: 'tiny:qwen3', out: f32, seed: 3 });
    await initModel({ configPath: 'tiny:qwen3', out: bf16, seed: 3, dtype: 'bfloat16' });
    expect(readModelConfig(bf16).config.torchDtype).toBe('bfloat16');
    const a = SafetensorsFile.open(path.join(f32, 'model.safetensors'));
    const b = SafetensorsFile.open(path.join(bf16, 'model.safetensors'));
    const name = 'model.layers.0.mlp.up_proj.weight';
    expect(b.info(name).dtype).toBe('BF16');
    const x = a.loadFloat64(name);
    const y = b.loadFloat64(name);
    for (let i = 0; i < x.length; i++) expect(y[i]).toBe(bf16BitsToFloat32(float32ToBf16Bits(x[i]!)));
  });

  test('a tiny: config without --tokenizer ships a byte-level tokenizer that the checkpoint can hold', async () => {
    const r = await initModel({ configPath: 'tiny:qwen3', out: path.join(dir, 'tiny-own-tok') });
    const tok = Tokenizer.fromDir(r.dir);
    // 256 bytes, then per protocol word its merges and the spaced form, then 3 specials: every id below vocab_size.
    expect(tok.vocabSize).toBeGreaterThan(256 + TINY_TOKENIZER_WORDS.length * 2);
    expect(r.config.vocabSize).toBeGreaterThanOrEqual(tok.vocabSize);
    expect(r.config.vocabSize % 64).toBe(0);
    expect(r.config.maxPositionEmbeddings).toBe(TINY_TOKENIZER_POSITIONS);
    const imEnd = tok.tokenId('<|im_end|>')!;
    expect(r.config.eosTokenId).toEqual([imEnd]);
    // Any text round-trips (bytes are always in the vocabulary); the protocol words are one token each.
    const text = 'Ünïcode 数学 \\boxed{42} <search> q </search>\n';
    const ids = tok.encode(text);
    expect([...ids].every((id) => id >= 0 && id < r.config.vocabSize)).toBe(true);
    expect(tok.decode(ids)).toBe(text);
    for (const w of TINY_TOKENIZER_WORDS) expect(tok.encode(` ${w}`)).toHaveLength(1);
    // The chat template ends a turn with <|im_end|>, the EOS the trainer stops on.
    const prompt = tok.applyChatTemplate([{ role: 'user', content: 'hi' }], { addGenerationPrompt: true });
    expect(prompt.text).toBe('<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n');
    // An explicit tokenizer still wins: no tiny tokenizer files and the config's own vocabulary (the next test's error).
  });

  test('validation and the CLI command', async () => {
    await expect(initModel({ configPath: 'tiny:gpt2', out: path.join(dir, 'x') })).rejects.toThrow('Expected tiny:<qwen2|qwen3|llama> for config but received "tiny:gpt2"');
    await expect(initModel({ configPath: 'tiny:qwen2', out: path.join(dir, 'x'), seed: -1 })).rejects.toThrow('Expected a non-negative integer for seed but received -1');
    await expect(initModel({ configPath: 'tiny:qwen2', out: path.join(dir, 'x'), dtype: 'int8' as 'float32' })).rejects.toThrow('for dtype but received "int8"');
    await expect(initModel({ configPath: path.join(dir, 'missing.json'), out: path.join(dir, 'x') })).rejects.toThrow('missing.json: cannot read');
    const tokDir = path.join(dir, 'tiny-tok');
    writeTokenizerFiles(tokDir, buildTinyBpeTokenizer(['search']));
    await expect(initModel({ configPath: 'tiny:qwen2', out: path.join(dir, 'x'), tokenizerDir: tokDir })).rejects.toThrow(
      'tiny:qwen2: vocab_size 96 is smaller than the 265 tokens of the tokenizer in', // 256 bytes + 5 merges of "search" + "Ġsearch" + 3 specials
    );
    const withTok = await initModel({ config: tinyConfig('qwen2', { vocab_size: 265 }), out: path.join(dir, 'with-tok'), tokenizerDir: tokDir });
    expect(Tokenizer.fromDir(withTok.dir).vocabSize).toBe(265);
    const cfgFile = path.join(dir, 'cfg.json');
    fs.writeFileSync(cfgFile, JSON.stringify(tinyConfig('llama', { vocab_size: 50 })));
    const out = path.join(dir, 'cli-out');
    const writes: string[] = [];
    const spy = jest.spyOn(process.stdout, 'write').mockImplementation((s: string | Uint8Array) => (writes.push(String(s)), true));
    try {
      await initModelCommand().exitOverride().parseAsync(['--config', cfgFile, '--out', out, '--seed', '5', '--dtype', 'bfloat16'], { from: 'user' });
    } finally {
      spy.mockRestore();
    }
    expect(writes.join('')).toContain('llama 2 layers, hidden 32, vocab 50');
    expect(readModelConfig(out).config).toMatchObject({ vocabSize: 50, torchDtype: 'bfloat16' });
    expect(() => initModelCommand().exitOverride().configureOutput({ writeErr: () => undefined }).parse(['--config', cfgFile, '--out', out, '--dtype', 'fp8'], { from: 'user' })).toThrow('expected one of float32, bfloat16, float16, got "fp8"');
  });
});
