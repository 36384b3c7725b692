// The demo's pretraining curriculum (copy / recall sequences) and the pretraining loop: every
// target is checked against the context it must be copied or recalled from, re-parsed from the
// decoded text (not from the generator's own bookkeeping).
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { buildDemoEnvironment, PRETRAIN_MIX, PRETRAIN_TASKS, PretrainCurriculum, type PretrainSequence, type PretrainTask } from '../../lib/envs/demo';
import { initModel } from '../../lib/cli/init-model';
import { demoModelConfig } from '../../lib/cli/demo';
import { PolicyModel } from '../../lib/model/policy-model';
import { Tokenizer } from '../../lib/model/tokenizer';
import { runPretrain } from '../../lib/train/pretrain';
import { readMetrics } from '../../lib/train/metrics';

let tmp: string;
let tokenizer: Tokenizer;

beforeAll(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-pretrain-'));
  const env = await buildDemoEnvironment({ seed: 3, dir: path.join(tmp, 'env'), sizes: { sft: 20, questions: { train: 200, valid: 20, test: 20 } } });
  tokenizer = Tokenizer.fromDir(env.dir);
}, 120_000);

afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

function split(s: PretrainSequence): { context: number[]; target: number[] } {
  const tokens = Array.from(s.tokens);
  const first = Array.from(s.mask).indexOf(1);
  return { context: tokens.slice(0, first - 1), target: tokens.slice(first) };
}

describe('PretrainCurriculum', () => {
  test('every sequence is context, EOS, target, with the loss mask exactly on the target', () => {
    const c = new PretrainCurriculum(tokenizer, 1);
    for (const s of c.batch(300)) {
      const first = Array.from(s.mask).indexOf(1);
      expect(first).toBeGreaterThan(1);
      expect(s.tokens[first - 1]).toBe(tokenizer.eosTokenId);
      expect(Array.from(s.mask.slice(first)).every((m) => m === 1)).toBe(true);
      expect(Array.from(s.mask.slice(0, first)).every((m) => m === 0)).toBe(true);
      // Only the separator is special.
      const specials = Array.from(s.tokens).filter((t) => tokenizer.specialTokenIds.has(t));
      expect(specials).toEqual([tokenizer.eosTokenId]);
    }
  });

  test('copy tasks repeat the context: tokens for copy-tokens, text with a leading space for copy-text', () => {
    const c = new PretrainCurriculum(tokenizer, 2);
    for (let i = 0; i < 100; i++) {
      const a = c.sequence('copy-tokens');
      const { context, target } = split(a);
      expect(target).toEqual(context);
      expect(context.length).toBeGreaterThanOrEqual(4);
      const b = c.sequence('copy-text');
      const parts = split(b);
      expect(tokenizer.decode(parts.target)).toBe(` ${tokenizer.decode(parts.context)}`);
      expect(b.target).toBe(tokenizer.decode(parts.target));
    }
  });

  test('recall targets are the value bound to the queried key, re-parsed from the decoded context', () => {
    const c = new PretrainCurriculum(tokenizer, 3);
    let numbers = 0;
    for (let i = 0; i < 200; i++) {
      const s = c.sequence('recall');
      const { context, target } = split(s);
      const text = tokenizer.decode(context);
      // `K1 is V1. K2 is V2. ... Kj is`: names are capitalised words, so " is " only separates.
      const cut = text.lastIndexOf('. ');
      const query = /^(.+) is$/.exec(text.slice(cut + 2));
      expect(query).not.toBeNull();
      const bindings = new Map<string, string>();
      for (const b of text.slice(0, cut + 1).split(/(?<=\.) /)) {
        const bm = /^(.+?) is (.+)\.$/.exec(b);
        expect(bm).not.toBeNull();
        expect(bindings.has(bm![1] as string)).toBe(false); // keys are distinct
        bindings.set(bm![1] as string, bm![2] as string);
      }
      expect(bindings.size).toBeGreaterThanOrEqual(2);
      const value = bindings.get(query![1] as string);
      expect(value).toBeDefined();
      expect(tokenizer.decode(target)).toBe(` ${value}.`);
      if (/^\d+$/.test(value!)) numbers++;
    }
    expect(numbers).toBeGreaterThan(100); // values are mostly numbers (70%)
  });

  test('tasks follow PRETRAIN_MIX; the stream is a pure function of the seed', () => {
    const c = new PretrainCurriculum(tokenizer, 4);
    const n = 3000;
    const counts = new Map<PretrainTask, number>();
    for (const s of c.batch(n)) counts.set(s.task, (counts.get(s.task) ?? 0) + 1);
    for (const t of PRETRAIN_TASKS) {
      const p = PRETRAIN_MIX[t];
      const sd = Math.sqrt(n * p * (1 - p));
      expect(Math.abs((counts.get(t) ?? 0) - n * p)).toBeLessThan(5 * sd);
    }
    const again = (seed: number) => new PretrainCurriculum(tokenizer, seed).batch(20).map((s) => Array.from(s.tokens).join(','));
    expect(again(9)).toEqual(again(9));
    expect(again(9)).not.toEqual(again(10));
  });

  test('bad arguments are named', () => {
    expect(() => new PretrainCurriculum(tokenizer, 1.5)).toThrow('for seed but received 1.5');
    expect(() => new PretrainCurriculum(tokenizer, 1).batch(0)).toThrow('Expected a positive integer for size but received 0');
  });
});

describe('runPretrain', () => {
  test('trains a tiny model on the stream, logs every step, and lowers the loss', async () => {
    const dir = path.join(tmp, 'model');
    const cfg = { ...demoModelConfig(tokenizer.vocabSize, tokenizer.eosTokenId!, tokenizer.eosTokenId!), hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16 };
    await initModel({ config: cfg, out: dir, seed: 1, tokenizerDir: path.join(tmp, 'env') });
    const model = await PolicyModel.load(dir, { threads: 1 });
    try {
      const c = new PretrainCurriculum(tokenizer, 5);
      const lines: string[] = [];
      const settings = { steps: 100, batchSequences: 8, lr: 1e-2, warmupSteps: 5, weightDecay: 0 };
      const summary = await runPretrain(model, (n) => c.batch(n), settings, path.join(tmp, 'run'), { write: (s) => lines.push(s) > 0 });
      expect(summary.steps).toBe(100);
      const records = readMetrics(path.join(tmp, 'run', 'pretrain-metrics.jsonl'));
      // Starts at ln(vocab) (near-uniform init) and learns at least the token statistics of the targets.
      expect(Math.abs(records[0]!.metrics['pretrain/loss']! - Math.log(tokenizer.vocabSize))).toBeLessThan(0.5);
      expect(summary.lastLoss).toBeLessThan(records[0]!.metrics['pretrain/loss']! - 1.5);
      expect(summary.lastLoss).toBeLessThan(summary.firstLoss);
      expect(records.map((r) => r.step)).toEqual(Array.from({ length: 100 }, (_, i) => i + 1));
      expect(records.every((r) => r.phase === 'pretrain' && Number.isFinite(r.metrics['pretrain/loss']))).toBe(true);
      expect(lines.length).toBe(2); // a progress line every 50 steps
      await expect(runPretrain(model, (n) => c.batch(n), { ...settings, steps: 0 }, tmp)).rejects.toThrow('Expected a positive integer for pretrain.steps but received 0');
      await expect(runPretrain(model, (n) => c.batch(n), { ...settings, lr: -1 }, tmp)).rejects.toThrow('Expected a positive number for pretrain.lr but received -1');
    } finally {
      model.dispose();
    }
  }, 120_000);
});
