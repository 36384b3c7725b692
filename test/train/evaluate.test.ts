// `arpo eval` with samples: K samples per question at a temperature, pass@1 averaged over them and
// pass@K, checked against the rows themselves, against the greedy path (a near-zero temperature
// samples the argmax), and the standard error over questions against its formula.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { buildDemoEnvironment, DEMO_SYSTEM_PROMPT } from '../../lib/envs';
import { initModel } from '../../lib/cli/init-model';
import { demoModelConfig } from '../../lib/cli/demo';
import { Tokenizer } from '../../lib/model/tokenizer';
import { registerReward } from '../../lib/reward';
import { validateConfig, type RunConfig } from '../../lib/train/config';
import { evalSampling, evaluate, familyStats, type EvalRow } from '../../lib/train/evaluate';
import { buildProgram } from '../../lib/cli/main';

let tmp: string;
let modelDir: string;
let cfg: RunConfig;
let data: string;
const QUESTIONS = 6;

beforeAll(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-eval-'));
  const env = await buildDemoEnvironment({ seed: 8, dir: path.join(tmp, 'env'), sizes: { sft: 4, questions: { train: 20, valid: 10, test: QUESTIONS } } });
  const tok = Tokenizer.fromDir(env.dir);
  modelDir = path.join(tmp, 'model');
  const config = { ...demoModelConfig(tok.vocabSize, tok.eosTokenId!, tok.eosTokenId!), hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16 };
  await initModel({ config, out: modelDir, seed: 3, tokenizerDir: env.dir });
  // Right when the response has an even number of characters: random responses are right about half the time.
  registerReward('test-even-length', ({ response }) => (response.length % 2 === 0 ? 1 : 0), { replace: true });
  cfg = validateConfig({
    model: { path: modelDir, threads: 1 },
    data: { systemPrompt: DEMO_SYSTEM_PROMPT },
    reward: { name: 'test-even-length' },
    rollout: { maxResponseTokens: 12, toolCallLimit: 1 },
    tools: { search: { corpus: env.files.corpus, topK: 1, snippetChars: 60 }, python: { enabled: false } },
    train: { batchPrompts: 4, miniBatchPrompts: 4, seed: 5 },
  });
  data = env.files.test;
}, 120_000);

afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

describe('evaluate with samples', () => {
  test('greedy by default: one row per question, sample 0, in dataset order', async () => {
    const r = await evaluate(modelDir, data, cfg, { workDir: tmp });
    expect(r.rows.map((x) => x.index)).toEqual(Array.from({ length: QUESTIONS }, (_, i) => i));
    expect(r.rows.every((x) => x.sample === 0)).toBe(true);
    expect(r.metrics['valid/examples']).toBe(QUESTIONS);
    expect(r.metrics['valid/samples']).toBeUndefined();
    expect(Object.keys(r.metrics).some((k) => k.startsWith('acc/pass@'))).toBe(false);
  }, 60_000);

  test('K samples: K rows per question; acc/mean and acc/pass@K agree with the rows; reproducible', async () => {
    const K = 5;
    const r = await evaluate(modelDir, data, cfg, { workDir: tmp, samples: K, temperature: 1 });
    expect(r.rows.length).toBe(K * QUESTIONS);
    const byQuestion = new Map<number, EvalRow[]>();
    for (const x of r.rows) byQuestion.set(x.index, [...(byQuestion.get(x.index) ?? []), x]);
    expect([...byQuestion.keys()].sort((a, b) => a - b)).toEqual(Array.from({ length: QUESTIONS }, (_, i) => i));
    for (const rows of byQuestion.values()) {
      expect(rows.map((x) => x.sample).sort()).toEqual([0, 1, 2, 3, 4]);
      expect(new Set(rows.map((x) => x.question)).size).toBe(1);
      expect(rows.every((x) => x.accuracy === (x.response.length % 2 === 0 ? 1 : 0))).toBe(true);
    }
    const mean = r.rows.reduce((a, x) => a + x.accuracy, 0) / r.rows.length;
    const passK = [...byQuestion.values()].filter((rows) => rows.some((x) => x.accuracy === 1)).length / QUESTIONS;
    expect(r.metrics['acc/mean']).toBeCloseTo(mean, 12);
    expect(r.metrics[`acc/pass@${K}`]).toBeCloseTo(passK, 12);
    expect(r.metrics['valid/examples']).toBe(QUESTIONS);
    expect(r.metrics['valid/samples']).toBe(K);
    expect(r.metrics['valid/temperature']).toBe(1);
    // At temperature 1 a random model's samples of one question differ.
    const distinct = [...byQuestion.values()].map((rows) => new Set(rows.map((x) => x.response)).size);
    expect(distinct.every((d) => d >= 2)).toBe(true);
    // The same seed and data give the same samples.
    const again = await evaluate(modelDir, data, cfg, { workDir: tmp, samples: K, temperature: 1 });
    expect(again.rows.map((x) => x.response)).toEqual(r.rows.map((x) => x.response));
  }, 60_000);

  test('samples at a near-zero temperature are the greedy response', async () => {
    const greedy = await evaluate(modelDir, data, cfg, { workDir: tmp });
    const cold = await evaluate(modelDir, data, cfg, { workDir: tmp, samples: 3, temperature: 1e-6 });
    for (const x of cold.rows) expect(x.response).toBe(greedy.rows[x.index]!.response);
  }, 60_000);

  test('bad sampling settings are named', async () => {
    expect(() => evalSampling({ samples: 0 })).toThrow('Expected an integer in [1, 1024] for eval samples but received 0');
    expect(() => evalSampling({ samples: 2.5, temperature: 1 })).toThrow('for eval samples but received 2.5');
    expect(() => evalSampling({ temperature: -1 })).toThrow('Expected a finite number >= 0 (0 = greedy) for eval temperature but received -1');
    expect(() => evalSampling({ temperature: Number.NaN })).toThrow('for eval temperature but received NaN');
    expect(() => evalSampling({ samples: 4 })).toThrow('eval samples 4 with temperature 0: greedy samples are all the same');
    expect(evalSampling({})).toEqual({ samples: 1, temperature: 0 });
    await expect(evaluate(modelDir, data, cfg, { samples: 4, temperature: 0 })).rejects.toThrow('greedy samples are all the same');
    // On the command line, a value that is not a number is named before anything loads.
    const stderr = jest.spyOn(process.stderr, 'write').mockImplementation(() => true);
    try {
      for (const [flag, value] of [['--samples', 'four'], ['--temperature', ''], ['--temperature', '1e999']]) {
        const argv = ['node', 'arpo', 'eval', '--model', modelDir, '--data', data, flag!, value!];
        await expect(buildProgram(argv).parseAsync(argv)).rejects.toThrow(`expected a number, got ${JSON.stringify(value)}`);
      }
    } finally {
      stderr.mockRestore();
    }
  });
});

describe('familyStats over samples', () => {
  const row = (family: string, index: number | undefined, accuracy: number) => ({ family, index, accuracy, score: accuracy, formatOk: true, finish: 'answer' as const, toolCalls: 1 });

  test('one 0/1 sample per question: the standard error is sqrt(p(1-p)/n), with or without index', () => {
    const acc = [1, 0, 0, 1, 1, 0, 0, 0];
    const p = 3 / 8;
    for (const s of [familyStats(acc.map((a, i) => row('f', i, a))), familyStats(acc.map((a) => row('f', undefined, a)))]) {
      expect(s.f!.n).toBe(8);
      expect(s.f!.accuracy).toBeCloseTo(p, 12);
      expect(s.f!.se).toBeCloseTo(Math.sqrt((p * (1 - p)) / 8), 12);
    }
  });

  test('several samples per question: accuracy is their mean, the error is over question means', () => {
    // Question 0: 2 of 4 right, question 1: 4 of 4, question 2: 0 of 4 -> means 0.5, 1, 0.
    const rows = [
      ...[1, 0, 1, 0].map((a) => row('f', 0, a)),
      ...[1, 1, 1, 1].map((a) => row('f', 1, a)),
      ...[0, 0, 0, 0].map((a) => row('f', 2, a)),
    ];
    const s = familyStats(rows).f!;
    expect(s.n).toBe(3);
    expect(s.accuracy).toBeCloseTo(0.5, 12);
    // Population variance of (0.5, 1, 0) is 1/6; se = sqrt(1/6 / 3).
    expect(s.se).toBeCloseTo(Math.sqrt(1 / 18), 12);
  });
});
