// The soak (issue 17), in its own process: `arpo train` on a tiny model of the
// demo world for many small steps, with real search and python calls,
// validation, checkpoints and the report. After every step (metrics logged,
// validation and checkpoint done) it samples, after a full GC: RSS, the V8
// heap, open file descriptors, the engine's live paths and KV blocks, the
// processes below this one (sandboxed interpreters) and the sandboxes' temp
// directories; the python tool's warm sandboxes (tools.python.warm, default
// 4) are counted apart. After the run (tools closed) it samples the same once more.
//
//   node --expose-gc -r ts-node/register/transpile-only bench/soak-run.ts '{"steps":300,"seed":1}'
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { buildDemoEnvironment, DEMO_SYSTEM_PROMPT } from '../lib/envs';
import { validateConfig } from '../lib/train/config';
import type { PythonTool } from '../lib/tools';
import { train } from '../lib/train/trainer';
import { childMain } from './summary';
import { initTinyQwen3 } from '../test/rollout/tiny-agent-model';

export interface SoakRunSpec {
  steps: number;
  seed: number;
}

export interface SoakSample {
  step: number;
  rssMiB: number;
  heapMiB: number;
  fds: number;
  enginePaths: number;
  kvBlocksUsed: number;
  /** Processes below this one, the warm sandboxes waiting for a call excepted. */
  descendants: number;
  /** Warm sandboxes waiting in the python tool's pool. */
  warmSandboxes: number;
  sandboxTempDirs: number;
  toolCalls: number;
}

export interface SoakResult {
  samples: SoakSample[];
  /** Sampled once the run returned (tools closed, model disposed). */
  after: Omit<SoakSample, 'step' | 'enginePaths' | 'kvBlocksUsed' | 'toolCalls' | 'warmSandboxes'>;
  before: Omit<SoakSample, 'step' | 'enginePaths' | 'kvBlocksUsed' | 'toolCalls' | 'warmSandboxes'>;
  wallSeconds: number;
  trajectories: number;
}

/** Processes below `root` (children, grandchildren, ...), from /proc; those in the process groups `except`, and the pids in it, are not counted. */
export function descendants(root = process.pid, except: ReadonlySet<number> = new Set()): number {
  const parent = new Map<number, number>();
  const group = new Map<number, number>();
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${name}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      parent.set(Number(name), Number(f[1]));
      group.set(Number(name), Number(f[2]));
    } catch {
      // the process ended while we looked
    }
  }
  let n = 0;
  for (const pid of parent.keys()) {
    if (except.has(pid) || except.has(group.get(pid) as number)) continue;
    for (let p = parent.get(pid); p !== undefined && p > 1; p = parent.get(p)) {
      if (p === root) {
        n++;
        break;
      }
    }
  }
  return n;
}

function processSample(parked: readonly number[] = []): SoakResult['before'] {
  (globalThis as { gc?: () => void }).gc?.();
  const m = process.memoryUsage();
  return {
    rssMiB: m.rss / 2 ** 20,
    heapMiB: m.heapUsed / 2 ** 20,
    fds: fs.readdirSync('/proc/self/fd').length,
    descendants: descendants(process.pid, new Set(parked)),
    sandboxTempDirs: fs.readdirSync(os.tmpdir()).filter((n) => n.startsWith('arpo-python-')).length,
  };
}

export async function runSoak(spec: SoakRunSpec): Promise<SoakResult> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-soak-'));
  try {
    const env = await buildDemoEnvironment({ seed: spec.seed, dir: path.join(dir, 'env'), sizes: { sft: 8, questions: { train: 60, valid: 8, test: 8 } } });
    const modelDir = path.join(dir, 'model');
    // Weights shaped so the untrained model writes tool tags often: real search and python calls every step.
    await initTinyQwen3(modelDir, env.dir, spec.seed, { toolTags: true });
    const cfg = validateConfig({
      model: { path: modelDir, threads: 1 },
      data: { train: env.files.train, valid: env.files.valid, validLimit: 4, systemPrompt: DEMO_SYSTEM_PROMPT },
      rollout: { budget: 4, initialSamples: 2, entropyWindow: 4, maxResponseTokens: 32, toolCallLimit: 2, branchProbability: 1 },
      tools: { search: { corpus: env.files.corpus, topK: 2, snippetChars: 120 }, python: { timeoutMs: 3000 }, concurrency: 4 },
      optim: { lr: 1e-4 },
      train: { steps: spec.steps, batchPrompts: 2, miniBatchPrompts: 1, ppoEpochs: 1, validateEvery: 50, checkpointEvery: 25, seed: spec.seed, outDir: path.join(dir, 'run') },
    });
    const before = processSample();
    const samples: SoakSample[] = [];
    let trajectories = 0;
    const t0 = Date.now();
    await train(cfg, {
      progress: { write: () => true, isTTY: false },
      afterStep: async (step, { metrics, model, tools }) => {
        const cache = model.cacheStats();
        const sandbox = (tools.tool('python') as PythonTool).sandbox;
        // Sandboxes of returned calls are reaped in the background: wait for that; the launcher helper is counted apart.
        await sandbox.settled();
        const parked = [...sandbox.parkedPids(), ...(sandbox.launcherPid() === undefined ? [] : [sandbox.launcherPid() as number])];
        trajectories += metrics['rollout/trajectories'] ?? 0;
        samples.push({ step, ...processSample(parked), warmSandboxes: parked.length, enginePaths: cache.paths, kvBlocksUsed: cache.blocksUsed, toolCalls: metrics['tools/executed_per_prompt'] ?? 0 });
        if (step % 25 === 0) process.stderr.write(`[soak] step ${step}/${spec.steps}: rss ${samples[samples.length - 1]!.rssMiB.toFixed(1)} MiB, fds ${samples[samples.length - 1]!.fds}\n`);
      },
    });
    return { samples, before, after: processSample(), wallSeconds: (Date.now() - t0) / 1000, trajectories };
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

if (require.main === module) {
  childMain<SoakRunSpec, unknown>('soak-run', "node --expose-gc -r ts-node/register/transpile-only bench/soak-run.ts '{\"steps\":300,\"seed\":1}' (steps > 20)", (s) => Number.isInteger(s.steps) && s.steps > 20, runSoak);
}
