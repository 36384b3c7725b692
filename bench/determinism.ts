// train.deterministic's cost in `npm run bench` (issue 17): the demo's ARPO
// rollout with the plain and the batch-invariant engine, in a fresh process.
import * as path from 'path';
import type { DeterminismResult, DeterminismRunSpec } from './determinism-run';
import type { Target } from './kernels';
import { lastJson, num, runChild, spread, table } from './summary';

export interface DeterminismBench {
  result: DeterminismResult;
  /** Median invariant / plain rollout wall time. */
  cost: number;
  targets: Target[];
}

export async function runDeterminismBench(o: { root: string; envDir: string; modelDir: string; quick: boolean; log: (s: string) => void }): Promise<DeterminismBench> {
  o.log('[bench] determinism: ARPO rollout with the plain and the batch-invariant engine');
  const spec: DeterminismRunSpec = { envDir: o.envDir, modelDir: o.modelDir, seed: 1, quick: o.quick, reps: o.quick ? 2 : 4 };
  const args = ['-r', 'ts-node/register/transpile-only', path.join(o.root, 'bench', 'determinism-run.ts'), JSON.stringify(spec)];
  const r = await runChild(process.execPath, args, { cwd: o.root, echo: true });
  if (r.code !== 0) throw new Error(`determinism run failed (exit ${r.code}): ${r.stderr.trim().split('\n').slice(-5).join('\n')}`);
  const result = lastJson<DeterminismResult>(r.stdout, 'determinism run');
  const cost = spread(result.invariant.map((x) => x.wallSeconds)).median / spread(result.plain.map((x) => x.wallSeconds)).median;
  return {
    result,
    cost,
    targets: [
      { name: 'train.deterministic: batch-invariant rollouts of one seed are identical', met: result.invariantIdentical, detail: `${result.invariant.length} rollouts, identical: ${result.invariantIdentical ? 'yes' : 'no'} (plain engine: ${result.plainIdentical ? 'identical' : 'differ'})` },
      { name: 'train.deterministic costs <= 5% of rollout wall time (then it could be the default)', met: cost <= 1.05, detail: `invariant / plain wall time ${num(cost, 3)}` },
    ],
  };
}

export function determinismTables(d: DeterminismBench): string {
  const s = (xs: number[]): string => {
    const v = spread(xs);
    return v.n <= 1 ? num(v.median, 2) : `${num(v.median, 2)} [${num(v.min, 2)}, ${num(v.max, 2)}]`;
  };
  const rows = (['plain', 'invariant'] as const).map((k) => [
    k === 'plain' ? 'plain (padded batched decode attention; linear layers: the in-place kernel up to 16 rows, one GEMM above)' : 'batch-invariant (the in-place linear kernel at every row count, per-path attention)',
    s(d.result[k].map((x) => x.wallSeconds)),
    s(d.result[k].map((x) => x.modelSeconds)),
    k === 'plain' ? (d.result.plainIdentical ? 'yes' : 'no') : d.result.invariantIdentical ? 'yes' : 'no',
  ]);
  return [
    `The demo's ARPO rollout of one step (${d.result.trajectories} trajectories) from the bench checkpoint, same prompts and seed, engines alternated; median [min, max] over reps.`,
    table(['engine', 'rollout wall, s', 'time in model, s', 'identical trees across reps'], rows),
    `Cost of train.deterministic: ${num(d.cost, 3)}x rollout wall time.`,
  ].join('\n\n');
}
