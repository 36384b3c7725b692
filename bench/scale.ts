// Data-parallel scaling in `npm run bench -- --only scale` (issue 16): the
// demo world's ARPO RL from the bench checkpoint, `arpo train` as one rank of
// 1 thread and as `--nproc 2` (2 ranks of 1 thread each), same config, seed
// and prompts (train.deterministic), run one after the other. Per step: wall
// time (from metrics.jsonl), rollout and train time, trajectories/s, the time
// in collectives (`time/allreduce_s`: the gradient allreduce, the denominator
// and metric sums, the batch gathers, waiting for the slower rank included)
// and its share of the step; the raw scaling = 2-rank trajectories/s over
// 1-rank. Also how far the 2-rank metrics are from the 1-rank ones (float32:
// summation order differs, so the trees may drift after the first update).
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { demoRunConfig } from '../lib/cli/demo';
import { readMetrics } from '../lib/train/metrics';
import type { Target } from './kernels';
import { num, runChild, spread, table } from './summary';

export interface ScaleRun {
  ranks: number;
  stepSeconds: number[];
  rolloutSeconds: number[];
  trainSeconds: number[];
  allreduceSeconds: number[];
  trajectories: number[];
  wallSeconds: number;
}

export interface ScaleBench {
  runs: ScaleRun[];
  steps: number;
  batchPrompts: number;
  /** 2-rank trajectories/s over 1-rank (medians of the steps after the first). */
  scaling: number;
  /** Median share of a 2-rank step spent in collectives. */
  allreduceShare: number;
  /** Largest relative difference, 2 ranks vs 1: step 1's rollout and update metrics (same weights, same trees), and any metric of any step. */
  metricDiffs: { rollout: number; update: number; all: number; key: string };
  load: string;
  targets: Target[];
}

function runOf(runDir: string, ranks: number, wallSeconds: number): ScaleRun {
  const rows = readMetrics(path.join(runDir, 'metrics.jsonl')).filter((r) => r.phase === 'train');
  const out: ScaleRun = { ranks, stepSeconds: [], rolloutSeconds: [], trainSeconds: [], allreduceSeconds: [], trajectories: [], wallSeconds };
  let prev = 0;
  for (const r of rows) {
    out.stepSeconds.push(r.time - prev);
    prev = r.time;
    out.rolloutSeconds.push(r.metrics['time/rollout_s'] ?? NaN);
    out.trainSeconds.push(r.metrics['time/train_s'] ?? NaN);
    out.allreduceSeconds.push(r.metrics['time/allreduce_s'] ?? 0);
    out.trajectories.push(r.metrics['rollout/trajectories'] ?? NaN);
  }
  return out;
}

/**
 * 2 ranks vs 1: at step 1 (same weights; batch-invariant decoding) every
 * rollout metric must be equal and the update metrics equal up to float32
 * summation order; later steps start from weights that differ by that
 * rounding, so their trees may drift. Differences are relative, with values
 * below 1e-6 in size compared absolutely (clip fractions and KL near 0).
 */
function metricDiffs(a: string, b: string): { rollout: number; update: number; all: number; key: string } {
  const ra = readMetrics(path.join(a, 'metrics.jsonl')).filter((r) => r.phase === 'train');
  const rb = readMetrics(path.join(b, 'metrics.jsonl')).filter((r) => r.phase === 'train');
  const out = { rollout: 0, update: 0, all: 0, key: '' };
  ra.forEach((r, i) => {
    for (const [k, v] of Object.entries(r.metrics)) {
      if (k.startsWith('time/')) continue;
      const w = rb[i]?.metrics[k];
      if (w === undefined) continue;
      const d = Math.abs(v - w) / Math.max(1e-6, Math.abs(v), Math.abs(w));
      out.all = Math.max(out.all, d);
      if (i !== 0) continue;
      const update = k.startsWith('actor/') || k.startsWith('train/');
      if (update && d > out.update) out.update = d;
      if (!update && d > out.rollout) out.rollout = d;
      if (d >= Math.max(out.update, out.rollout)) out.key = k;
    }
  });
  return out;
}

const median = (xs: number[]): number => spread(xs).median;

export async function runScaleBench(o: { root: string; envDir: string; modelDir: string; quick: boolean; steps?: number; log: (s: string) => void }): Promise<ScaleBench> {
  const steps = o.steps ?? (o.quick ? 3 : 6);
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-bench-scale-'));
  const load = `load average at the start ${os.loadavg().map((x) => x.toFixed(2)).join(' / ')} on ${os.cpus().length} cores`;
  try {
    const runs: ScaleRun[] = [];
    const dirs: string[] = [];
    for (const ranks of [1, 2]) {
      const runDir = path.join(work, `ranks-${ranks}`);
      dirs.push(runDir);
      const cfg = demoRunConfig(o.envDir, o.modelDir, runDir, 1, o.quick, steps, {
        model: { threads: 1 },
        train: { validateEvery: 0, checkpointEvery: 0, deterministic: true, distTimeoutS: 600 },
      });
      const file = path.join(work, `ranks-${ranks}.json`);
      fs.writeFileSync(file, JSON.stringify(cfg));
      o.log(`[bench] scale: ${steps} RL steps as ${ranks} rank${ranks > 1 ? 's' : ''} of 1 thread`);
      const t0 = Date.now();
      const args = [path.join(o.root, 'bin', 'arpo.js'), 'train', '--config', file, ...(ranks > 1 ? ['--nproc', String(ranks)] : [])];
      const r = await runChild(process.execPath, args, { cwd: o.root, echo: true });
      if (r.code !== 0) throw new Error(`scale run (${ranks} ranks) failed (exit ${r.code}): ${r.stderr.trim().split('\n').slice(-5).join('\n')}`);
      runs.push(runOf(runDir, ranks, (Date.now() - t0) / 1000));
    }
    // Steps after the first (the first also warms the sandboxes and the allocator).
    const rate = (r: ScaleRun): number => median(r.trajectories.slice(1).map((t, i) => t / r.stepSeconds[i + 1]!));
    const scaling = rate(runs[1]!) / rate(runs[0]!);
    const two = runs[1]!;
    const allreduceShare = median(two.allreduceSeconds.slice(1).map((a, i) => a / two.stepSeconds[i + 1]!));
    const diffs = metricDiffs(dirs[1]!, dirs[0]!);
    return {
      runs, steps, batchPrompts: demoRunConfig(o.envDir, o.modelDir, work, 1, o.quick, steps).train.batchPrompts,
      scaling, allreduceShare, metricDiffs: diffs, load,
      targets: [
        { name: 'data parallel: collectives <= 10% of a 2-rank RL step', met: allreduceShare <= 0.1, detail: `median share ${num(allreduceShare * 100, 1)}% (time/allreduce_s over the step's wall time)` },
        { name: 'data parallel: 2 ranks give 1 rank\'s step-1 rollout exactly and its update metrics within 1e-2 (ppo_kl is a difference of float32 log-probs)', met: diffs.rollout === 0 && diffs.update <= 1e-2, detail: `step 1: rollout metrics ${diffs.rollout.toExponential(2)}, update metrics ${diffs.update.toExponential(2)} (worst: ${diffs.key || 'none'}); any step ${diffs.all.toExponential(2)}` },
      ],
    };
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
}

export function scaleTables(s: ScaleBench): string {
  const m = (xs: number[]): string => num(median(xs.slice(1)), 2);
  const rows = s.runs.map((r) => [
    String(r.ranks),
    m(r.stepSeconds),
    m(r.rolloutSeconds),
    m(r.trainSeconds),
    m(r.allreduceSeconds),
    num(median(r.trajectories.slice(1).map((t, i) => t / r.stepSeconds[i + 1]!)), 2),
    num(r.wallSeconds, 0),
  ]);
  return [
    `The demo's ARPO RL from the bench checkpoint, ${s.steps} steps of ${s.batchPrompts} prompts, 1 thread per rank, train.deterministic; medians over the steps after the first. ${s.load}; the two cores also run Node and the python sandboxes, so this is a sanity figure, not a promise.`,
    table(['ranks', 'step, s', 'rollout, s', 'train, s', 'collectives, s', 'trajectories/s', 'command wall, s'], rows),
    `Raw scaling (2-rank trajectories/s over 1-rank): ${num(s.scaling, 2)}x. Collectives: ${num(s.allreduceShare * 100, 1)}% of a 2-rank step. Metrics, 2 ranks vs 1, at step 1 (same weights): rollout ${s.metricDiffs.rollout.toExponential(2)}, update ${s.metricDiffs.update.toExponential(2)} relative (worst ${s.metricDiffs.key || 'none'}); over all steps ${s.metricDiffs.all.toExponential(2)} (float32 sums in another order, so later trees drift apart; the float64 equality is in the tests).`,
  ].join('\n\n');
}
