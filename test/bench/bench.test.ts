// The benchmark runner's arithmetic (median / spread, per-run summaries, the
// issue-8 target checks) against hand-computed values, and the C++
// kernels_bench program's memory and correctness modes when it is built.
import * as fs from 'fs';
import * as path from 'path';
import { spawn, spawnSync } from 'child_process';
import { summariseRun } from '../../bench/e2e';
import type { E2ERunResult } from '../../bench/e2e-run';
import { checkTargets, type KernelRow, type MemoryRow } from '../../bench/kernels';
import { lastJson, spread, table } from '../../bench/summary';
import { slope } from '../../bench/soak';
import { descendants } from '../../bench/soak-run';

describe('spread', () => {
  it('gives the median, min and max of a naive sort, ignoring NaN', () => {
    const xs = [5, 1, NaN, 9, 3, 7, 2];
    const sorted = [1, 2, 3, 5, 7, 9];
    expect(spread(xs)).toEqual({ median: (sorted[2]! + sorted[3]!) / 2, min: 1, max: 9, n: 6 });
    expect(spread([4, 2, 8])).toEqual({ median: 4, min: 2, max: 8, n: 3 });
    expect(spread([]).n).toBe(0);
    expect(Number.isNaN(spread([NaN]).median)).toBe(true);
  });
});

describe('soak helpers', () => {
  it('slope is the least-squares fit: exact on a line, zero when flat, the textbook value otherwise', () => {
    const xs = [20, 21, 22, 23, 24];
    expect(slope(xs, xs.map((x) => 3 - 0.25 * x))).toBeCloseTo(-0.25, 12);
    expect(slope(xs, [7, 7, 7, 7, 7])).toBe(0);
    // (x, y) = (0,1), (1,3), (2,2): sxy = (-1)(-1) + 0 + (1)(0) = 1, sxx = 2
    expect(slope([0, 1, 2], [1, 3, 2])).toBeCloseTo(0.5, 12);
  });
  it('descendants counts the processes below this one, grandchildren included', async () => {
    const before = descendants();
    // sh -> sh -> sleep: a child, a grandchild and a great-grandchild.
    const child = spawn('/bin/sh', ['-c', "/bin/sh -c '/bin/sleep 2; :'; :"], { stdio: 'ignore' });
    await new Promise((r) => setTimeout(r, 300));
    const during = descendants();
    child.kill('SIGKILL');
    await new Promise((r) => child.on('close', r));
    expect(during - before).toBe(3);
    // The orphans were re-parented away from us: no longer below this process.
    expect(descendants()).toBe(before);
  });
});

describe('lastJson / table', () => {
  it('takes the last JSON line of a child stdout and fails naming the child', () => {
    expect(lastJson<{ a: number }>('progress\n{"a":1}\n{"a":2}\n', 'x')).toEqual({ a: 2 });
    expect(() => lastJson('no json here', 'kernels_bench mem')).toThrow(/kernels_bench mem: no JSON result/);
  });
  it('renders a markdown table', () => {
    expect(table(['a', 'b'], [['1', '2']])).toBe('| a | b |\n| --- | --- |\n| 1 | 2 |');
  });
});

describe('summariseRun', () => {
  it('aggregates per-step trainer metrics by totals and means', () => {
    const run: E2ERunResult = {
      spec: { envDir: '', modelDir: '', runDir: '', seed: 3, mode: 'arpo', steps: 2, quick: true },
      train: [
        { 'rollout/trajectories': 32, 'time/rollout_s': 4, 'rollout/tokens_generated': 3200, 'rollout/tokens_computed': 6400, 'rollout/branch_events': 6, 'rollout/unique_token_ratio': 0.5, 'tools/executed_per_prompt': 6, 'tools/calls_per_traj': 1, 'time/model_s': 3, 'time/tools_s': 1, 'reward/mean': -0.5 },
        { 'rollout/trajectories': 32, 'time/rollout_s': 12, 'rollout/tokens_generated': 1600, 'rollout/tokens_computed': 3200, 'rollout/branch_events': 2, 'rollout/unique_token_ratio': 0.7, 'tools/executed_per_prompt': 4, 'tools/calls_per_traj': 2, 'time/model_s': 5, 'time/tools_s': 3, 'reward/mean': 0.5 },
      ],
      valid: [{ step: 2, metrics: { 'acc/mean': 0.4, 'acc/exact': 0.25, 'reward/mean': 0.1, 'tools/calls_per_traj': 1.5 } }],
      settings: { budget: 8, initialSamples: 4, batchPrompts: 4, validExamples: 16, toolCallLimit: 4, maxResponseTokens: 640 },
      trainStep: { calls: 2, tokens: 10000, seconds: 4, peakExtraRssBytes: 3 * 2 ** 20 },
      maxRssBytes: 512 * 2 ** 20,
      wallSeconds: 30,
    };
    const v = summariseRun(run).values;
    expect(v.trajectoriesPerSecond).toBeCloseTo(64 / 16, 12); // total trajectories over total rollout time, not a mean of rates
    expect(v.tokensPerTrajectory).toBeCloseTo(4800 / 64, 12);
    expect(v.uniqueTokenRatio).toBeCloseTo(0.6, 12);
    expect(v.tokensComputedPerTrajectory).toBeCloseTo(9600 / 64, 12);
    expect(v.branchEventsPerPrompt).toBeCloseTo(8 / (2 * 4), 12); // 2 steps of 4 prompts
    expect(v.toolCallsExecutedPerPrompt).toBeCloseTo(5, 12);
    expect(v.modelSecondsPerStep).toBeCloseTo(4, 12);
    expect(v.toolSecondsPerStep).toBeCloseTo(2, 12);
    expect(v.trainTokensPerSecond).toBeCloseTo(2500, 12);
    expect(v.trainPeakExtraMiB).toBeCloseTo(3, 12);
    expect(v.validToolCallsPerCorrect).toBeCloseTo(1.5 / 0.25, 12);
    const none = summariseRun({ ...run, valid: [{ step: 2, metrics: { 'acc/exact': 0, 'tools/calls_per_traj': 1 } }] }).values;
    expect(Number.isNaN(none.validToolCallsPerCorrect)).toBe(true);
  });
});

describe('checkTargets', () => {
  const t = (median: number) => ({ median, min: median, max: median, n: 3 });
  const row = (T: number, dtype: 'f32' | 'bf16', fused: number, torch: number, sum: number, check = 0.1): KernelRow => ({ T, V: 151936, dtype, threads: 1, bytes: T * 151936 * 4, check, sum: t(sum), fused: t(fused), torch: t(torch) });
  const mem = (op: string, buffers: number): MemoryRow => ({ op, T: 256, V: 151936, dtype: 'f32', logits_bytes: 256 * 151936 * 4, extra_bytes: buffers * 256 * 151936 * 4 });

  it('passes when every large shape meets the thresholds and small shapes are ignored', () => {
    const targets = checkTargets([row(256, 'f32', 10, 30, 6), row(1, 'f32', 10, 11, 1)], [row(256, 'f32', 10, 25, 5)], [mem('loss', 1), mem('loss_torch', 3)]);
    expect(targets.map((x) => x.name.split(' >=')[0]!.split(' (')[0])).toEqual([
      'fused stats',
      'fused stats',
      'fused loss',
      'fused loss peak extra memory <= one',
      'fused outputs match libtorch',
    ]);
    expect(targets.every((x) => x.met)).toBe(true);
  });

  it('fails on the worst shape, on memory above one buffer and on a correctness miss', () => {
    const targets = checkTargets(
      [row(256, 'f32', 10, 40, 6), row(1024, 'f32', 10, 24, 4.9, 3)],
      [row(256, 'f32', 10, 19, 5)],
      [mem('loss', 1.5)],
    );
    const met = Object.fromEntries(targets.map((x) => [x.name.split(' (')[0]!, x.met]));
    expect(met['fused stats >= 2.5x faster than libtorch']).toBe(false); // 2.4x at 1024
    expect(met['fused stats >= 0.5x of plain-sum bandwidth']).toBe(false); // 0.49
    expect(met['fused loss']).toBe(false); // 1.9x
    expect(targets.find((x) => x.name.startsWith('fused loss peak'))?.met).toBe(false);
    expect(targets.find((x) => x.name.startsWith('fused outputs'))?.met).toBe(false);
  });
});

// The C++ program itself, when a build is around (ARPO_KERNELS_BENCH, build-cmake/ or the bench cache).
const root = path.resolve(__dirname, '..', '..');
const binary = [process.env.ARPO_KERNELS_BENCH, path.join(root, 'build-cmake', 'kernels_bench'), path.join(root, 'bench', '.cache', 'native', 'kernels_bench')].find(
  (p): p is string => !!p && fs.existsSync(p),
);
const withBinary = binary ? describe : describe.skip;

withBinary('kernels_bench (C++)', () => {
  const mem = (op: string, dtype = 'f32'): MemoryRow => {
    const r = spawnSync(binary!, ['mem', op, '128', '32000', dtype], { encoding: 'utf8' });
    expect(r.status).toBe(0);
    return lastJson<MemoryRow>(r.stdout, op);
  };
  it('measures the fused stats with no (T, V) temporary, libtorch with several, the fused loss with exactly its gradient', () => {
    const buffer = 128 * 32000 * 4; // 16 MB, far above ru_maxrss noise
    expect(mem('stats').extra_bytes).toBeLessThan(0.05 * buffer);
    expect(mem('stats_torch').extra_bytes).toBeGreaterThan(1.5 * buffer);
    const loss = mem('loss').extra_bytes;
    expect(loss).toBeGreaterThan(0.95 * buffer);
    expect(loss).toBeLessThan(1.05 * buffer);
    expect(mem('loss_inplace').extra_bytes).toBeLessThan(0.05 * buffer);
  });
  it('rejects bad arguments with a message naming them, without crashing', () => {
    const bad = spawnSync(binary!, ['mem', 'loss', '0', '32000', 'f32'], { encoding: 'utf8' });
    expect(bad.status).toBe(1);
    expect(bad.stderr).toContain('expected a positive integer for T but received 0');
    const dtype = spawnSync(binary!, ['mem', 'loss', '4', '8', 'f16'], { encoding: 'utf8' });
    expect(dtype.stderr).toContain('expected f32 or bf16 for dtype but received f16');
    const inplace = spawnSync(binary!, ['mem', 'loss_inplace', '4', '8', 'bf16'], { encoding: 'utf8' });
    expect(inplace.status).toBe(1);
    expect(inplace.stderr).toContain('loss_inplace needs float32 logits');
  });
});
