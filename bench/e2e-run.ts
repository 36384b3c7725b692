// One end-to-end training run of the bench, in its own process (so its peak
// RSS is its own): `train()` on the demo world from the cached SFT checkpoint,
// with rollout.mode arpo or trajectory (GRPO). Prints one JSON line: the
// per-step metrics the trainer logged, the validations, and the training-step
// cost measured around PolicyModel.trainStep.
//
//   ts-node --transpile-only bench/e2e-run.ts '<json E2ERunSpec>'
import * as fs from 'fs';
import * as path from 'path';
import { demoRunConfig } from '../lib/cli/demo';
import { PolicyModel, type TrainSequence, type TrainTreeBatch } from '../lib/model/policy-model';
import { evaluate } from '../lib/train/evaluate';
import { readMetrics } from '../lib/train/metrics';
import { Lockstep, type LockstepSpec } from './lockstep';
import { childMain } from './summary';
import { train } from '../lib/train/trainer';
import type { RolloutResult } from '../lib/rollout';

export interface E2ERunSpec {
  envDir: string;
  modelDir: string;
  runDir: string;
  seed: number;
  mode: 'arpo' | 'trajectory';
  steps: number;
  quick: boolean;
  /** rollout.speculativeRefills (default: the config's default, off). */
  speculativeRefills?: boolean;
  /** Take turns step by step with the seed's other runs (bench/lockstep.ts); absent: run freely. */
  lockstep?: LockstepSpec;
}

export interface TrainStepCost {
  calls: number;
  /** Tokens computed by the update (prompt + response, all micro-batches): flattened sequences, or each packed tree's unique tokens. */
  tokens: number;
  seconds: number;
  /** Largest RSS rise above the RSS at the call's start, sampled every 5 ms while the native step runs. */
  peakExtraRssBytes: number;
}

export interface E2ERunResult {
  spec: E2ERunSpec;
  /** The settings both modes share (from the validated config). */
  settings: { budget: number; initialSamples: number; batchPrompts: number; validExamples: number; toolCallLimit: number; maxResponseTokens: number };
  train: Record<string, number>[];
  valid: { step: number; metrics: Record<string, number> }[];
  trainStep: TrainStepCost;
  maxRssBytes: number;
  wallSeconds: number;
}

/**
 * Wraps PolicyModel.prototype.trainStep and trainTreeStep (train.packing flat
 * or tree) to count the tokens they compute and their time, and to sample the
 * process RSS while the step runs off the JS thread.
 */
function instrumentTrainStep(cost: TrainStepCost): void {
  const timed = async <T>(tokens: number, run: () => Promise<T>): Promise<T> => {
    const base = process.memoryUsage.rss();
    let peak = base;
    const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage.rss())), 5);
    const t0 = process.hrtime.bigint();
    try {
      return await run();
    } finally {
      clearInterval(timer);
      peak = Math.max(peak, process.memoryUsage.rss());
      cost.seconds += Number(process.hrtime.bigint() - t0) / 1e9;
      cost.calls++;
      cost.tokens += tokens;
      cost.peakExtraRssBytes = Math.max(cost.peakExtraRssBytes, peak - base);
    }
  };
  const flat = PolicyModel.prototype.trainStep;
  PolicyModel.prototype.trainStep = async function (this: PolicyModel, micro: ReadonlyArray<readonly TrainSequence[]>, options) {
    if ((options?.mode ?? 'policy') !== 'policy') return flat.call(this, micro, options);
    let tokens = 0;
    for (const mb of micro) for (const s of mb) tokens += s.tokens.length;
    return timed(tokens, () => flat.call(this, micro, options));
  };
  const tree = PolicyModel.prototype.trainTreeStep;
  PolicyModel.prototype.trainTreeStep = async function (this: PolicyModel, batches: readonly TrainTreeBatch[], options) {
    const tokens = batches.reduce((a, b) => a + b.tokens.length, 0);
    return timed(tokens, () => tree.call(this, batches, options));
  };
}

/** VmHWM of this process (ru_maxrss would include the parent's peak, inherited across fork + exec). */
function peakRssBytes(): number {
  try {
    const m = /VmHWM:\s+(\d+) kB/.exec(fs.readFileSync('/proc/self/status', 'utf8'));
    if (m) return Number(m[1]) * 1024;
  } catch {
    /* not Linux */
  }
  return process.resourceUsage().maxRSS * 1024;
}

export async function runE2E(spec: E2ERunSpec): Promise<E2ERunResult> {
  const cost: TrainStepCost = { calls: 0, tokens: 0, seconds: 0, peakExtraRssBytes: 0 };
  instrumentTrainStep(cost);
  fs.rmSync(spec.runDir, { recursive: true, force: true });
  // Same prompts, seed, budget M and batch for both modes: only the rollout (and its preset) differ.
  const cfg = demoRunConfig(spec.envDir, spec.modelDir, spec.runDir, spec.seed, spec.quick, spec.steps, {
    algorithm: { name: spec.mode === 'arpo' ? 'arpo' : 'grpo' },
    rollout: { mode: spec.mode, ...(spec.speculativeRefills === undefined ? {} : { speculativeRefills: spec.speculativeRefills }) },
    // No step-0 validation: greedy decoding of the same checkpoint is the same for every run (the bench
    // evaluates the checkpoint once); the trained model is evaluated below, after the last step.
    train: { validateEvery: 0, checkpointEvery: 0 },
  });
  const t0 = Date.now();
  const label = `${spec.mode === 'arpo' ? (spec.speculativeRefills === true ? 'arpo, speculative refills' : 'arpo') : 'grpo'} seed ${spec.seed}`;
  const lockstep = spec.lockstep ? new Lockstep(spec.lockstep) : null;
  try {
    await train(cfg, {
      report: false,
      progress: { write: (s: string) => process.stderr.write(`  [${label}] ${s.trimStart()}`) },
      ...(lockstep
        ? {
            // A step is the rollout and the update: the turn is taken before the rollout and passed on after the step.
            rollout: async (_step: number, run: () => Promise<RolloutResult>) => {
              await lockstep.begin();
              return run();
            },
            afterStep: () => lockstep.end(),
          }
        : {}),
    });
    await lockstep?.finish();
  } catch (e) {
    lockstep?.fail();
    throw e;
  }
  const records = readMetrics(path.join(spec.runDir, 'metrics.jsonl'));
  // Held-out evaluation of the final checkpoint: greedy, n = 1, the config's validation split and limit.
  const ckpt = path.join(spec.runDir, 'checkpoints');
  const finalModel = path.join(ckpt, fs.readFileSync(path.join(ckpt, 'latest'), 'utf8').trim(), 'model');
  const heldOut = await evaluate(finalModel, cfg.data.valid!, cfg, { limit: cfg.data.validLimit, workDir: spec.runDir });
  return {
    spec,
    settings: {
      budget: cfg.rollout.budget,
      initialSamples: cfg.rollout.initialSamples,
      batchPrompts: cfg.train.batchPrompts,
      validExamples: heldOut.metrics['valid/examples'] ?? 0,
      toolCallLimit: cfg.rollout.toolCallLimit,
      maxResponseTokens: cfg.rollout.maxResponseTokens,
    },
    train: records.filter((r) => r.phase === 'train').map((r) => r.metrics),
    valid: [{ step: spec.steps, metrics: heldOut.metrics }],
    trainStep: cost,
    maxRssBytes: peakRssBytes(),
    wallSeconds: (Date.now() - t0) / 1000,
  };
}

if (require.main === module) {
  childMain<E2ERunSpec, unknown>('e2e-run', "ts-node --transpile-only bench/e2e-run.ts '{\"envDir\":...,\"modelDir\":...,\"runDir\":...,\"seed\":1,\"mode\":\"arpo\",\"steps\":2,\"quick\":true}'", () => true, runE2E);
}
