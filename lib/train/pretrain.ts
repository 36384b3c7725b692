// Pretraining on a stream of synthetic sequences (the demo's copy / recall
// curriculum, lib/envs/demo/pretrain.ts): masked token cross-entropy like
// SFT, but each step draws fresh sequences, so there are steps, not epochs.
import { invalidArgument } from '../errors';
import type { PolicyModel, TrainSequence } from '../model/policy-model';
import { MetricsLog, Progress, type StepMetrics } from './metrics';
import { Dist } from './dist';

export interface PretrainSettings {
  /** Optimiser steps. */
  steps: number;
  /** Sequences per step. */
  batchSequences: number;
  /** Peak learning rate (AdamW), reached after warmupSteps of linear warmup, then constant. */
  lr: number;
  warmupSteps: number;
  weightDecay: number;
}

export interface PretrainSummary {
  steps: number;
  /** Mean loss of the first and of the last 50 steps (single steps are noisy). */
  firstLoss: number;
  lastLoss: number;
  seconds: number;
}

const WINDOW = 50;

/**
 * Trains `model` in place for settings.steps steps on `next(batchSequences)`;
 * logs `phase: 'pretrain'` metrics into <runDir>/pretrain-metrics.jsonl and a
 * progress line every 50 steps.
 *
 * Data parallel (`dist` of several ranks, the model attached to its group):
 * every rank draws the same batch from its own copy of the seeded stream and
 * trains its contiguous block of it (Dist.shard); the model sums the
 * gradients, so the steps are those of one process on the whole batch. Rank 0
 * alone logs, shows progress and calibrates.
 */
export async function runPretrain(
  model: PolicyModel,
  next: (size: number) => readonly TrainSequence[],
  settings: PretrainSettings,
  runDir: string,
  progressOut: { write(s: string): boolean; isTTY?: boolean } = process.stderr,
  /**
   * Called once with the mean wall time of steps skip+1 .. skip+steps
   * (default 5 and 20: the first steps also pay for allocation and warm-up):
   * a caller's time estimate. With fewer steps, the steps there are.
   */
  calibrate?: { skip?: number; steps?: number; done(secondsPerStep: number): void },
  dist: Dist = Dist.single(),
): Promise<PretrainSummary> {
  for (const k of ['steps', 'batchSequences', 'warmupSteps'] as const) {
    if (!Number.isInteger(settings[k]) || settings[k] < (k === 'warmupSteps' ? 0 : 1)) throw invalidArgument(k === 'warmupSteps' ? 'a non-negative integer' : 'a positive integer', `pretrain.${k}`, settings[k]);
  }
  if (!(settings.lr > 0) || !Number.isFinite(settings.lr)) throw invalidArgument('a positive number', 'pretrain.lr', settings.lr);
  if (!(settings.weightDecay >= 0) || !Number.isFinite(settings.weightDecay)) throw invalidArgument('a non-negative number', 'pretrain.weightDecay', settings.weightDecay);
  if (settings.batchSequences < dist.world) throw invalidArgument(`at least one sequence per rank (${dist.world} ranks)`, 'pretrain.batchSequences', settings.batchSequences);
  const log = new MetricsLog(runDir, 'pretrain-metrics.jsonl');
  const progress = new Progress(settings.steps, dist.isRoot ? progressOut : { write: () => true }, 'pretrain', 0);
  const started = Date.now();
  let calibrationStart = started;
  const losses: number[] = [];
  for (let step = 1; step <= settings.steps; step++) {
    const batch = next(settings.batchSequences);
    const { lo, hi } = dist.shard(batch.length);
    const m = await model.trainStep([batch.slice(lo, hi)], {
      mode: 'sft',
      optimizer: { lr: settings.lr, warmupSteps: settings.warmupSteps, weightDecay: settings.weightDecay, schedule: 'constant', maxGradNorm: 1 },
    });
    losses.push(m.loss);
    const metrics: StepMetrics = { 'pretrain/loss': m.loss, 'actor/loss': m.loss, 'actor/grad_norm': m.gradNorm, 'actor/lr': m.lr, 'pretrain/tokens': m.tokens };
    if (dist.isRoot) log.append({ step, phase: 'pretrain', time: (Date.now() - started) / 1000, metrics });
    if (step % WINDOW === 0 || step === settings.steps) progress.step(step, metrics);
    if (calibrate && dist.isRoot) {
      const skip = Math.min(calibrate.skip ?? 5, settings.steps - 1);
      const until = Math.min(settings.steps, skip + (calibrate.steps ?? 20));
      if (step === skip) calibrationStart = Date.now();
      if (step === until) calibrate.done((Date.now() - calibrationStart) / 1000 / (until - skip));
    }
  }
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  return {
    steps: settings.steps,
    firstLoss: mean(losses.slice(0, WINDOW)),
    lastLoss: mean(losses.slice(-WINDOW)),
    seconds: (Date.now() - started) / 1000,
  };
}
