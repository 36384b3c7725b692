// End-to-end part of `npm run bench`: ARPO against trajectory-level GRPO on the
// embedded demo world, from one cached SFT checkpoint, at the same budget M,
// batch, prompts and seed; each (seed, mode) run in a fresh process, the modes
// interleaved seed by seed; medians and spreads over seeds.
import * as fs from 'fs';
import * as path from 'path';
import { demoCheckpoint, type DemoCheckpoint } from './e2e-checkpoint';
import type { E2ERunResult, E2ERunSpec } from './e2e-run';
import { lastJson, num, runChild, spread, table, withSpread, type Spread } from './summary';
import type { Target } from './kernels';

export interface E2EOptions {
  quick: boolean;
  root: string;
  cacheDir: string;
  workDir: string;
  seeds: number[];
  steps: number;
  /** Also run ARPO with rollout.speculativeRefills on (refills decoded from the start), for what speculation buys. */
  refillsAblation?: boolean;
  log: (line: string) => void;
}

/** `arpo-spec`: ARPO with rollout.speculativeRefills on (the ablation; off by default). */
export type RunVariant = 'arpo' | 'arpo-spec' | 'trajectory';

/** The numbers one run contributes (per-step means over its training steps). */
export interface RunSummary {
  mode: 'arpo' | 'trajectory';
  variant: RunVariant;
  seed: number;
  values: Record<MetricKey, number>;
}

const METRICS = {
  trajectoriesPerSecond: 'rollout: trajectories / s',
  tokensPerTrajectory: 'rollout: tokens generated per trajectory',
  uniqueTokenRatio: 'rollout: unique / total response tokens',
  toolCallsExecutedPerPrompt: 'rollout: tool calls executed per prompt',
  toolCallsPerTrajectory: 'rollout: tool calls per trajectory (incl. shared prefix)',
  tokensComputedPerTrajectory: 'rollout: tokens computed (prefill + decode) per trajectory',
  branchEventsPerPrompt: 'rollout: branch events per prompt (of M - N extra paths)',
  modelSecondsPerStep: 'rollout: time in model, s / step',
  toolSecondsPerStep: 'rollout: time in tools, s / step (overlaps decoding)',
  rolloutSecondsPerStep: 'rollout: wall time, s / step',
  engineCallsPerStep: 'rollout: engine calls / step',
  rowsPerEngineCall: 'rollout: paths (rows) per engine call',
  modelMsPerToken: 'rollout: model ms per token computed',
  toolWaitSecondsPerStep: 'rollout: no engine call, every ready path waiting for tools, s / step',
  slotsDecode: 'rollout slots: share decoding in a call',
  slotsReady: 'rollout slots: share ready, left out of a call (batch limits)',
  slotsTool: 'rollout slots: share waiting for a tool result',
  slotsGrant: 'rollout slots: share held for a branch grant',
  slotsSpeculative: 'rollout slots: share not started, a speculative refill decoding for it',
  slotsUnused: 'rollout slots: share not started (a later branch or refill)',
  speculativeDroppedPerTrajectory: 'rollout: speculative refill tokens computed and dropped, per trajectory (not in tokens computed)',
  trainTokensPerSecond: 'train step: tokens computed / s (fwd + fused loss + bwd + AdamW; packed trees: unique tokens)',
  trainSecondsPerStep: 'train phase: s / step (old-logprob recompute + updates)',
  trainPeakExtraMiB: 'train step: peak RSS rise, MiB',
  processPeakMiB: 'run: process peak RSS, MiB',
  trainReward: 'train rollouts: mean reward',
  trainFormatOk: 'train rollouts: format ok (no signal when ~0: every reward -1)',
  validAccuracy: 'held-out: accuracy (F1) after training',
  validReward: 'held-out: reward after training',
  validToolCalls: 'held-out: tool calls per question',
  validToolCallsPerCorrect: 'held-out: tool calls per correct answer',
} as const;
type MetricKey = keyof typeof METRICS;

export interface E2EResult {
  checkpoint: DemoCheckpoint;
  checkpointUsesTools: boolean;
  /** Tool calls per trajectory in the checkpoint's sampled rollouts (step 1 of the GRPO runs), over seeds. */
  sampledToolCalls: Spread;
  settings: E2ERunResult['settings'] & { steps: number; seeds: number[] };
  runs: RunSummary[];
  raw: E2ERunResult[];
  metrics: Record<MetricKey, { arpo: Spread; trajectory: Spread; ratio: Spread }>;
  /** With refillsAblation: ARPO with speculative refills, and speculative / default per seed. */
  ablation?: Record<MetricKey, { arpoSpec: Spread; ratio: Spread }>;
  targets: Target[];
}

const mean = (xs: readonly number[]): number => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN);
const sumOf = (rows: readonly Record<string, number>[], key: string): number => rows.reduce((a, r) => a + (r[key] ?? 0), 0);
const meanOf = (rows: readonly Record<string, number>[], key: string): number => mean(rows.map((r) => r[key]).filter((v): v is number => v !== undefined));

export function summariseRun(r: E2ERunResult): RunSummary {
  const t = r.train;
  const final = r.valid.filter((v) => v.step > 0).pop()?.metrics ?? {};
  const correct = final['acc/exact'] ?? NaN;
  const values: Record<MetricKey, number> = {
    trajectoriesPerSecond: sumOf(t, 'rollout/trajectories') / sumOf(t, 'time/rollout_s'),
    tokensPerTrajectory: sumOf(t, 'rollout/tokens_generated') / sumOf(t, 'rollout/trajectories'),
    uniqueTokenRatio: meanOf(t, 'rollout/unique_token_ratio'),
    toolCallsExecutedPerPrompt: meanOf(t, 'tools/executed_per_prompt'),
    toolCallsPerTrajectory: meanOf(t, 'tools/calls_per_traj'),
    tokensComputedPerTrajectory: sumOf(t, 'rollout/tokens_computed') / sumOf(t, 'rollout/trajectories'),
    branchEventsPerPrompt: sumOf(t, 'rollout/branch_events') / (t.length * r.settings.batchPrompts),
    modelSecondsPerStep: meanOf(t, 'time/model_s'),
    toolSecondsPerStep: meanOf(t, 'time/tools_s'),
    rolloutSecondsPerStep: meanOf(t, 'time/rollout_s'),
    engineCallsPerStep: meanOf(t, 'time/engine_calls'),
    rowsPerEngineCall: meanOf(t, 'time/rows_per_call'),
    modelMsPerToken: meanOf(t, 'time/model_ms_per_token'),
    toolWaitSecondsPerStep: meanOf(t, 'time/tool_wait_s'),
    slotsDecode: meanOf(t, 'time/slots_decode'),
    slotsReady: meanOf(t, 'time/slots_ready'),
    slotsTool: meanOf(t, 'time/slots_tool'),
    slotsGrant: meanOf(t, 'time/slots_grant'),
    slotsSpeculative: meanOf(t, 'time/slots_speculative'),
    slotsUnused: meanOf(t, 'time/slots_unused'),
    speculativeDroppedPerTrajectory: sumOf(t, 'time/speculative_tokens_dropped') / sumOf(t, 'rollout/trajectories'),
    trainTokensPerSecond: r.trainStep.seconds > 0 ? r.trainStep.tokens / r.trainStep.seconds : NaN,
    trainSecondsPerStep: meanOf(t, 'time/train_s'),
    trainPeakExtraMiB: r.trainStep.peakExtraRssBytes / 2 ** 20,
    processPeakMiB: r.maxRssBytes / 2 ** 20,
    trainReward: meanOf(t, 'reward/mean'),
    trainFormatOk: meanOf(t, 'format/ok'),
    validAccuracy: final['acc/mean'] ?? NaN,
    validReward: final['reward/mean'] ?? NaN,
    validToolCalls: final['tools/calls_per_traj'] ?? NaN,
    // Total tool calls over the number of exactly correct answers (NaN when none is correct).
    validToolCallsPerCorrect: correct > 0 ? (final['tools/calls_per_traj'] ?? NaN) / correct : NaN,
  };
  const variant: RunVariant = r.spec.mode === 'trajectory' ? 'trajectory' : r.spec.speculativeRefills === true ? 'arpo-spec' : 'arpo';
  return { mode: r.spec.mode, variant, seed: r.spec.seed, values };
}

async function runOne(o: E2EOptions, spec: E2ERunSpec): Promise<E2ERunResult> {
  const args = ['-r', 'ts-node/register/transpile-only', path.join(o.root, 'bench', 'e2e-run.ts'), JSON.stringify(spec)];
  const r = await runChild(process.execPath, args, { cwd: o.root, echo: true });
  if (r.code !== 0) throw new Error(`e2e run ${spec.mode} seed ${spec.seed} failed (exit ${r.code}): ${r.stderr.trim().split('\n').slice(-5).join('\n')}`);
  return lastJson<E2ERunResult>(r.stdout, `e2e run ${spec.mode} seed ${spec.seed}`);
}

/** The bench's SFT checkpoint (cached): the e2e comparison and the packing bench start from it. */
export function benchCheckpoint(o: { quick: boolean; cacheDir: string; log: (line: string) => void }): Promise<DemoCheckpoint> {
  // One checkpoint for every seed: the seeds vary data order, sampling and branching, not the weights.
  return demoCheckpoint({
    cacheDir: o.cacheDir,
    worldSeed: 1,
    traces: o.quick ? 400 : 800,
    // Full: the demo's own recipe (lib/cli/demo.ts). Quick: the demo's --quick pretraining and 4 SFT
    // epochs (~100 steps), enough for the tiny model to write tool calls but not to copy names and
    // numbers; its learning rows are not meaningful (see the accuracy of the checkpoint).
    sftEpochs: o.quick ? 4 : null,
    quickPretrain: o.quick,
    checkExamples: o.quick ? 16 : 48,
    log: o.log,
  });
}

export async function runE2EBench(o: E2EOptions): Promise<E2EResult> {
  const checkpoint = await benchCheckpoint(o);
  const usesTools = checkpoint.check.toolCallsPerTrajectory > 0.5;
  o.log(
    `[bench] e2e: SFT checkpoint on ${checkpoint.check.examples} held-out questions: accuracy ${num(checkpoint.check.accuracy, 3)}, ` +
      `reward ${num(checkpoint.check.reward, 3)}, tool calls / trajectory ${num(checkpoint.check.toolCallsPerTrajectory, 2)}` +
      (usesTools ? '' : '  <-- below 0.5: the model barely calls tools, so the tool-call comparison below is not meaningful'),
  );
  const raw: E2ERunResult[] = [];
  for (const [i, seed] of o.seeds.entries()) {
    // The seed's runs are processes that take turns one step at a time (bench/lockstep.ts): a drift of
    // the shared machine's speed within minutes hits every mode's steps alike. Which goes first alternates.
    const variants: RunVariant[] = o.refillsAblation ? ['arpo', 'trajectory', 'arpo-spec'] : ['arpo', 'trajectory'];
    if (i % 2 === 1) variants.reverse();
    const lockDir = path.join(o.workDir, `lockstep-seed${seed}`);
    fs.rmSync(lockDir, { recursive: true, force: true });
    fs.mkdirSync(lockDir, { recursive: true });
    const what = (v: RunVariant): string => (v === 'arpo' ? 'ARPO' : v === 'arpo-spec' ? 'ARPO (speculative refills)' : 'GRPO (trajectory-level)');
    o.log(`[bench] e2e: seed ${seed}: ${variants.map(what).join(', ')} in lockstep (one step at a time, in that order), ${o.steps} steps each`);
    const specs = variants.map((variant, index): E2ERunSpec => {
      const mode = variant === 'trajectory' ? 'trajectory' : 'arpo';
      const runDir = path.join(o.workDir, `${variant}-seed${seed}`);
      const spec: E2ERunSpec = { envDir: checkpoint.envDir, modelDir: checkpoint.modelDir, runDir, seed, mode, steps: o.steps, quick: o.quick };
      if (variant === 'arpo-spec') spec.speculativeRefills = true;
      spec.lockstep = { dir: lockDir, index, count: variants.length };
      return spec;
    });
    raw.push(...(await Promise.all(specs.map((spec) => runOne(o, spec)))));
  }
  const runs = raw.map(summariseRun);
  // The checkpoint's tool use when sampling (temperature 1, as training does): step 1 of the GRPO runs,
  // whose rollouts come from the untouched checkpoint. Greedy tool use alone can hide a policy that
  // rarely calls tools when it samples, and ARPO branches only after tool calls.
  const sampledToolCalls = spread(raw.filter((r) => r.spec.mode === 'trajectory').map((r) => r.train[0]?.['tools/calls_per_traj'] ?? NaN));
  const metrics = {} as E2EResult['metrics'];
  const ablation = o.refillsAblation ? ({} as NonNullable<E2EResult['ablation']>) : undefined;
  for (const key of Object.keys(METRICS) as MetricKey[]) {
    const of = (variant: RunVariant): number[] => runs.filter((r) => r.variant === variant).map((r) => r.values[key]);
    const value = (s: number, variant: RunVariant): number => runs.find((r) => r.seed === s && r.variant === variant)?.values[key] ?? NaN;
    const ratios = o.seeds.map((s) => value(s, 'arpo') / value(s, 'trajectory'));
    metrics[key] = { arpo: spread(of('arpo')), trajectory: spread(of('trajectory')), ratio: spread(ratios) };
    if (ablation) ablation[key] = { arpoSpec: spread(of('arpo-spec')), ratio: spread(o.seeds.map((s) => value(s, 'arpo-spec') / value(s, 'arpo'))) };
  }
  const tc = metrics.toolCallsExecutedPerPrompt;
  const everySeed = o.seeds.every((s) => {
    const a = runs.find((r) => r.seed === s && r.mode === 'arpo')?.values.toolCallsExecutedPerPrompt ?? NaN;
    const g = runs.find((r) => r.seed === s && r.mode === 'trajectory')?.values.toolCallsExecutedPerPrompt ?? NaN;
    return a < g;
  });
  // "Clearly below": lower on every seed (paired: same prompts, seed and M) and at least 10% lower in the
  // median ratio. (The paper reports about half the tool calls, at M = 16, N = 8 on real tasks.)
  const samplesTools = sampledToolCalls.median > 0.5;
  const met = usesTools && samplesTools && tc.ratio.median <= 0.9 && everySeed;
  const wall = metrics.rolloutSecondsPerStep;
  const targets: Target[] = [
    {
      name: "ARPO's tool calls executed per prompt clearly below GRPO's at equal M (lower on every seed, median ratio <= 0.9)",
      met,
      detail:
        `ARPO ${withSpread(tc.arpo)} vs GRPO ${withSpread(tc.trajectory)} (ratio ${withSpread(tc.ratio)}; lower on every seed: ${everySeed ? 'yes' : 'no'})` +
        (usesTools ? '' : `; checkpoint calls tools ${num(checkpoint.check.toolCallsPerTrajectory, 2)} / trajectory < 0.5, not meaningful`) +
        (samplesTools ? '' : `; sampled rollouts of the checkpoint call tools only ${num(sampledToolCalls.median, 2)} / trajectory: too few tool calls to branch after`),
    },
    {
      name: 'ARPO / GRPO tool calls executed per prompt <= 0.8 (median over seeds)',
      met: usesTools && tc.ratio.median <= 0.8,
      detail: `ratio ${withSpread(tc.ratio)}`,
    },
    {
      name: 'ARPO / GRPO rollout wall time per step <= 0.85 (median over seeds)',
      met: wall.ratio.median <= 0.85,
      detail: `ARPO ${withSpread(wall.arpo)} s vs GRPO ${withSpread(wall.trajectory)} s (ratio ${withSpread(wall.ratio)})`,
    },
  ];
  return {
    checkpoint,
    checkpointUsesTools: usesTools,
    sampledToolCalls,
    settings: { ...raw[0]!.settings, steps: o.steps, seeds: o.seeds },
    runs,
    raw,
    metrics,
    ...(ablation ? { ablation } : {}),
    targets,
  };
}

/** The markdown of the end-to-end part. */
export function e2eTables(r: E2EResult): string {
  const c = r.checkpoint;
  const s = r.settings;
  const lines: string[] = [];
  lines.push(
    `Demo world seed ${c.worldSeed}; model: the demo's Qwen3-layout decoder (hidden 128, 4 layers) after ${c.pretrain.steps} steps of copy / recall pretraining and SFT on ${c.sft.traces} traces x ${c.sft.epochs} epochs ` +
      `(${c.sft.steps} steps, loss ${num(c.sft.firstLoss, 2)} -> ${num(c.sft.lastLoss, 2)}). ` +
      `SFT checkpoint on ${c.check.examples} held-out questions (greedy): accuracy ${num(c.check.accuracy, 3)}, reward ${num(c.check.reward, 3)}, ` +
      `format ok ${num(c.check.formatOk, 2)}, tool calls / trajectory ${num(c.check.toolCallsPerTrajectory, 2)}${r.checkpointUsesTools ? ' (> 0.5: uses tools)' : ' (< 0.5: tool counts below are NOT meaningful)'}; ` +
      `sampled (temperature 1, step-1 GRPO rollouts): ${withSpread(r.sampledToolCalls, 2)} tool calls / trajectory${r.sampledToolCalls.median > 0.5 ? '' : ' (< 0.5: ARPO has few tool results to branch after)'}.`,
  );
  lines.push(
    `Both modes: M = ${s.budget} trajectories per prompt (ARPO: N = ${s.initialSamples} global samples, then entropy branching; budget left over ` +
      `is refilled with fresh global samples), ${s.batchPrompts} prompts per step, tool-call limit ${s.toolCallLimit}, ${s.maxResponseTokens} response tokens, ` +
      `${s.steps} steps, the same prompts and seeds (${s.seeds.join(', ')}), GRPO advantages (soft attribution), held-out = ${s.validExamples} valid questions. ` +
      `A seed's runs are separate processes that take turns one training step at a time (rollout + update; bench/lockstep.ts), so the machine's drifts hit both modes' steps alike. ` +
      `Cells: median [min, max] over seeds; ratio = median over seeds of ARPO / GRPO.`,
  );
  const digits: Partial<Record<MetricKey, number>> = { engineCallsPerStep: 0, rowsPerEngineCall: 1, modelMsPerToken: 3, trajectoriesPerSecond: 2, tokensPerTrajectory: 1, tokensComputedPerTrajectory: 1, trainTokensPerSecond: 0, trainPeakExtraMiB: 1, processPeakMiB: 0 };
  const ab = r.ablation;
  const rows = (Object.keys(METRICS) as MetricKey[]).map((k) => {
    const m = r.metrics[k];
    const d = digits[k] ?? 3;
    const row = [METRICS[k], withSpread(m.arpo, d), withSpread(m.trajectory, d), withSpread(m.ratio, 2)];
    if (ab) row.push(withSpread(ab[k].arpoSpec, d), withSpread(ab[k].ratio, 2));
    return row;
  });
  if (ab) {
    lines.push(
      'Ablation (`--refills-ablation`): ARPO also run with `rollout.speculativeRefills: true`, i.e. a prompt\'s M - N possible refills decode from the start up to their first tool call and the ones it needs are kept (the same trees and tool calls; only when their tokens are computed differs). Last column: that run / ARPO, per seed.',
    );
  }
  const header = ['metric', 'ARPO', 'GRPO (trajectory-level)', 'ARPO / GRPO'];
  if (ab) header.push('ARPO, speculative refills', 'speculative / ARPO');
  lines.push(table(header, rows));
  return lines.join('\n\n');
}
