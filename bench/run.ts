// `npm run bench`: the kernel benchmarks (fused kernels vs libtorch vs a plain
// sum, peak memory, N-API overhead) and the end-to-end ARPO vs GRPO comparison
// on the demo world. Prints one markdown report and writes it, with the JSON of
// every number, to bench/results/.
//
//   npm run bench [-- --quick] [--only kernels|tools|llama|e2e|packing|determinism|soak|scale] [--seeds 1,2,3] [--steps N] [--refills-ablation] [--out DIR]
//
// The soak (300 small RL steps watching RSS, file descriptors, engine paths and
// tool workers) runs only with --only soak; --steps sets its length too.
//
// --quick: fewer shapes and reps, one SFT checkpoint with fewer epochs, 2 seeds x 2 steps (< 5 min
// on 2 cores once the addon is built). Caches (SFT checkpoint, a kernels_bench build) live in
// bench/.cache/; ARPO_KERNELS_BENCH=/path/to/kernels_bench picks the C++ program.
import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { Command, InvalidArgumentError } from 'commander';
import { hasTorch } from '../lib/native';
import { benchCheckpoint, e2eTables, runE2EBench, type E2EResult } from './e2e';
import { runScaleBench, scaleTables, type ScaleBench } from './scale';
import { packingTables, runPackingBench, type PackingResult } from './packing';
import { determinismTables, runDeterminismBench, type DeterminismBench } from './determinism';
import { runSoakBench, soakTables, type SoakBench } from './soak';
import { pythonLatencyTables, runPythonLatencyBench, type PythonLatencyBench } from './python-latency';
import { kernelTables, runKernelBench, type KernelBenchResult, type Target } from './kernels';
import { llamaTables, runLlamaBench, type LlamaBench } from './llama';
import { table } from './summary';

const root = path.resolve(__dirname, '..');

function positiveInt(name: string) {
  return (v: string): number => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError(`Expected a positive integer for ${name} but received ${JSON.stringify(v)}`);
    return n;
  };
}

function seedList(v: string): number[] {
  const seeds = v.split(',').map((s) => Number(s.trim()));
  if (seeds.length === 0 || seeds.some((s) => !Number.isInteger(s) || s < 0)) {
    throw new InvalidArgumentError(`Expected a comma-separated list of non-negative integers for --seeds but received ${JSON.stringify(v)}`);
  }
  return seeds;
}

/** Machine, versions and date: the header every result carries. */
function environment(argv: readonly string[]): Record<string, string> {
  const cpus = os.cpus();
  const version = (cmd: string, args: string[]): string => {
    try {
      return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).split('\n')[0]!.trim();
    } catch {
      return 'not found';
    }
  };
  const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')) as { version: string };
  let commit = 'unknown';
  try {
    commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no'], { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
    if (dirty) commit += ' (+ local changes)';
  } catch {
    /* not a git checkout */
  }
  return {
    date: new Date().toISOString(),
    command: `npm run bench${argv.length ? ` -- ${argv.join(' ')}` : ''}`,
    machine: `${cpus[0]?.model ?? 'unknown CPU'}, ${os.availableParallelism?.() ?? cpus.length} hardware threads, ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB RAM, ${os.platform()} ${os.release()}`,
    load: `load average ${os.loadavg().map((l) => l.toFixed(2)).join(' ')} at start (other work shares this machine)`,
    versions: `arpo ${pkg.version} @ ${commit}, Node ${process.version}, ${version('c++', ['--version'])}, libtorch: see kernel table`,
  };
}

function targetTable(targets: readonly Target[]): string {
  return table(['target', 'met', 'measured'], targets.map((t) => [t.name, t.met ? 'yes' : '**no**', t.detail]));
}

async function main(): Promise<void> {
  const program = new Command('bench')
    .description('arpo benchmarks: kernels vs libtorch, ARPO vs trajectory-level GRPO end to end')
    .option('--quick', 'fewer shapes, reps, seeds and steps (< 5 minutes)', false)
    .option('--only <part>', 'kernels, tools, llama, e2e, packing, determinism, soak or scale (default: all but soak and scale)')
    .option('--seeds <list>', 'e2e seeds, comma-separated (default: 1,2 quick, 1,2,3 full)', seedList)
    .option('--steps <n>', 'e2e training steps per run (default: 2 quick, 8 full); soak steps (default 300, 60 quick)', positiveInt('--steps'))
    .option('--refills-ablation', 'e2e: also run ARPO with rollout.speculativeRefills on (a third run per seed)', false)
    .option('--out <dir>', 'results folder', path.join(root, 'bench', 'results'))
    .allowExcessArguments(false);
  program.parse(process.argv);
  const opts = program.opts<{ quick: boolean; only?: string; seeds?: number[]; steps?: number; out: string; refillsAblation: boolean }>();
  const parts = ['kernels', 'tools', 'llama', 'e2e', 'packing', 'determinism', 'soak', 'scale'];
  if (opts.only !== undefined && !parts.includes(opts.only)) {
    throw new InvalidArgumentError(`Expected one of ${parts.join(', ')} for --only but received ${JSON.stringify(opts.only)}`);
  }
  const argv = process.argv.slice(2);
  const env = environment(argv);
  const cacheDir = path.join(root, 'bench', '.cache');
  const log = (s: string): void => void process.stderr.write(`${s}\n`);
  const started = Date.now();
  const sections: string[] = [
    `# arpo benchmark${opts.quick ? ' (--quick)' : ''}`,
    [`- date: ${env.date}`, `- command: \`${env.command}\``, `- machine: ${env.machine}`, `- ${env.load}`, `- versions: ${env.versions}`].join('\n'),
  ];
  const targets: Target[] = [];
  let kernels: KernelBenchResult | undefined;
  let e2e: E2EResult | undefined;
  let packing: PackingResult | undefined;
  let determinism: DeterminismBench | undefined;
  let soak: SoakBench | undefined;
  let tools: PythonLatencyBench | undefined;
  let scale: ScaleBench | undefined;
  let llama: LlamaBench | undefined;
  const wants = (part: string): boolean => opts.only === part || (opts.only === undefined && part !== 'soak' && part !== 'scale');

  if (wants('kernels')) {
    kernels = await runKernelBench({ quick: opts.quick, root, cacheDir, log });
    targets.push(...kernels.targets);
    sections.push(`## Kernels (CPU, single-threaded unless noted; libtorch ${kernels.torchVersion ?? 'n/a'})`, kernelTables(kernels));
  }
  if (wants('tools')) {
    tools = await runPythonLatencyBench({ quick: opts.quick, log });
    targets.push(...tools.targets);
    sections.push('## Python tool latency: a warm pool of sandboxes (issue 14)', pythonLatencyTables(tools));
  }
  if (wants('llama')) {
    if (!hasTorch()) {
      sections.push('## Engine vs llama.cpp\n\n_skipped: the loaded addon has no libtorch model layer_');
    } else {
      llama = await runLlamaBench({ quick: opts.quick, cacheDir, log });
      targets.push(...llama.targets);
      sections.push('## Decode: PolicyModel vs llama.cpp on the same weights (issue 14)', llamaTables(llama));
    }
  }
  if (wants('packing')) {
    if (!hasTorch()) {
      sections.push('## Tree-packed training\n\n_skipped: the loaded addon has no libtorch model layer_');
    } else {
      const ckpt = await benchCheckpoint({ quick: opts.quick, cacheDir, log });
      packing = await runPackingBench({ quick: opts.quick, root, envDir: ckpt.envDir, modelDir: ckpt.modelDir, seed: 1, log });
      targets.push(...packing.targets);
      sections.push('## Tree-packed training: packing tree vs flat on the e2e trees (issue 13)', packingTables(packing));
    }
  }
  if (wants('determinism') && hasTorch()) {
    const ckpt = await benchCheckpoint({ quick: opts.quick, cacheDir, log });
    determinism = await runDeterminismBench({ root, envDir: ckpt.envDir, modelDir: ckpt.modelDir, quick: opts.quick, log });
    targets.push(...determinism.targets);
    sections.push('## Reproducible rollouts: train.deterministic (issue 17)', determinismTables(determinism));
  }
  if (wants('soak') && hasTorch()) {
    soak = await runSoakBench({ root, steps: opts.steps ?? (opts.quick ? 60 : 300), seed: 1, log });
    targets.push(...soak.targets);
    sections.push('## Soak: a long run does not leak (issue 17)', soakTables(soak));
  }
  if (wants('scale') && hasTorch()) {
    const ckpt = await benchCheckpoint({ quick: opts.quick, cacheDir, log });
    scale = await runScaleBench({ root, envDir: ckpt.envDir, modelDir: ckpt.modelDir, quick: opts.quick, steps: opts.steps, log });
    targets.push(...scale.targets);
    sections.push('## Data parallel: 1 rank vs 2 ranks over c10d / Gloo (issue 16)', scaleTables(scale));
  }
  if (wants('e2e')) {
    if (!hasTorch()) {
      sections.push('## End to end\n\n_skipped: the loaded addon has no libtorch model layer (build the full addon: npm run build:native)_');
    } else {
      const workDir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-bench-e2e-'));
      try {
        e2e = await runE2EBench({
          quick: opts.quick,
          root,
          cacheDir,
          workDir,
          seeds: opts.seeds ?? (opts.quick ? [1, 2] : [1, 2, 3]),
          steps: opts.steps ?? (opts.quick ? 2 : 8),
          refillsAblation: opts.refillsAblation,
          log,
        });
      } finally {
        fs.rmSync(workDir, { recursive: true, force: true });
      }
      targets.push(...e2e.targets);
      sections.push('## End to end: ARPO vs trajectory-level GRPO on the demo world', e2eTables(e2e));
    }
  }
  sections.push('## Targets', targetTable(targets));
  sections.push(`_total wall time ${((Date.now() - started) / 1000).toFixed(0)} s_`);
  const markdown = `${sections.join('\n\n')}\n`;
  process.stdout.write(`\n${markdown}`);

  fs.mkdirSync(opts.out, { recursive: true });
  const stamp = env.date!.replace(/[:.]/g, '-');
  // A partial run (--only) gets its own latest file, so it never replaces a full report's other part.
  const variant = `${opts.quick ? '-quick' : ''}${opts.only ? `-${opts.only}` : ''}`;
  const base = `bench${variant}-${stamp}`;
  const json = JSON.stringify({ environment: env, options: opts, kernels, tools, llama, packing, determinism, soak, scale, e2e: e2e && { ...e2e, raw: e2e.raw.map((r) => ({ spec: r.spec, train: r.train, valid: r.valid, trainStep: r.trainStep, maxRssBytes: r.maxRssBytes, wallSeconds: r.wallSeconds })) }, targets }, null, 2);
  // Written under a .tmp name and renamed, so a killed run never leaves half a result.
  for (const [name, text] of [
    [`${base}.md`, markdown],
    [`${base}.json`, json],
    [`latest${variant}.md`, markdown],
    [`latest${variant}.json`, json],
  ] as const) {
    const file = path.join(opts.out, name);
    fs.writeFileSync(`${file}.tmp`, text);
    fs.renameSync(`${file}.tmp`, file);
  }
  log(`[bench] written ${path.join(opts.out, `${base}.md`)} and .json (also latest${variant}.md/.json)`);
}

main().catch((e: Error) => {
  process.stderr.write(`bench: ${e.message}\n`);
  if (process.env.ARPO_DEBUG) process.stderr.write(`${e.stack}\n`);
  process.exit(1);
});
