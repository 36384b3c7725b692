// The soak in `npm run bench -- --only soak` (issue 17; not in CI): a tiny
// model trained for many small steps in a fresh process (bench/soak-run.ts);
// least-squares slopes of RSS, V8 heap and open file descriptors over the
// steps after the warm-up (step 20 on), and whether the engine's paths and KV
// blocks, the sandboxed interpreters and their temp directories were all
// released after every step and after the run.
import * as path from 'path';
import type { Target } from './kernels';
import type { SoakResult, SoakRunSpec, SoakSample } from './soak-run';
import { lastJson, num, runChild, spread, table } from './summary';

export const SOAK_WARMUP_STEPS = 20;

export interface SoakBench {
  spec: SoakRunSpec;
  result: SoakResult;
  /** Per step after the warm-up: slope, and the growth it predicts over those steps. */
  slopes: Record<'rssMiB' | 'heapMiB' | 'fds', { perStep: number; overRun: number; first: number; last: number; max: number }>;
  targets: Target[];
}

/** Least-squares slope of ys against xs. */
export function slope(xs: readonly number[], ys: readonly number[]): number {
  const n = xs.length;
  const mx = xs.reduce((a, b) => a + b, 0) / n;
  const my = ys.reduce((a, b) => a + b, 0) / n;
  let sxy = 0;
  let sxx = 0;
  for (let i = 0; i < n; i++) {
    sxy += (xs[i]! - mx) * (ys[i]! - my);
    sxx += (xs[i]! - mx) ** 2;
  }
  return sxx > 0 ? sxy / sxx : 0;
}

export async function runSoakBench(o: { root: string; steps: number; seed: number; log: (s: string) => void }): Promise<SoakBench> {
  const spec: SoakRunSpec = { steps: o.steps, seed: o.seed };
  o.log(`[bench] soak: ${spec.steps} RL steps of a tiny model with real tools, validation every 50, a checkpoint every 25`);
  const args = ['--expose-gc', '-r', 'ts-node/register/transpile-only', path.join(o.root, 'bench', 'soak-run.ts'), JSON.stringify(spec)];
  const r = await runChild(process.execPath, args, { cwd: o.root, echo: true });
  if (r.code !== 0) throw new Error(`soak run failed (exit ${r.code}): ${r.stderr.trim().split('\n').slice(-5).join('\n')}`);
  const result = lastJson<SoakResult>(r.stdout, 'soak run');
  const tail = result.samples.filter((s) => s.step >= SOAK_WARMUP_STEPS);
  const fit = (k: 'rssMiB' | 'heapMiB' | 'fds') => {
    const perStep = slope(tail.map((s) => s.step), tail.map((s) => s[k]));
    return { perStep, overRun: perStep * (tail[tail.length - 1]!.step - tail[0]!.step), first: tail[0]![k], last: tail[tail.length - 1]![k], max: Math.max(...tail.map((s) => s[k])) };
  };
  const slopes = { rssMiB: fit('rssMiB'), heapMiB: fit('heapMiB'), fds: fit('fds') };
  const held = (k: keyof SoakSample) => result.samples.filter((s) => (s[k] as number) !== 0).map((s) => s.step);
  const pathsHeld = held('enginePaths');
  const blocksHeld = held('kvBlocksUsed');
  const procsHeld = held('descendants');
  const tmpHeld = held('sandboxTempDirs');
  const calls = result.samples.reduce((a, s) => a + s.toolCalls, 0);
  const steps = tail.length ? `steps ${tail[0]!.step}-${tail[tail.length - 1]!.step}` : 'no steps';
  const firstOf = (xs: number[]) => (xs.length ? `held after ${xs.length} steps (first: step ${xs[0]})` : 'none held after any step');
  return {
    spec,
    result,
    slopes,
    targets: [
      { name: 'soak: RSS flat after step 20 (fitted growth over the run < 16 MiB)', met: slopes.rssMiB.overRun < 16, detail: `${num(slopes.rssMiB.perStep, 3)} MiB/step over ${steps} (${num(slopes.rssMiB.overRun, 1)} MiB fitted; ${num(slopes.rssMiB.first, 1)} -> ${num(slopes.rssMiB.last, 1)} MiB)` },
      { name: 'soak: V8 heap (after GC) flat after step 20 (fitted growth over the run < 4 MiB)', met: slopes.heapMiB.overRun < 4, detail: `${num(slopes.heapMiB.perStep, 4)} MiB/step (${num(slopes.heapMiB.overRun, 2)} MiB fitted; ${num(slopes.heapMiB.first, 2)} -> ${num(slopes.heapMiB.last, 2)} MiB)` },
      { name: 'soak: open file descriptors flat after step 20 (fitted growth < 1)', met: Math.abs(slopes.fds.overRun) < 1 && slopes.fds.max - slopes.fds.first <= 2, detail: `${num(slopes.fds.perStep, 4)} fds/step (${num(slopes.fds.first, 0)} -> ${num(slopes.fds.last, 0)}, max ${num(slopes.fds.max, 0)})` },
      { name: 'soak: engine paths and KV blocks released after every step', met: pathsHeld.length === 0 && blocksHeld.length === 0, detail: `paths ${firstOf(pathsHeld)}; blocks ${firstOf(blocksHeld)}` },
      { name: 'soak: tool workers released (no interpreter process or sandbox temp dir after any step or the run)', met: procsHeld.length === 0 && tmpHeld.length === 0 && result.after.descendants === 0 && result.after.sandboxTempDirs <= result.before.sandboxTempDirs, detail: `${num(calls, 0)} tool calls per prompt summed over steps; processes ${firstOf(procsHeld)}, temp dirs ${firstOf(tmpHeld)}; after the run: ${result.after.descendants} processes, ${result.after.sandboxTempDirs} temp dirs` },
    ],
  };
}

export function soakTables(s: SoakBench): string {
  const r = s.result;
  const rows = (['rssMiB', 'heapMiB', 'fds'] as const).map((k) => [
    k === 'rssMiB' ? 'RSS, MiB' : k === 'heapMiB' ? 'V8 heap used (after GC), MiB' : 'open file descriptors',
    num(r.before[k], k === 'fds' ? 0 : 1),
    num(s.slopes[k].first, k === 'fds' ? 0 : 1),
    num(s.slopes[k].last, k === 'fds' ? 0 : 1),
    num(s.slopes[k].perStep, 4),
    num(s.slopes[k].overRun, 2),
    num(r.after[k], k === 'fds' ? 0 : 1),
  ]);
  const every = Math.max(1, Math.floor(r.samples.length / 10));
  const trace = r.samples.filter((x, i) => i % every === 0 || i === r.samples.length - 1).map((x) => [String(x.step), num(x.rssMiB, 1), num(x.heapMiB, 2), String(x.fds), String(x.enginePaths), String(x.kvBlocksUsed), String(x.descendants)]);
  const warm = spread(r.samples.map((x) => x.warmSandboxes));
  return [
    `${s.spec.steps} RL steps (${r.trajectories} trajectories, ${num(r.wallSeconds, 0)} s) of a 2-layer, 32-wide Qwen3 on the demo world with real search and python calls, validation every 50 steps and a checkpoint every 25, in one process; sampled after each step once it is complete, after a full GC. Slopes are least-squares fits over steps >= ${SOAK_WARMUP_STEPS}. The python tool keeps ${num(warm.min, 0)}-${num(warm.max, 0)} warm sandboxes waiting after each step (tools.python.warm): their pipes are among the file descriptors, and 'processes below' counts every other process under the trainer.`,
    table(['quantity', 'before the run', `step ${SOAK_WARMUP_STEPS}`, 'last step', 'slope per step', 'fitted growth over the run', 'after the run'], rows),
    table(['step', 'RSS MiB', 'heap MiB', 'fds', 'engine paths', 'KV blocks used', 'processes below'], trace),
  ].join('\n\n');
}
