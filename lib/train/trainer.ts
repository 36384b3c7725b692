// The RL trainer: sample prompts -> rollout (ARPO tree or trajectory-level)
// -> rewards -> advantages (estimator + attribution) -> PPO epochs over
// mini-batches -> optimiser step -> metrics -> validation -> checkpoint.
//
// Deliberate departures from the paper / reference code (ARPO.md):
// - Entropy is exact over the full vocabulary (fused into the sampler), not the
//   reference's top-10 estimate (kept as an option: rollout.entropyEstimate).
// - The branch decision after tool call c uses the window after result c (the
//   reference decides one step late); the entropy baseline is per trajectory.
// - Branches fork the paged KV cache at the end of the tool result instead of
//   re-sending the prefix to an inference engine.
// - Budget refills are fresh global samples, never copies of a trajectory.
// - Over the tool-call limit a path ends without a forced, trained EOS.
// - Training runs on packed rollout trees (train.packing = tree): every shared
//   token (the prompt, shared response prefixes) is computed once, with the
//   loss and gradient of the flattened trajectories (lib/train/tree-batch.ts);
//   `flat` trains the flattened trajectories as the reference code does. Hard
//   attribution gives a shared token its mean advantage with weight 1/d per copy.
// - Old log-probs default to a recompute by the current policy before the update
//   (verl's default), with `train.oldLogprobs = rollout` to use the sampler's.
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import { ArpoError } from '../errors';
import { epochPermutation, type DatasetExample, type SamplerState } from '../data';
import type { PolicyModel, TrainSequence, TrainStepOptions } from '../model/policy-model';
import type { ToolRunner } from '../tools/runner';
import type { Tokenizer } from '../model/tokenizer';
import { rollout, tokenizerText, type RolloutDeps, type RolloutResult } from '../rollout';
import type { RewardFn } from '../reward';
import { attributeScores, microBatches, rolloutStepMetrics, scoreAndAttribute, scoreItems, stepMetrics, summarizeItems, type ScoredTrajectory } from './batch';
import { computeAdvantages, leafGroups, leafResponseLengths, PER_GROUP_ESTIMATORS } from '../algo';
import { packTrees } from '../rollout';
import { mergeRolloutMetrics } from '../rollout/metrics';
import { Dist } from './dist';
import { modelDevice, modelThreads, readLaunchEnv, type LaunchEnv } from './launch';
import { buildTrainTrees, recomputeTreeLogprobs, treeMicroBatches, treeTokenCounts } from './tree-batch';
import { openRunCheckpoints } from './checkpoint';
import type { RunConfig } from './config';
import { MetricsLog, Progress, truncateJsonlAfter, type StepMetrics } from './metrics';
import { writeReport } from './report';
import { TREE_VIEW_FILE, treeViews, writeTreeViews } from './tree-view';
import { buildReward, buildTools, loadDataset, loadPolicy, optimizerSettings, promptIds, rolloutDeps, rolloutSettings } from './setup';

export interface TrainOptions {
  /** Continue from the run directory's latest checkpoint. */
  resume?: boolean;
  /** Stop after this many steps of this process (for tests of resume); the schedule still spans train.steps. */
  stopAfter?: number;
  /** Where progress goes (default stderr). */
  progress?: { write(s: string): boolean; isTTY?: boolean };
  /** Write report.html at the end (default true). */
  report?: boolean;
  /**
   * Wraps each training step's rollout: `run` samples it as configured; the
   * hook may record what it returns or return a recorded one instead (tests
   * replay one set of rollouts to two configurations).
   */
  rollout?: (step: number, run: () => Promise<RolloutResult>) => Promise<RolloutResult>;
  /**
   * Called when a step is complete (metrics logged, validation and checkpoint
   * done): observers such as the soak bench read the model's cache here.
   */
  afterStep?: (step: number, state: { metrics: StepMetrics; model: PolicyModel; tools: ToolRunner }) => void | Promise<void>;
  /** This process's place in a data-parallel run (default: from the environment, lib/train/launch.ts). */
  launch?: LaunchEnv;
}

export interface TrainSummary {
  runDir: string;
  stepsDone: number;
  lastMetrics: StepMetrics;
  validation: StepMetrics[];
}

/** Stable hash of the options that change the numbers (train.outDir, train.distTimeoutS and progress excluded). */
export function configHash(cfg: RunConfig): string {
  const { train, ...rest } = cfg;
  // Where the run lives, how long ranks wait and what the report draws change no number of the run.
  const { outDir: _outDir, distTimeoutS: _timeout, reportTrees: _trees, ...trainRest } = train;
  return crypto.createHash('sha256').update(JSON.stringify({ ...rest, train: trainRest })).digest('hex').slice(0, 16);
}

/** Seed of one rollout: a hash of (run seed, phase, step[, part > 0]), so steps (and the chunks of one evaluation) never share random streams. */
export function stepSeed(seed: number, phase: 'train' | 'valid', step: number, part = 0): bigint {
  const h = crypto.createHash('sha256').update(part > 0 ? `${seed}:${phase}:${step}:${part}` : `${seed}:${phase}:${step}`).digest();
  return h.readBigUInt64LE(0);
}

/** The trainer's loss and optimiser options of a run configuration (also used by the bench). */
export function lossOptions(cfg: RunConfig): TrainStepOptions {
  const l = cfg.loss;
  return {
    mode: 'policy',
    loss: {
      clipLow: l.clipLow,
      clipHigh: l.clipHigh,
      dualClipC: l.dualClipC,
      klType: l.klType === 'low_var_kl' ? 'k3' : l.klType,
      klCoef: l.klCoef,
      entropyCoef: l.entropyCoef,
      aggregation: l.aggregation,
      temperature: cfg.rollout.temperature > 0 ? cfg.rollout.temperature : 1,
    },
    optimizer: optimizerSettings(cfg, cfg.optim.lr, cfg.train.steps),
  };
}

/** Means of several ranks' metrics, weighted by each part's `weightKey` (parts without it count 0). */
function weightedMetrics(parts: readonly StepMetrics[], weightKey: string): StepMetrics {
  const out: StepMetrics = {};
  const total = parts.reduce((a, p) => a + (p[weightKey] ?? 0), 0);
  if (total === 0) return out;
  for (const key of new Set(parts.flatMap((p) => Object.keys(p)))) {
    if (key === weightKey) continue;
    let s = 0;
    let w = 0;
    for (const p of parts) if (p[key] !== undefined) (s += p[key]! * (p[weightKey] ?? 0)), (w += p[weightKey] ?? 0);
    if (w > 0) out[key] = s / w;
  }
  out[weightKey] = total;
  return out;
}

function averageMetrics(list: readonly Record<string, number>[]): StepMetrics {
  const out: StepMetrics = {};
  if (list.length === 0) return out;
  for (const key of Object.keys(list[0]!)) {
    const vals = list.map((m) => m[key]).filter((v): v is number => typeof v === 'number' && Number.isFinite(v));
    if (vals.length) out[key] = vals.reduce((a, b) => a + b, 0) / vals.length;
  }
  return out;
}

/** Validation: greedy (n = 1, temperature 0, like the reference) unless `sampling` says otherwise; accuracy, reward and tool use (pass@K with several samples). */
export async function validate(
  tokenizer: Tokenizer,
  deps: RolloutDeps,
  examples: readonly DatasetExample[],
  reward: RewardFn,
  cfg: RunConfig,
  step: number,
  /** Samples per prompt and their temperature (default: one greedy sample, the validation of training). */
  sampling: { samples: number; temperature: number } = { samples: 1, temperature: 0 },
): Promise<{ metrics: StepMetrics; items: ScoredTrajectory[] }> {
  const { samples, temperature } = sampling;
  const items: ScoredTrajectory[] = [];
  const metrics: StepMetrics[] = [];
  const chunk = Math.max(1, Math.min(cfg.train.batchPrompts, 64));
  for (let i = 0; i < examples.length; i += chunk) {
    const batch = examples.slice(i, i + chunk);
    const prompts = batch.map((e) => promptIds(e, tokenizer, cfg.data.systemPrompt));
    const result = await rollout(deps, prompts, stepSeed(cfg.train.seed, 'valid', step, i), rolloutSettings(cfg, { mode: 'trajectory', budget: samples, initialSamples: samples, temperature }));
    const scored = await scoreAndAttribute(result, batch, tokenizer, reward, { estimator: 'grpo', attribution: 'soft', dynamicSampling: false });
    for (const it of scored.items) it.group += i; // prompt index within the whole evaluation set
    items.push(...scored.items);
    metrics.push({ ...rolloutStepMetrics(result, scored.items), weight: scored.items.length });
  }
  // Weighted by the number of examples in each chunk.
  const total = metrics.reduce((a, m) => a + (m.weight ?? 0), 0);
  const out: StepMetrics = {};
  for (const key of ['reward/mean', 'acc/mean', 'acc/exact', 'format/ok', 'response/length_mean', 'tools/calls_per_traj']) {
    let s = 0;
    let w = 0;
    for (const m of metrics) if (m[key] !== undefined) (s += m[key]! * m.weight!), (w += m.weight!);
    if (w > 0) out[key] = s / w;
  }
  out['valid/examples'] = samples > 1 ? examples.length : total;
  if (samples > 1) {
    // pass@K: per prompt the best of its K samples, averaged over prompts (acc/mean is pass@1 averaged over the samples).
    const best = new Float64Array(examples.length);
    for (const it of items) best[it.group] = Math.max(best[it.group]!, it.reward.accuracy);
    out[`acc/pass@${samples}`] = best.reduce((a, b) => a + b, 0) / Math.max(1, examples.length);
    out['valid/samples'] = samples;
    out['valid/temperature'] = temperature;
  }
  return { metrics: out, items };
}

/** Runs RL training as configured; returns when train.steps (or stopAfter) steps are done. */
export async function train(cfg: RunConfig, options: TrainOptions = {}): Promise<TrainSummary> {
  const launch = options.launch ?? readLaunchEnv();
  if (launch.world > 1) checkDataParallel(cfg, launch.world);
  return Dist.run(launch, cfg.train.distTimeoutS * 1000, (dist) => trainRanks(cfg, options, dist, launch));
}

/** What a data-parallel run cannot do, as config errors naming the field. */
function checkDataParallel(cfg: RunConfig, world: number): void {
  if (cfg.train.batchPrompts < world) {
    throw new ArpoError('BAD_CONFIG', `train.batchPrompts: ${cfg.train.batchPrompts} prompts cannot be shared by ${world} ranks (every rank needs at least one)`);
  }
}

/**
 * Data parallel with an estimator that looks beyond a prompt's group
 * (reinforce++ whitens over the whole batch): every rank's leaf rewards,
 * groups and response lengths gathered in rank order (= the global batch's
 * leaf order), the estimator run once over them, this rank's slice returned.
 * Per-group estimators, and one process: undefined (computed locally).
 */
async function globalLeafAdvantages(dist: Dist, estimator: string, result: RolloutResult, items: readonly ScoredTrajectory[]): Promise<Float64Array | undefined> {
  if (!dist.distributed || PER_GROUP_ESTIMATORS.has(estimator)) return undefined;
  const packed = packTrees(result.trees);
  const mine = { rewards: items.map((i) => i.reward.score), groups: leafGroups(packed).map((g) => `${dist.rank}:${g}`), lengths: leafResponseLengths(packed) };
  const parts = await dist.allgather(mine);
  const all = computeAdvantages(estimator, { rewards: parts.flatMap((p) => p.rewards), groups: parts.flatMap((p) => p.groups), responseLengths: parts.flatMap((p) => p.lengths) });
  let offset = 0;
  for (let r = 0; r < dist.rank; r++) offset += parts[r]!.rewards.length;
  return all.slice(offset, offset + mine.rewards.length);
}

/**
 * The trainer on one rank (a world of 1: the whole run). Rank r rolls out and
 * trains its block of each step's prompts (Dist.shard), with random streams
 * keyed by the global prompt index; the PPO mini-batches are cut from the
 * global permutation of the step's surviving prompts, and each rank trains
 * its part of each (the model sums the gradients). Rank 0 alone writes the
 * run directory, after setting it up before the others (rootFirst).
 */
async function trainRanks(cfg: RunConfig, options: TrainOptions, dist: Dist, launch: LaunchEnv): Promise<TrainSummary> {
  // ---------------------------------------------------------------- init
  const runDir = path.resolve(cfg.train.outDir);
  const hash = configHash(cfg);
  const root = dist.isRoot;
  const { ckpt, latest } = await dist.rootFirst(() => {
    fs.mkdirSync(runDir, { recursive: true });
    const opened = openRunCheckpoints(runDir, hash, options.resume === true);
    if (root) {
      if (!options.resume && fs.existsSync(path.join(runDir, 'metrics.jsonl'))) fs.rmSync(path.join(runDir, 'metrics.jsonl'));
      if (!options.resume) for (const f of ['rollout-trace.jsonl', TREE_VIEW_FILE]) fs.rmSync(path.join(runDir, f), { force: true });
      fs.writeFileSync(path.join(runDir, 'config.json'), `${JSON.stringify(cfg, null, 2)}\n`);
    }
    return opened;
  });

  if (!cfg.model.path) throw new ArpoError('BAD_CONFIG', 'config: model.path is required');
  if (!cfg.data.train) throw new ArpoError('BAD_CONFIG', 'config: data.train is required');
  // The tools first: a sandbox that refuses to start (or a bad dataset or
  // reward) fails before the model is loaded, and every later failure still
  // closes them. Rank 0 first: it builds the search index the others open.
  const tools = await dist.rootFirst(() => buildTools(cfg, runDir));
  let opened: PolicyModel | null = null;
  try {
    // What the run's tools really are, for whoever reads the run later (a weaker sandbox is never silent).
    if (tools.python) {
      const weak = tools.python.level !== 'full' ? ' (weaker than full isolation, accepted by tools.python.isolation: basic)' : '';
      (options.progress ?? process.stderr).write(`python sandbox: ${tools.python.summary}${weak}\n`);
    }
    if (root) fs.writeFileSync(
      path.join(runDir, 'run.json'),
      `${JSON.stringify({ startedAt: new Date().toISOString(), resumedFromStep: latest ? latest.state.step : null, configHash: hash, tools: { python: tools.python ? { level: tools.python.level, summary: tools.python.summary, missing: tools.python.missing } : null } }, null, 2)}\n`,
    );
    const reward = await buildReward(cfg);
    const trainSet = await loadDataset(cfg.data.train, cfg);
    const validSet = cfg.data.valid ? await loadDataset(cfg.data.valid, cfg, cfg.data.validLimit) : null;
    if (trainSet.size < cfg.train.batchPrompts) {
      throw new ArpoError('BAD_CONFIG', `train.batchPrompts: ${cfg.train.batchPrompts} exceeds the ${trainSet.size} examples of ${cfg.data.train}`);
    }
    // Ranks on one node share its cores unless model.threads says otherwise.
    const threads = modelThreads(cfg.model.threads, launch);
    const { model, tokenizer } = await loadPolicy(latest ? path.join(latest.dir, 'model') : cfg.model.path, {
      ...cfg,
      model: { ...cfg.model, threads, device: modelDevice(cfg.model.device, launch), tokenizer: cfg.model.tokenizer ?? cfg.model.path },
    });
    opened = model;
    // A resumed run's KL reference is the run's initial policy, as in an uninterrupted run (not the checkpoint's weights).
    if (latest && cfg.loss.klCoef !== 0) await model.loadReference(cfg.model.path);
    await dist.attach(model); // rank 0's weights everywhere; train steps sum over the ranks
    const sampler = trainSet.sampler({ batchSize: cfg.train.batchPrompts, seed: cfg.train.seed, shuffle: cfg.data.shuffle });
    if (latest) sampler.restore(latest.state.dataCursor as SamplerState);
    const deps = rolloutDeps(model, tokenizer, tools.runner, cfg.model.path);
    const log = new MetricsLog(runDir);
    const startStep = latest ? latest.state.step : 0;
    if (latest && root) {
      log.truncateAfter(startStep);
      truncateJsonlAfter(path.join(runDir, 'rollout-trace.jsonl'), startStep);
    }
    // Other ranks are quiet unless given their own sink (their errors still reach stderr).
    const progress = new Progress(cfg.train.steps, options.progress ?? (root ? process.stderr : { write: () => true }));
    const stepOptions = lossOptions(cfg);
    const started = Date.now();
    const validation: StepMetrics[] = [];
    let lastMetrics: StepMetrics = {};

    const saveCheckpoint = async (step: number): Promise<void> => {
      if (root) {
        await ckpt.save({ version: 1, step, dataCursor: sampler.state(), seed: cfg.train.seed, configHash: hash }, (dir) =>
          model.save(dir, { optimizer: true, tokenizerDir: cfg.model.tokenizer ?? cfg.model.path ?? undefined }),
        );
      }
      await dist.barrier(); // no rank runs ahead of the checkpoint it would resume from
    };
    const runValidation = async (step: number): Promise<void> => {
      if (!validSet) return;
      // Each rank validates its block of the examples; the means are weighted by examples.
      const { lo, hi } = dist.shard(validSet.examples.length);
      const mine = lo < hi ? (await validate(tokenizer, deps, validSet.examples.slice(lo, hi), reward, cfg, step)).metrics : {};
      const v = { metrics: dist.distributed ? weightedMetrics(await dist.allgather(mine), 'valid/examples') : mine };
      validation.push(v.metrics);
      if (root) log.append({ step, phase: 'valid', time: (Date.now() - started) / 1000, metrics: v.metrics });
      progress.message(`valid step ${step} | reward ${v.metrics['reward/mean']?.toFixed(3)} | acc ${v.metrics['acc/mean']?.toFixed(3)} | tool calls ${v.metrics['tools/calls_per_traj']?.toFixed(2)}`);
    };

    if (startStep === 0 && cfg.train.validateEvery > 0) await runValidation(0);
    if (latest) {
      progress.message(
        startStep >= cfg.train.steps
          ? `resume: ${runDir} is already at step ${startStep} of ${cfg.train.steps}, nothing to do`
          : `resume: from step ${startStep} of ${cfg.train.steps} (${path.join(runDir, 'checkpoints')})`,
      );
    }
    const lastStep = options.stopAfter ? Math.min(cfg.train.steps, startStep + options.stopAfter) : cfg.train.steps;
    for (let step = startStep + 1; step <= lastStep; step++) {
      // ------------------------------------------------------------ rollout
      const commAtStart = dist.commMs;
      let commSeconds = 0;
      const batch = sampler.next();
      // This rank's block of the step's prompts; streams keyed by the global index.
      const { lo, hi } = dist.shard(batch.length);
      const examples = batch.slice(lo, hi);
      const prompts = examples.map((e) => promptIds(e, tokenizer, cfg.data.systemPrompt));
      const streamKeys = examples.map((_, i) => lo + i);
      const run = () => rollout(deps, prompts, stepSeed(cfg.train.seed, 'train', step), rolloutSettings(cfg), { streamKeys });
      const result = options.rollout ? await options.rollout(step, run) : await run();
      if (result.trace && root) {
        // One line per step: where the time went, then every engine and tool call (times in ms from the rollout's start).
        const m = result.metrics;
        const line = { step, mode: m.mode, wallMs: m.wallMs, modelMs: m.modelMs, toolWaitMs: m.toolWaitMs, slotMs: m.slotMs, engineCalls: result.trace.engineCalls, toolCalls: result.trace.toolCalls };
        fs.appendFileSync(path.join(runDir, 'rollout-trace.jsonl'), `${JSON.stringify(line)}\n`);
      }
      // ------------------------------------------------------------ rewards and advantages
      const items = await scoreItems(result, examples, tokenizer, reward);
      const scored = attributeScores(result, items, {
        estimator: cfg.algorithm.estimator,
        attribution: cfg.algorithm.attribution,
        dynamicSampling: cfg.algorithm.dynamicSampling,
        leafAdvantages: await globalLeafAdvantages(dist, cfg.algorithm.estimator, result, items),
      });
      if (root && cfg.train.reportTrees > 0) writeTreeViews(runDir, treeViews(step, result, scored, examples, tokenizerText(tokenizer), cfg.train.reportTrees));
      const t0 = Date.now();
      const tree = cfg.train.packing === 'tree';
      const temperature = stepOptions.loss!.temperature!;
      let sequences: TrainSequence[] = scored.sequences;
      const trees = tree ? buildTrainTrees(result, scored, cfg.loss.aggregation) : [];
      if (cfg.train.oldLogprobs === 'recompute') {
        if (tree) {
          await recomputeTreeLogprobs(model, trees, cfg.train.microBatchTokens, temperature);
        } else if (sequences.length > 0) {
          const scores = await model.logprobs(sequences.map((s) => s.tokens), { temperature });
          sequences = sequences.map((s, i) => ({ ...s, oldLogprobs: scores.logprobs[i]! }));
        }
      }
      // ------------------------------------------------------------ PPO epochs over mini-batches of prompts
      const updates: Record<string, number>[] = [];
      // Prompts (groups) are numbered by their index in the step's batch on every rank.
      let groups = tree ? trees.map((t) => t.group + lo) : [...new Set(scored.sequenceGroups.map((g) => g + lo))];
      if (dist.distributed) {
        const kept = new Float64Array(batch.length);
        for (const g of groups) kept[g] = 1;
        const all = await dist.allreduceSum(kept);
        groups = [];
        for (let g = 0; g < all.length; g++) if (all[g]! > 0) groups.push(g);
      }
      for (let epoch = 0; epoch < cfg.train.ppoEpochs; epoch++) {
        // Mini-batch order: a seeded permutation per (step, epoch), the data sampler's own shuffle.
        const order = Array.from(epochPermutation(groups.length, cfg.train.seed, step * 1000 + epoch), (i) => groups[i]!);
        for (let g = 0; g < order.length; g += cfg.train.miniBatchPrompts) {
          const mini = new Set(order.slice(g, g + cfg.train.miniBatchPrompts));
          // A rank whose share of the mini-batch is empty still takes part in the step (data parallel).
          let m;
          if (tree) {
            const mt = trees.filter((t) => mini.has(t.group + lo));
            if (mt.length === 0 && !dist.distributed) continue;
            m = await model.trainTreeStep(treeMicroBatches(mt, cfg.train.microBatchTokens).map((p) => p.batch), { loss: stepOptions.loss, optimizer: stepOptions.optimizer });
          } else {
            const seqs = sequences.filter((_, i) => mini.has(scored.sequenceGroups[i]! + lo));
            if (seqs.length === 0 && !dist.distributed) continue;
            m = await model.trainStep(microBatches(seqs, cfg.train.microBatchTokens), stepOptions);
          }
          updates.push({
            'actor/loss': m.loss,
            'actor/pg_loss': m.pgLoss,
            'actor/pg_clipfrac': m.pgClipfrac,
            'actor/pg_clipfrac_lower': m.pgClipfracLower,
            'actor/ppo_kl': m.ppoKl,
            'actor/entropy': m.entropy,
            'actor/grad_norm': m.gradNorm,
            'actor/lr': m.lr,
            'actor/skipped': m.skipped ? 1 : 0,
          });
          commSeconds += m.commSeconds;
        }
      }
      let packedTokens = tree ? treeTokenCounts(trees) : null;
      // ------------------------------------------------------------ metrics
      // Data parallel: the rollout metrics of every rank's block, merged (the update metrics are global already).
      let rolloutMetrics: StepMetrics;
      let dropped = scored.droppedGroups;
      if (dist.distributed) {
        const parts = await dist.allgather({ m: result.metrics, items: summarizeItems(scored.items), dropped, packedTokens });
        rolloutMetrics = stepMetrics(mergeRolloutMetrics(parts.map((p) => p.m)), parts.flatMap((p) => p.items));
        dropped = parts.reduce((a, p) => a + p.dropped, 0);
        if (packedTokens) packedTokens = { unique: parts.reduce((a, p) => a + p.packedTokens!.unique, 0), flattened: parts.reduce((a, p) => a + p.packedTokens!.flattened, 0) };
      } else {
        rolloutMetrics = rolloutStepMetrics(result, scored.items);
      }
      lastMetrics = {
        ...rolloutMetrics,
        ...averageMetrics(updates),
        'actor/updates': updates.length,
        'data/dropped_groups': dropped,
        'time/train_s': (Date.now() - t0) / 1000,
        ...(dist.distributed ? { 'time/allreduce_s': commSeconds + (dist.commMs - commAtStart) / 1000 } : {}),
        ...(packedTokens ? { 'train/unique_token_ratio': packedTokens.flattened > 0 ? packedTokens.unique / packedTokens.flattened : 1 } : {}),
      };
      if (root) log.append({ step, phase: 'train', time: (Date.now() - started) / 1000, metrics: lastMetrics });
      progress.step(step, lastMetrics);
      // ------------------------------------------------------------ validation and checkpoint
      if (cfg.train.validateEvery > 0 && step % cfg.train.validateEvery === 0) await runValidation(step);
      if ((cfg.train.checkpointEvery > 0 && step % cfg.train.checkpointEvery === 0) || step === cfg.train.steps || step === lastStep) {
        await saveCheckpoint(step);
      }
      if (options.afterStep) await options.afterStep(step, { metrics: lastMetrics, model, tools: tools.runner });
    }
    if (options.report !== false && root) await writeReport([runDir]);
    return { runDir, stepsDone: lastStep - startStep, lastMetrics, validation };
  } finally {
    await tools.close();
    opened?.dispose();
  }
}
