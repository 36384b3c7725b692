// `arpo demo`: the embedded end-to-end run with nothing downloaded. Builds the
// seeded demo world (corpus, questions, imperfect SFT traces, tokenizer),
// creates a tiny model, pretrains it on synthetic copy / recall sequences,
// cold-starts it with SFT, evaluates it on the held-out test split, trains it
// with ARPO, evaluates again, and writes the report.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { buildDemoEnvironment, demoIsolation, localPython, openDemoTools, PretrainCurriculum } from '../envs';
import { PolicyModel } from '../model/policy-model';
import { Tokenizer } from '../model/tokenizer';
import { ArpoError, invalidArgument } from '../errors';
import { hasTorch, loadNative } from '../native/loader';
import { Dist } from '../train/dist';
import { readLaunchEnv, threadsPerRank, withHelperRanks } from '../train/launch';
import { initModel } from './init-model';
import { validateConfig, type RunConfig } from '../train/config';
import { compareFamilies, evaluate, familyStats } from '../train/evaluate';
import { writeReport } from '../train/report';
import { runPretrain, type PretrainSettings, type PretrainSummary } from '../train/pretrain';
import { readSftData, runSft, type SftSummary } from '../train/sft';
import { readMetrics } from '../train/metrics';
import { train } from '../train/trainer';

export interface DemoOptions {
  out: string;
  seed: number;
  /** A smaller, faster run (for tests): fewer traces, steps and test questions. */
  quick?: boolean;
  /** Override the number of RL steps. */
  steps?: number;
  /** Extra `--set`-style overrides of the RL config (nested object). */
  overrides?: Record<string, unknown>;
  /**
   * Also train trajectory-level GRPO from the same SFT checkpoint (same M,
   * prompts, seed and steps) and put it beside ARPO in the summary and report.
   */
  compare?: boolean;
  /**
   * Processes that train data-parallel (pretraining, SFT and each RL run),
   * this one being rank 0 (default: defaultDemoRanks()). The evaluations run
   * in this process alone.
   */
  nproc?: number;
  progress?: { write(s: string): boolean; isTTY?: boolean };
}

/**
 * Ranks of the demo's training (pretraining, SFT, RL): 2 where the machine has 2 or more cores
 * and the addon has c10d's Gloo backend, else 1. On 2 cores, two
 * one-thread processes train a step ~1.9x faster than one process with two
 * threads, whose matmuls and elementwise ops do not speed up with the second
 * thread there (note on issue 15, 2026-12-06).
 */
export function defaultDemoRanks(): number {
  return os.cpus().length >= 2 && hasTorch() && loadNative().hasGloo === true ? 2 : 1;
}

export interface DemoSummary {
  out: string;
  pretrain: { steps: number; firstLoss: number; lastLoss: number };
  sft: { steps: number; firstLoss: number; lastLoss: number; testAccuracy: number; testReward: number; testToolCalls: number };
  rl: RlSummary;
  /** With --compare: trajectory-level GRPO from the same SFT checkpoint, same M, prompts, seed and steps. */
  grpo?: RlSummary;
  /** Held-out test accuracy per task family (and `all`), SFT vs SFT + ARPO, with standard errors. */
  families: ReturnType<typeof compareFamilies>;
  /** With --compare: the same for SFT vs SFT + GRPO. */
  grpoFamilies?: ReturnType<typeof compareFamilies>;
  seconds: { build: number; pretrain: number; sft: number; rl: number; grpo?: number; total: number };
  report: string;
}

/** One RL run of the demo: its held-out test results and the tool calls its training rollouts executed. */
export interface RlSummary {
  steps: number;
  testAccuracy: number;
  testReward: number;
  testToolCalls: number;
  /** Tool calls executed per prompt during training (the rollout budget the paper counts), mean over steps. */
  trainToolCallsPerPrompt: number;
}

/** The work a demo run will do, in the units its time estimate counts. */
export interface DemoPlan {
  pretrainSteps: number;
  sftSteps: number;
  /** RL runs (ARPO, and GRPO with --compare) and their steps. */
  rl: { name: string; steps: number; mode: 'arpo' | 'trajectory' }[];
  /** Held-out questions evaluated greedily: the test split per model, plus every validation during RL. */
  evalQuestions: number;
}

/**
 * Seconds per unit of demo work, as multiples of one pretraining step,
 * measured on this project's reference machine (2 AMD EPYC vCPUs, idle,
 * host kernel 6.18.44-fc-v1300, 2026-12-06, `npm run demo`: 2 data-parallel
 * ranks, the malloc settings of package.json's demo script; 661 s in all):
 * the first pretraining steps 0.103 s each (all 2,000 in 191 s), an SFT step
 * 0.44 s (603 in 266 s), an RL step of the demo configuration 4.3 s with
 * ARPO (40 in ~173 s, validations aside) and, at the ratio the e2e bench
 * measured between them (rollout 1.10x, train phase 1.22x), ~5.0 s with
 * GRPO; a greedily evaluated question ~0.04 s (640 test and validation
 * questions in ~26 s). The demo times its first pretraining steps and
 * scales these.
 */
export const DEMO_COST = { sftStep: 4.3, rlStep: { arpo: 42, trajectory: 49 }, evalQuestion: 0.4 } as const;

/** Seconds per stage from the plan and this machine's measured seconds per pretraining step. */
export function estimateDemo(plan: DemoPlan, pretrainStep: number): Record<string, number> {
  const out: Record<string, number> = { pretraining: plan.pretrainSteps * pretrainStep, SFT: plan.sftSteps * pretrainStep * DEMO_COST.sftStep };
  for (const r of plan.rl) out[`${r.name} RL`] = r.steps * pretrainStep * DEMO_COST.rlStep[r.mode];
  out.evaluations = plan.evalQuestions * pretrainStep * DEMO_COST.evalQuestion;
  return out;
}

/** `~N min (stage ~m, ...)` */
export function formatEstimate(stages: Record<string, number>): string {
  const total = Object.values(stages).reduce((a, b) => a + b, 0);
  const min = (x: number): string => (x < 90 ? `${Math.max(1, Math.round(x))} s` : `${(x / 60).toFixed(x < 600 ? 1 : 0)} min`);
  return `~${min(total)} (${Object.entries(stages).map(([k, v]) => `${k} ${min(v)}`).join(', ')})`;
}

/** The tiny decoder the demo trains (Qwen3 layout with q/k norms), sized for 2 CPU cores. */
export function demoModelConfig(vocabSize: number, eosId: number, bosId: number): Record<string, unknown> {
  return {
    model_type: 'qwen3',
    architectures: ['Qwen3ForCausalLM'],
    vocab_size: vocabSize,
    hidden_size: 128,
    intermediate_size: 384,
    num_hidden_layers: 4,
    num_attention_heads: 8,
    num_key_value_heads: 4,
    head_dim: 16,
    hidden_act: 'silu',
    max_position_embeddings: 2048,
    rms_norm_eps: 1e-6,
    rope_theta: 10000,
    attention_bias: false,
    initializer_range: 0.02,
    tie_word_embeddings: true,
    torch_dtype: 'float32',
    bos_token_id: bosId,
    eos_token_id: eosId,
  };
}

/**
 * Pretraining of the demo model (lib/envs/demo/pretrain.ts): induction forms
 * after ~1,000 steps of copy sequences at this learning rate (copy loss falls
 * from ln(vocab) ~7 to ~2 between steps 300 and 1,000, measured with
 * tmp experiments noted on issue 7); without it the SFT model copies nothing.
 */
export function demoPretrainSettings(quick: boolean): PretrainSettings {
  return { steps: quick ? 40 : 2000, batchSequences: 32, lr: 3e-3, warmupSteps: 30, weightDecay: 0.01 };
}

/** The RL configuration of the demo (ARPO on the demo world's tools and questions). */
export function demoRunConfig(envDir: string, modelDir: string, runDir: string, seed: number, quick: boolean, steps: number | undefined, overrides: Record<string, unknown> = {}): RunConfig {
  const base = {
    model: { path: modelDir, threads: 0 },
    // No system prompt: it would be 124 of a prompt's ~150 tokens, and the protocol is learned from the
    // SFT traces anyway; without it the tiny model conditions on the question sooner.
    data: { train: path.join(envDir, 'train.jsonl'), valid: path.join(envDir, 'valid.jsonl'), validLimit: quick ? 16 : 48, systemPrompt: '' },
    rollout: {
      mode: 'arpo',
      budget: 8,
      initialSamples: 4,
      entropyWindow: 8,
      toolCallLimit: 4,
      maxResponseTokens: 640,
      temperature: 1,
      maxBatchPaths: 256,
    },
    tools: { search: { corpus: path.join(envDir, 'corpus.jsonl'), topK: 3, snippetChars: 400 }, python: { enabled: true, timeoutMs: 5000, isolation: demoIsolation() }, concurrency: 4 },
    reward: { name: 'arpo-deep-research' },
    algorithm: { name: 'arpo', estimator: 'grpo', attribution: 'soft' },
    loss: { clipLow: 0.2, clipHigh: 0.28, aggregation: 'token-mean' },
    optim: { lr: 2e-4, weightDecay: 0, warmupSteps: 0, schedule: 'constant', maxGradNorm: 1 },
    sft: { epochs: quick ? 2 : 12, batchSequences: 16, lr: 1e-3 },
    train: {
      steps: steps ?? (quick ? 3 : 40),
      batchPrompts: quick ? 4 : 16,
      miniBatchPrompts: quick ? 4 : 16,
      ppoEpochs: 1,
      microBatchTokens: 4096,
      oldLogprobs: 'rollout',
      validateEvery: quick ? 0 : 10,
      checkpointEvery: quick ? 0 : 10,
      seed,
      outDir: runDir,
    },
  };
  return validateConfig(deepMerge(base, overrides), 'demo config');
}

function deepMerge(a: Record<string, unknown>, b: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...a };
  for (const [k, v] of Object.entries(b)) {
    const cur = out[k];
    out[k] = v && typeof v === 'object' && !Array.isArray(v) && cur && typeof cur === 'object' && !Array.isArray(cur) ? deepMerge(cur as Record<string, unknown>, v as Record<string, unknown>) : v;
  }
  return out;
}

export interface DemoModelRun {
  initDir: string;
  pretrainedDir: string;
  /** cfg.model.path: the SFT checkpoint RL starts from. */
  sftDir: string;
  pretrain: PretrainSummary;
  sft: SftSummary;
  seconds: { pretrain: number; sft: number };
}

/**
 * The demo's model recipe, shared by `arpo demo` and the end-to-end bench:
 * the tiny decoder over the world's tokenizer (model-init/), pretrained on
 * synthetic copy / recall sequences (model-pretrained/), then SFT'd from those
 * weights with a fresh optimiser on the traces (cfg.model.path). Metrics go
 * to <out>/pretrain-metrics.jsonl and <out>/sft-metrics.jsonl.
 */
export interface DemoModelSpec {
  envDir: string;
  sftFile: string;
  traces: number;
  out: string;
  seed: number;
  cfg: RunConfig;
  pretrain: PretrainSettings;
}

export async function trainDemoModel(o: DemoModelSpec & {
  /** Data parallel: this process's rank of the model stages (default: one process). */
  dist?: Dist;
  progress?: { write(s: string): boolean; isTTY?: boolean };
  say?: (s: string) => void;
  /** Told the mean seconds of the first pretraining steps (the demo's time estimate). */
  calibrate?: (secondsPerPretrainStep: number) => void;
}): Promise<DemoModelRun> {
  const dist = o.dist ?? Dist.single();
  const say = dist.isRoot && o.say ? o.say : () => undefined;
  const tokenizer = Tokenizer.fromDir(o.envDir);
  const eos = tokenizer.eosTokenId ?? 0;
  const initDir = path.join(o.out, 'model-init');
  await dist.rootFirst(() => (dist.isRoot ? initModel({ config: demoModelConfig(tokenizer.vocabSize, eos, tokenizer.bosTokenId ?? eos), out: initDir, seed: o.seed, tokenizerDir: o.envDir }) : undefined));
  const pretrainedDir = path.join(o.out, 'model-pretrained');
  const sftDir = o.cfg.model.path;
  if (sftDir === null) throw invalidArgument('the SFT output directory', 'cfg.model.path', sftDir);
  // Each stage loads its starting weights (a fresh optimiser), trains them in place and saves them (rank 0).
  // A rank of several computes on its share of the cores; the process-wide thread count is put back after.
  const stage = async <T>(from: string, to: string, fn: (model: PolicyModel) => Promise<T>): Promise<T> => {
    const model = await PolicyModel.load(from, { threads: o.cfg.model.threads, dtype: o.cfg.model.dtype });
    const threads = model.info().threads;
    try {
      if (dist.distributed && o.cfg.model.threads === 0) model.setThreads(threadsPerRank(os.cpus().length, dist.localWorld));
      await dist.attach(model);
      const result = await fn(model);
      await dist.rootFirst(() => (dist.isRoot ? model.save(to, { tokenizerDir: o.envDir, optimizer: false }) : undefined));
      return result;
    } finally {
      model.setThreads(threads);
      model.dispose();
    }
  };
  const t0 = Date.now();
  say(`[demo] pretraining for ${o.pretrain.steps} steps on synthetic copy / recall sequences (no facts of the world)`);
  const curriculum = new PretrainCurriculum(tokenizer, o.seed);
  const pretrain = await stage(initDir, pretrainedDir, (model) => runPretrain(model, (n) => curriculum.batch(n), o.pretrain, o.out, o.progress, o.calibrate ? { done: o.calibrate } : undefined, dist));
  const t1 = Date.now();
  say(`[demo] SFT on ${o.traces} traces (${o.cfg.sft.epochs} epochs)`);
  const data = readSftData(o.sftFile, tokenizer, { systemPrompt: o.cfg.data.systemPrompt });
  const sft = await stage(pretrainedDir, sftDir, (model) => runSft(model, data, o.cfg, o.out, o.progress, { dist }));
  return { initDir, pretrainedDir, sftDir, pretrain, sft, seconds: { pretrain: (t1 - t0) / 1000, sft: (Date.now() - t1) / 1000 } };
}

/** `arpo demo --model-rank <spec>`: a helper rank (1..N-1) of the model stages; rank 0 is the demo process, which wrote the spec. */
export async function runDemoModelRank(specFile: string): Promise<void> {
  let spec: DemoModelSpec;
  try {
    spec = JSON.parse(fs.readFileSync(specFile, 'utf8')) as DemoModelSpec;
  } catch (e) {
    throw new ArpoError('BAD_CONFIG', `--model-rank: cannot read the model-stage spec ${specFile}: ${(e as Error).message}`);
  }
  const cfg = validateConfig(spec.cfg as unknown as Record<string, unknown>, specFile);
  await Dist.run(readLaunchEnv(), cfg.train.distTimeoutS * 1000, (dist) => trainDemoModel({ ...spec, cfg, dist }).then(() => undefined));
}

/** trainDemoModel on `nproc` ranks: this process is rank 0, helpers (`arpo demo --model-rank`) the others. */
export async function trainDemoModelRanks(nproc: number, o: Parameters<typeof trainDemoModel>[0]): Promise<DemoModelRun> {
  if (nproc <= 1) return trainDemoModel(o);
  const spec: DemoModelSpec = { envDir: o.envDir, sftFile: o.sftFile, traces: o.traces, out: o.out, seed: o.seed, cfg: o.cfg, pretrain: o.pretrain };
  const specFile = path.join(o.out, 'model-ranks.json');
  fs.mkdirSync(o.out, { recursive: true });
  fs.writeFileSync(specFile, `${JSON.stringify(spec, null, 1)}\n`);
  const sink = o.progress ?? process.stderr;
  return withHelperRanks(nproc, ['demo', '--model-rank', specFile], (launch) => Dist.run(launch, o.cfg.train.distTimeoutS * 1000, (dist) => trainDemoModel({ ...o, dist })), { stdout: sink, stderr: sink });
}

export async function runDemo(options: DemoOptions): Promise<DemoSummary> {
  const out = path.resolve(options.out);
  const quick = options.quick === true;
  const say = (s: string): void => void (options.progress ?? process.stderr).write(`${s}\n`);
  const t0 = Date.now();
  fs.mkdirSync(out, { recursive: true });

  // 1. The world: corpus, questions, SFT traces (tool results from the real search engine), tokenizer.
  const envDir = path.join(out, 'env');
  say(`[demo] building the world in ${envDir}`);
  let tools: Awaited<ReturnType<typeof openDemoTools>> | undefined;
  const env = await buildDemoEnvironment({
    seed: options.seed,
    dir: envDir,
    sizes: quick ? { sft: 160, questions: { test: 40, valid: 40 } } : { sft: 800 },
    createRunTool: async ({ corpus }) => {
      tools = await openDemoTools(corpus);
      const search = tools.runTool;
      // python results of the traces: the in-process evaluator prints exactly what the sandbox prints for these programs.
      return async (tag: string, content: string) => (tag === 'python' ? localPython(content) : search(tag, content));
    },
  });
  await tools?.close();
  const tBuild = Date.now();

  // 2-4. A tiny model over the demo tokenizer, pretrained on copy / recall sequences, SFT'd on the traces.
  const sftDir = path.join(out, 'model-sft');
  const rlRun = path.join(out, 'rl');
  const cfg = demoRunConfig(envDir, sftDir, rlRun, options.seed, quick, options.steps, options.overrides);
  const testLimit = quick ? 24 : 0;
  const testQuestions = testLimit > 0 ? Math.min(testLimit, env.questions.test.length) : env.questions.test.length;
  const rlModes: DemoPlan['rl'] = [{ name: 'ARPO', steps: cfg.train.steps, mode: 'arpo' }, ...(options.compare ? [{ name: 'GRPO', steps: cfg.train.steps, mode: 'trajectory' as const }] : [])];
  const validations = cfg.train.validateEvery > 0 ? Math.floor(cfg.train.steps / cfg.train.validateEvery) + 1 : 0;
  const plan: DemoPlan = {
    pretrainSteps: demoPretrainSettings(quick).steps,
    sftSteps: Math.max(1, Math.ceil(env.traces.length / cfg.sft.batchSequences)) * cfg.sft.epochs,
    rl: rlModes,
    evalQuestions: testQuestions * (1 + rlModes.length) + rlModes.length * validations * Math.min(cfg.data.validLimit || env.questions.valid.length, env.questions.valid.length),
  };
  const calibrate = (perStep: number): void => say(`[demo] estimated time on this machine: ${formatEstimate({ 'world build': (tBuild - t0) / 1000, ...estimateDemo(plan, perStep) })} (scaled from the first pretraining steps, ${perStep.toFixed(3)} s each)`);
  const nproc = options.nproc ?? defaultDemoRanks();
  if (!Number.isInteger(nproc) || nproc < 1 || nproc > cfg.sft.batchSequences) throw invalidArgument(`an integer in [1, ${cfg.sft.batchSequences}] (sft.batchSequences)`, 'nproc', nproc);
  if (nproc > 1) say(`[demo] pretraining, SFT and RL run data-parallel in ${nproc} processes (--nproc 1: one process)`);
  const trained = await trainDemoModelRanks(nproc, { envDir, sftFile: env.files.sft, traces: env.traces.length, out, seed: options.seed, cfg, pretrain: demoPretrainSettings(quick), progress: options.progress, say, calibrate });
  const tSft = Date.now();
  say('[demo] evaluating the SFT model on the held-out test split');
  const sftEval = await evaluate(sftDir, env.files.test, cfg, { limit: testLimit, workDir: out, outFile: path.join(out, 'test-sft.jsonl') });
  const sftEvalSeconds = (Date.now() - tSft) / 1000;
  say(`[demo] SFT test accuracy ${sftEval.metrics['acc/mean']?.toFixed(3)} | reward ${sftEval.metrics['reward/mean']?.toFixed(3)}`);

  // 5. ARPO RL from the SFT checkpoint (and, with --compare, trajectory-level GRPO from the same one).
  const rlRuns: { name: string; dir: string; cfg: RunConfig; label: string }[] = [{ name: 'ARPO', dir: rlRun, cfg, label: 'rl' }];
  if (options.compare) {
    const grpoCfg = demoRunConfig(envDir, sftDir, path.join(out, 'grpo'), options.seed, quick, options.steps, deepMerge(options.overrides ?? {}, { algorithm: { name: 'grpo' }, rollout: { mode: 'trajectory' } }));
    rlRuns.push({ name: 'GRPO', dir: grpoCfg.train.outDir, cfg: grpoCfg, label: 'grpo' });
  }
  const results: { summary: RlSummary; rows: Awaited<ReturnType<typeof evaluate>>['rows']; seconds: number }[] = [];
  for (const run of rlRuns) {
    const t = Date.now();
    say(`[demo] ${run.name} RL for ${run.cfg.train.steps} steps`);
    // The RL run on the same ranks: helpers are `arpo train --config <the run's config>`.
    const cfgFile = path.join(out, `${run.label}-config.json`);
    fs.writeFileSync(cfgFile, `${JSON.stringify(run.cfg, null, 1)}\n`);
    const sink = options.progress ?? process.stderr;
    const summary = await withHelperRanks(nproc, ['train', '--config', cfgFile], (launch) => train(run.cfg, { progress: options.progress, report: false, launch }), { stdout: sink, stderr: sink });
    const ckpts = path.join(run.dir, 'checkpoints');
    const model = path.join(ckpts, fs.readFileSync(path.join(ckpts, 'latest'), 'utf8').trim(), 'model');
    say(`[demo] evaluating the ${run.name} model on the held-out test split`);
    // A rank's train() left this process at its share of the cores; the evaluation uses them all again.
    const evalCfg = nproc > 1 && run.cfg.model.threads === 0 ? { ...run.cfg, model: { ...run.cfg.model, threads: os.cpus().length } } : run.cfg;
    const ev = await evaluate(model, env.files.test, evalCfg, { limit: testLimit, workDir: out, outFile: path.join(out, `test-${run.label}.jsonl`) });
    const trainSteps = readMetrics(path.join(run.dir, 'metrics.jsonl')).filter((r) => r.phase === 'train');
    const perPrompt = trainSteps.map((r) => r.metrics['tools/executed_per_prompt']).filter((v): v is number => v !== undefined);
    results.push({
      summary: {
        steps: summary.stepsDone,
        testAccuracy: ev.metrics['acc/mean'] ?? NaN,
        testReward: ev.metrics['reward/mean'] ?? NaN,
        testToolCalls: ev.metrics['tools/calls_per_traj'] ?? NaN,
        trainToolCallsPerPrompt: perPrompt.length > 0 ? perPrompt.reduce((a, b) => a + b, 0) / perPrompt.length : NaN,
      },
      rows: ev.rows,
      seconds: (Date.now() - t) / 1000,
    });
  }
  const sftFamilies = familyStats(sftEval.rows);
  const families = compareFamilies(sftFamilies, familyStats(results[0]!.rows));
  const grpo = results[1];
  const grpoFamilies = grpo ? compareFamilies(sftFamilies, familyStats(grpo.rows)) : undefined;
  const seconds: DemoSummary['seconds'] = { build: (tBuild - t0) / 1000, pretrain: trained.seconds.pretrain, sft: trained.seconds.sft, rl: sftEvalSeconds + results[0]!.seconds, total: 0 };
  if (grpo) seconds.grpo = grpo.seconds;
  const stages: Record<string, number> = { 'world build': seconds.build, pretraining: seconds.pretrain, SFT: seconds.sft, 'SFT evaluation': sftEvalSeconds, 'ARPO RL + evaluation': results[0]!.seconds };
  if (grpo) stages['GRPO RL + evaluation'] = grpo.seconds;
  const heldOut = { before: 'SFT', after: 'SFT + ARPO', families, ...(grpoFamilies ? { alt: { name: 'SFT + GRPO', families: grpoFamilies } } : {}) };
  const report = await writeReport(rlRuns.map((r) => r.dir), path.join(out, 'report.html'), { heldOut, stages });
  seconds.total = (Date.now() - t0) / 1000;
  const result: DemoSummary = {
    out,
    pretrain: { steps: trained.pretrain.steps, firstLoss: trained.pretrain.firstLoss, lastLoss: trained.pretrain.lastLoss },
    sft: {
      ...trained.sft,
      testAccuracy: sftEval.metrics['acc/mean'] ?? NaN,
      testReward: sftEval.metrics['reward/mean'] ?? NaN,
      testToolCalls: sftEval.metrics['tools/calls_per_traj'] ?? NaN,
    },
    rl: results[0]!.summary,
    ...(grpo ? { grpo: grpo.summary } : {}),
    families,
    ...(grpoFamilies ? { grpoFamilies } : {}),
    seconds,
    report,
  };
  fs.writeFileSync(path.join(out, 'summary.json'), `${JSON.stringify(result, null, 2)}\n`);
  const modelRow = (name: string, r: { testAccuracy: number; testReward: number; testToolCalls: number }, train?: number): string =>
    `| ${name} | ${r.testAccuracy.toFixed(3)} | ${r.testReward.toFixed(3)} | ${r.testToolCalls.toFixed(2)} | ${train === undefined ? '-' : train.toFixed(2)} |`;
  const pct = (x: number): string => `${(100 * x).toFixed(0)}%`;
  const familyRows = (fams: ReturnType<typeof compareFamilies>, who: string): string[] =>
    Object.entries(fams).map(
      ([f, c]) => `| ${who}${f} | ${c.before.n} | ${c.before.accuracy.toFixed(3)} ± ${c.before.se.toFixed(3)} | ${c.after.accuracy.toFixed(3)} ± ${c.after.se.toFixed(3)} | ${c.delta >= 0 ? '+' : ''}${c.delta.toFixed(3)} ± ${c.se.toFixed(3)}${c.worse ? ' (worse)' : ''} | ${pct(c.before.badFormat)} -> ${pct(c.after.badFormat)} |`,
    );
  say(
    [
      '',
      `| model | test accuracy | test reward | tool calls / question | training tool calls / prompt |`,
      `| --- | --- | --- | --- | --- |`,
      modelRow('SFT', result.sft),
      modelRow(`SFT + ARPO (${result.rl.steps} steps)`, result.rl, result.rl.trainToolCallsPerPrompt),
      ...(result.grpo ? [modelRow(`SFT + GRPO (${result.grpo.steps} steps)`, result.grpo, result.grpo.trainToolCallsPerPrompt)] : []),
      '',
      `| family | questions | SFT accuracy | after RL accuracy | change (± 1 SE) | bad format: SFT -> after RL |`,
      `| --- | --- | --- | --- | --- | --- |`,
      ...familyRows(families, result.grpo ? 'ARPO: ' : ''),
      ...(grpoFamilies ? familyRows(grpoFamilies, 'GRPO: ') : []),
      '',
      `report: ${report}`,
      `wall time: ${result.seconds.total.toFixed(0)} s (build ${result.seconds.build.toFixed(0)}, pretraining ${result.seconds.pretrain.toFixed(0)}, SFT ${result.seconds.sft.toFixed(0)}, RL ${result.seconds.rl.toFixed(0)}${result.seconds.grpo !== undefined ? `, GRPO ${result.seconds.grpo.toFixed(0)}` : ''})`,
    ].join('\n'),
  );
  return result;
}
