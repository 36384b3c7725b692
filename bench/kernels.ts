// Kernel part of `npm run bench`: the C++ program bench/native/kernels_bench.cc
// (fused kernels vs libtorch vs a plain sum, and peak memory per op in a fresh
// process each), plus the N-API paths timed with tinybench against a no-op call.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { Bench } from 'tinybench';
import { benchSum, loadNative, logitsStats, logitsStatsAsync, policyLoss, sampleTokens } from '../lib/native';
import { lastJson, mib, ms, num, runChild, table } from './summary';

/** One timed op of the C++ program: medians and spreads in ms. */
interface Timing {
  median: number;
  min: number;
  max: number;
  n: number;
}
export interface KernelRow {
  T: number;
  V: number;
  dtype: 'f32' | 'bf16';
  threads: number;
  bytes: number;
  /** Worst |fused - libtorch| / (atol + rtol |libtorch|) over every output: <= 1 passes. */
  check: number;
  sum: Timing;
  fused: Timing;
  /** libtorch with the heap kept warm (freed (T, V) buffers reused, no page faults): the fair comparison. */
  torch: Timing;
  /** libtorch under glibc's default malloc (each (T, V) temporary is a fresh mmap, faulted in page by page). */
  torchDefaultMalloc?: Timing;
}
export interface MemoryRow {
  op: string;
  T: number;
  V: number;
  dtype: 'f32' | 'bf16';
  logits_bytes: number;
  extra_bytes: number;
}
export interface NapiRow {
  name: string;
  /** tinybench median latency (ms) of the call from JS. */
  median: number;
  p75: number;
  samples: number;
  /** Same computation timed inside C++ (ms), when the C++ program measured it. */
  native?: number;
}
export interface Target {
  name: string;
  met: boolean;
  detail: string;
}
export interface KernelBenchResult {
  binary: string | null;
  skipped?: string;
  torchVersion?: string;
  reps?: number;
  stats: KernelRow[];
  loss: KernelRow[];
  memory: MemoryRow[];
  napi: NapiRow[];
  targets: Target[];
}

export interface KernelBenchOptions {
  quick: boolean;
  root: string;
  cacheDir: string;
  log: (line: string) => void;
}

/**
 * The kernels_bench binary: $ARPO_KERNELS_BENCH, else the one `npm install`
 * built in build-cmake/, else a build of just that target under the cache dir.
 */
async function findBinary(o: KernelBenchOptions): Promise<{ path: string | null; why?: string }> {
  if (process.env.ARPO_KERNELS_BENCH) {
    const p = path.resolve(process.env.ARPO_KERNELS_BENCH);
    return fs.existsSync(p) ? { path: p } : { path: null, why: `ARPO_KERNELS_BENCH=${p} does not exist` };
  }
  for (const p of [path.join(o.root, 'build-cmake', 'kernels_bench'), path.join(o.cacheDir, 'native', 'kernels_bench')]) {
    if (fs.existsSync(p)) return { path: p };
  }
  const build = path.join(o.cacheDir, 'native');
  o.log(`[bench] building kernels_bench into ${build} (cmake, one job)`);
  const conf = await runChild('cmake', ['-S', o.root, '-B', build, '-DARPO_WITH_CUDA=OFF', '-DARPO_BUILD_TESTS=OFF', '-DCMAKE_BUILD_TYPE=Release']);
  if (conf.code !== 0) return { path: null, why: `cmake configure failed: ${conf.stderr.trim().split('\n').slice(-3).join(' ')}` };
  const made = await runChild('cmake', ['--build', build, '--target', 'kernels_bench', '-j', '1']);
  const p = path.join(build, 'kernels_bench');
  if (made.code !== 0 || !fs.existsSync(p)) {
    return { path: null, why: `kernels_bench did not build (libtorch not found?): ${(made.stdout + made.stderr).trim().split('\n').slice(-3).join(' ')}` };
  }
  return { path: p };
}

/** Peak extra memory per op, each in a fresh process (ru_maxrss after - before). */
function memoryCases(quick: boolean): [string, number, number, 'f32' | 'bf16'][] {
  const ops = ['stats', 'stats_torch', 'loss', 'loss_inplace', 'loss_torch'];
  const cases: [string, number, number, 'f32' | 'bf16'][] = ops.map((op) => [op, 256, 151936, 'f32']);
  cases.push(['loss', 256, 151936, 'bf16'], ['loss_torch', 256, 151936, 'bf16']);
  if (!quick) for (const op of ops) cases.push([op, 1024, 151936, 'f32']);
  return cases;
}

/** N-API call cost on small inputs, against a no-op native call (tinybench, all single-threaded). */
async function napiBench(quick: boolean, stats: readonly KernelRow[]): Promise<NapiRow[]> {
  const native = loadNative();
  const V = 32000;
  const logits = new Float32Array(V);
  for (let j = 0; j < V; j++) logits[j] = Math.sin(j * 12.9898) * 4;
  const targets = Int32Array.of(17);
  const loss = { targets, oldLogprobs: [-10], advantages: [0.5], mask: [1] };
  const grad = new Float32Array(V);
  const bench = new Bench({ time: quick ? 150 : 500, warmupTime: quick ? 30 : 100 });
  bench
    .add('noop() (N-API floor)', () => native.noop())
    .add('benchSum 1 x 32,000', () => void benchSum(logits, 1))
    .add('logitsStats 1 x 32,000 (sync)', () => void logitsStats(logits, 1, V, { targets, threads: 1 }))
    .add('logitsStatsAsync 1 x 32,000 (Promise)', async () => void (await logitsStatsAsync(logits, 1, V, { targets, threads: 1 })))
    .add('sampleTokens 1 x 32,000', () => void sampleTokens(logits, 1, V, { streams: [1], positions: [5], threads: 1 }))
    .add('policyLoss 1 x 32,000 (+ grad)', () => void policyLoss(logits, 1, V, loss, {}, { grad, threads: 1 }));
  await bench.run();
  const cxx = stats.find((r) => r.T === 1 && r.V === V && r.dtype === 'f32' && r.threads === 1);
  const nativeOf: Record<string, number | undefined> = {
    'benchSum 1 x 32,000': cxx?.sum.median,
    'logitsStats 1 x 32,000 (sync)': cxx?.fused.median,
    'logitsStatsAsync 1 x 32,000 (Promise)': cxx?.fused.median,
  };
  return bench.tasks.map((t) => {
    const r = t.result as { state: string; latency?: { p50: number; p75: number; samplesCount?: number }; error?: unknown };
    if (!r.latency) throw new Error(`tinybench task ${t.name} did not complete (${r.state}): ${String(r.error)}`);
    return { name: t.name, median: r.latency.p50, p75: r.latency.p75, samples: r.latency.samplesCount ?? 0, native: nativeOf[t.name] };
  });
}

export function checkTargets(stats: readonly KernelRow[], loss: readonly KernelRow[], memory: readonly MemoryRow[]): Target[] {
  const big = (r: KernelRow): boolean => r.T >= 256 && r.threads === 1;
  const out: Target[] = [];
  const minOf = (rows: readonly KernelRow[], f: (r: KernelRow) => number): { v: number; at: string } => {
    let best = { v: Infinity, at: '-' };
    for (const r of rows) if (f(r) < best.v) best = { v: f(r), at: `${r.T} x ${r.V} ${r.dtype}` };
    return best;
  };
  for (const dtype of ['f32', 'bf16'] as const) {
    const rows = stats.filter((r) => big(r) && r.dtype === dtype);
    if (rows.length === 0) continue;
    const speed = minOf(rows, (r) => r.torch.median / r.fused.median);
    out.push({ name: `fused stats >= 2.5x faster than libtorch (${dtype}, T >= 256, 1 thread)`, met: speed.v >= 2.5, detail: `worst ${num(speed.v, 1)}x at ${speed.at}` });
    const bw = minOf(rows, (r) => r.sum.median / r.fused.median);
    out.push({ name: `fused stats >= 0.5x of plain-sum bandwidth (${dtype}, T >= 256, 1 thread)`, met: bw.v >= 0.5, detail: `worst ${num(bw.v, 2)}x at ${bw.at}` });
  }
  const lrows = loss.filter((r) => r.threads === 1);
  if (lrows.length) {
    const speed = minOf(lrows, (r) => r.torch.median / r.fused.median);
    out.push({ name: 'fused loss (fwd + bwd) >= 2x faster than libtorch with autograd (1 thread)', met: speed.v >= 2, detail: `worst ${num(speed.v, 1)}x at ${speed.at}` });
  }
  const fusedLoss = memory.filter((m) => m.op === 'loss');
  if (fusedLoss.length) {
    // "One logits buffer" = one (T, V) float32 buffer: the gradient output itself (1% slack for allocator rounding).
    const worst = fusedLoss.reduce((a, m) => Math.max(a, m.extra_bytes / (m.T * m.V * 4)), 0);
    const torchRatio = memory.filter((m) => m.op === 'loss_torch').reduce((a, m) => Math.max(a, m.extra_bytes / (m.T * m.V * 4)), 0);
    out.push({
      name: 'fused loss peak extra memory <= one (T, V) float32 buffer',
      met: worst <= 1.01,
      detail: `fused ${num(worst, 2)} buffers (in place: 0 when grad aliases f32 logits), libtorch autograd ${num(torchRatio, 2)}`,
    });
  }
  const bad = [...stats, ...loss].filter((r) => !(r.check <= 1));
  out.push({ name: 'fused outputs match libtorch (checked before timing)', met: bad.length === 0, detail: bad.length ? `${bad.length} shapes out of tolerance` : `every shape within tolerance` });
  return out;
}

export async function runKernelBench(o: KernelBenchOptions): Promise<KernelBenchResult> {
  const found = await findBinary(o);
  const result: KernelBenchResult = { binary: found.path, stats: [], loss: [], memory: [], napi: [], targets: [] };
  if (found.path) {
    o.log(`[bench] kernels: ${found.path} time${o.quick ? ' --quick' : ''} (fused vs libtorch vs plain sum, interleaved)`);
    // glibc serves each (T, V) temporary of libtorch by a fresh mmap and unmaps it on free, so every call
    // faults its buffers in again (expensive in this VM). The main run keeps the heap warm instead (no mmap,
    // no trim): libtorch at its best, as with a caching allocator. A second run records the default.
    const warmHeap = { ...process.env, GLIBC_TUNABLES: 'glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736' };
    const r = await runChild(found.path, ['time', ...(o.quick ? ['--quick'] : []), '--threads', '1'], { env: warmHeap });
    if (r.code !== 0) throw new Error(`kernels_bench time failed (${r.code}): ${r.stderr.trim()}`);
    const t = lastJson<{ torch_version: string; reps: number; stats: KernelRow[]; loss: KernelRow[] }>(r.stdout, 'kernels_bench time');
    Object.assign(result, { torchVersion: t.torch_version, reps: t.reps, stats: t.stats, loss: t.loss });
    if (!o.quick) o.log('[bench] kernels: libtorch again under the default malloc');
    const d = o.quick ? null : await runChild(found.path, ['time', '--threads', '1', '--reps', '3']);
    if (d && d.code === 0) {
      const dm = lastJson<{ stats: KernelRow[]; loss: KernelRow[] }>(d.stdout, 'kernels_bench time (default malloc)');
      const key = (x: KernelRow): string => `${x.T}/${x.V}/${x.dtype}/${x.threads}`;
      const byKey = new Map([...dm.stats.map((x) => [`s${key(x)}`, x.torch] as const), ...dm.loss.map((x) => [`l${key(x)}`, x.torch] as const)]);
      for (const x of result.stats) x.torchDefaultMalloc = byKey.get(`s${key(x)}`);
      for (const x of result.loss) x.torchDefaultMalloc = byKey.get(`l${key(x)}`);
    }
    if (!o.quick) {
      // Both cores on the largest stats shape (the machine's whole bandwidth).
      const all = await runChild(found.path, ['time', '--quick', '--threads', String(os.availableParallelism?.() ?? os.cpus().length), '--reps', '3'], { env: warmHeap });
      if (all.code === 0) {
        const a = lastJson<{ stats: KernelRow[]; loss: KernelRow[] }>(all.stdout, 'kernels_bench time (all threads)');
        result.stats.push(...a.stats.filter((x) => x.T >= 256));
        result.loss.push(...a.loss.filter((x) => x.T >= 256));
      }
    }
    for (const [op, T, V, dtype] of memoryCases(o.quick)) {
      const m = await runChild(found.path, ['mem', op, String(T), String(V), dtype, '--threads', '1']);
      if (m.code !== 0) throw new Error(`kernels_bench mem ${op} ${T} ${V} ${dtype} failed: ${m.stderr.trim()}`);
      result.memory.push(lastJson<MemoryRow>(m.stdout, `kernels_bench mem ${op}`));
    }
  } else {
    result.skipped = `libtorch comparison skipped: ${found.why}`;
    o.log(`[bench] ${result.skipped}`);
  }
  o.log('[bench] kernels: N-API call overhead (tinybench)');
  result.napi = await napiBench(o.quick, result.stats);
  result.targets = checkTargets(result.stats, result.loss, result.memory);
  return result;
}

/** The markdown of the kernel part. */
export function kernelTables(r: KernelBenchResult): string {
  const parts: string[] = [];
  const gbps = (bytes: number, t: number): string => num(bytes / 1e9 / (t / 1e3), 1);
  const rows = (list: readonly KernelRow[]): string[][] =>
    list.map((x) => [
      `${x.T} x ${x.V}`,
      x.dtype,
      String(x.threads),
      `${ms(x.fused.median)} (${ms(x.fused.min)}-${ms(x.fused.max)})`,
      ms(x.torch.median),
      x.torchDefaultMalloc ? ms(x.torchDefaultMalloc.median) : '-',
      ms(x.sum.median),
      `${num(x.torch.median / x.fused.median, 1)}x`,
      `${num(x.sum.median / x.fused.median, 2)} (${gbps(x.bytes, x.fused.median)} of ${gbps(x.bytes, x.sum.median)} GB/s)`,
      x.check <= 1 ? 'ok' : `FAIL ${num(x.check, 1)}`,
    ]);
  const head = ['T x V', 'dtype', 'threads', 'fused median (min-max)', 'libtorch (warm heap)', 'libtorch (default malloc)', 'plain sum', 'libtorch / fused', 'fraction of sum bandwidth', 'vs libtorch'];
  if (r.skipped) parts.push(`_${r.skipped}_`);
  if (r.stats.length) {
    parts.push(`### logits_stats: logsumexp + entropy + normalised entropy + target logprob (libtorch: log_softmax, logsumexp, (exp * lp).sum, gather; ${r.reps} interleaved reps)`);
    parts.push(table(head, rows(r.stats)));
  }
  if (r.loss.length) {
    parts.push('### policy_loss forward + backward (libtorch: log_softmax -> gather -> clipped ratio + dual clip -> token-mean, autograd backward)');
    parts.push(table(head, rows(r.loss)));
  }
  if (r.memory.length) {
    parts.push('### Peak extra memory (peak RSS (VmHWM) delta, one op in a fresh process, 1 thread)');
    parts.push(
      table(
        ['op', 'T x V', 'dtype', 'logits buffer', 'peak extra', 'in (T, V) f32 buffers'],
        r.memory.map((m) => [m.op, `${m.T} x ${m.V}`, m.dtype, mib(m.logits_bytes), mib(m.extra_bytes), num(m.extra_bytes / (m.T * m.V * 4), 2)]),
      ),
    );
  }
  if (r.napi.length) {
    parts.push('### N-API call overhead (tinybench, small inputs, 1 thread)');
    const floor = r.napi[0]?.median ?? NaN;
    parts.push(
      table(
        ['call', 'median', 'p75', 'same work in C++', 'JS-side overhead', 'samples'],
        r.napi.map((n) => [
          n.name,
          ms(n.median),
          ms(n.p75),
          n.native !== undefined ? ms(n.native) : '-',
          n.native !== undefined ? ms(n.median - n.native) : n === r.napi[0] ? '(floor)' : `${ms(n.median - floor)} above noop`,
          String(n.samples),
        ]),
      ),
    );
  }
  return parts.join('\n\n');
}
