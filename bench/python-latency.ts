// Python tool latency (issue 14), in `npm run bench -- --only tools` and the
// full bench: the median / p90 wall time of PythonSandbox.run('print(1+1)')
// one call at a time and in bursts of 16 concurrent calls, cold (a sandbox
// started per call) and from a warm pool, with the CPU time each call costs
// the whole machine (the pool's refills and the kernel's teardown of the
// sandboxes included: the pool is closed before the CPU is read). It is read
// from /proc/stat, less the machine's busy rate over an idle second before the
// row, so other work on the machine shows in it; the per-process accounts
// (cutime) miss it, since a killed sandbox's inner processes are reaped by
// no one of ours.
import * as fs from 'fs';
import { PythonSandbox } from '../lib/tools';
import type { Target } from './kernels';
import { num, quantile, table } from './summary';

export interface LatencyRow {
  /** sequential-2g: one at a time from a process holding 2 GiB more (a trainer's size: a spawn from it forks that much). */
  pattern: 'sequential' | 'sequential-2g' | 'burst16';
  warm: number;
  calls: number;
  medianMs: number;
  p90Ms: number;
  /** Machine CPU ms per call (all cores, less the idle baseline), the pool's refills and teardowns included. */
  cpuMsPerCall: number;
  /** The machine's busy CPU ms per second before the row (other work). */
  baselineCpuMsPerS: number;
  wallSeconds: number;
}

export interface PythonLatencyBench {
  isolation: string;
  rows: LatencyRow[];
  targets: Target[];
}

/** Busy CPU of the whole machine, ms summed over cores (/proc/stat: user, nice, system, irq, softirq, steal). */
export function machineBusyMs(): number {
  const f = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  const ticks = f[0]! + f[1]! + f[2]! + f[5]! + f[6]! + f[7]!;
  return (ticks * 1000) / 100; // USER_HZ is 100 on Linux
}

async function measure(pattern: LatencyRow['pattern'], warm: number, calls: number): Promise<LatencyRow> {
  // Resident ballast, every page touched (dropped after the row).
  let ballast: Buffer | null = pattern === 'sequential-2g' ? Buffer.alloc(2 * 1024 ** 3, 1) : null;
  const sb = new PythonSandbox({ warm, timeoutMs: 10000 });
  // The first fill is start-up, not a call's cost: measured from a full pool.
  if (warm > 0) {
    sb.prewarm();
    await new Promise((r) => setTimeout(r, 400 + 40 * warm));
  }
  const ms: number[] = [];
  // The machine's own busy rate first (this process idle, the pool full).
  const idle0 = machineBusyMs();
  const i0 = performance.now();
  await new Promise((r) => setTimeout(r, 1000));
  const baselineCpuMsPerS = ((machineBusyMs() - idle0) * 1000) / (performance.now() - i0);
  const cpu0 = machineBusyMs();
  const t0 = performance.now();
  const one = async (): Promise<void> => {
    const r = await sb.run('print(1+1)');
    if (r.stdout.trim() !== '2' || r.exitCode !== 0) throw new Error(`python latency: a call gave ${JSON.stringify(r)}`);
    ms.push(r.ms);
  };
  if (pattern !== 'burst16') {
    for (let i = 0; i < calls; i++) {
      await one();
      // Calls of a rollout come between decode steps: let the pool refill as it would there.
      if (warm > 0) await new Promise((r) => setTimeout(r, 60));
    }
  } else {
    for (let i = 0; i < calls; i += 16) {
      await Promise.all(Array.from({ length: Math.min(16, calls - i) }, one));
      if (warm > 0) await new Promise((r) => setTimeout(r, 400 + 40 * warm));
    }
  }
  const wallSeconds = (performance.now() - t0) / 1000;
  await sb.close();
  const cpu = machineBusyMs() - cpu0 - (baselineCpuMsPerS * (performance.now() - t0)) / 1000;
  if (ballast) ballast = null;
  return { pattern, warm, calls, medianMs: quantile(ms, 0.5), p90Ms: quantile(ms, 0.9), cpuMsPerCall: cpu / calls, baselineCpuMsPerS, wallSeconds };
}

export async function runPythonLatencyBench(o: { quick: boolean; log: (s: string) => void }): Promise<PythonLatencyBench> {
  const calls = o.quick ? 32 : 96;
  o.log(`[bench] python latency: ${calls} calls each, cold and warm, one at a time and in bursts of 16`);
  const isolation = new PythonSandbox().isolation.summary;
  const rows: LatencyRow[] = [];
  for (const [pattern, warm] of [['sequential', 0], ['sequential', 4], ['sequential-2g', 4], ['burst16', 0], ['burst16', 16]] as const) {
    rows.push(await measure(pattern, warm, calls));
    o.log(`[bench] python ${pattern} warm=${warm}: median ${num(rows[rows.length - 1]!.medianMs, 1)} ms`);
  }
  const get = (p: LatencyRow['pattern'], warm: boolean) => rows.find((r) => r.pattern === p && (r.warm > 0) === warm)!;
  const get2g = () => rows.find((r) => r.pattern === 'sequential-2g')!;
  return {
    isolation,
    rows,
    targets: [
      { name: 'python tool median latency <= 15 ms, one call at a time (warm pool)', met: get('sequential', true).medianMs <= 15, detail: `${num(get('sequential', true).medianMs, 1)} ms warm vs ${num(get('sequential', false).medianMs, 1)} ms cold` },
      { name: 'python tool median latency <= 15 ms, one at a time from a process holding 2 GiB (warm pool)', met: get2g().medianMs <= 15, detail: `${num(get2g().medianMs, 1)} ms` },
      { name: 'python tool median latency <= 15 ms in bursts of 16 (warm pool of 16)', met: get('burst16', true).medianMs <= 15, detail: `${num(get('burst16', true).medianMs, 1)} ms warm vs ${num(get('burst16', false).medianMs, 1)} ms cold` },
    ],
  };
}

export function pythonLatencyTables(b: PythonLatencyBench): string {
  return [
    `\`PythonSandbox.run('print(1+1)')\` with ${b.isolation}; latency is the call's wall time (code handed over -> output read). CPU per call: the whole machine's (all cores, /proc/stat) over the row until the pool is closed, the warm pool's refills and the sandboxes' teardown included, less the busy rate the machine had in an idle second before the row (shown: other work runs beside the bench).`,
    table(['pattern', 'sandboxes', 'calls', 'median ms', 'p90 ms', 'machine CPU ms per call', 'idle baseline CPU ms/s', 'wall s'], b.rows.map((r) => [
      r.pattern === 'sequential' ? 'one at a time' : r.pattern === 'sequential-2g' ? 'one at a time, caller holding 2 GiB' : 'bursts of 16', r.warm > 0 ? `warm pool of ${r.warm}` : 'cold (one started per call)', String(r.calls), num(r.medianMs, 1), num(r.p90Ms, 1), num(r.cpuMsPerCall, 1), num(r.baselineCpuMsPerS, 0), num(r.wallSeconds, 1),
    ])),
  ].join('\n\n');
}

