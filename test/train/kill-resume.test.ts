// Kill anywhere, resume to the same numbers: `arpo train` (the CLI, a real
// child process) is SIGKILLed at random moments — during start-up, rollout,
// the update, the checkpoint write, the report — and restarted with --resume
// each time; the run directory must stay readable after every kill, and the
// final parameters, optimizer state and metrics must equal an uninterrupted
// run's. train.deterministic makes the tool timing irrelevant (the python and
// search tools run for real). ARPO_KILL_POINTS sets the number of kills
// (default 20; the SFT run gets half as many). The same for `arpo sft`: killed
// during start-up, a step or a checkpoint write, resumed, its final model,
// AdamW state and metrics equal an uninterrupted run's.
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { buildDemoEnvironment } from '../../lib/envs';
import { CheckpointManager } from '../../lib/train/checkpoint';
import { readMetrics } from '../../lib/train/metrics';
import { hasTorch } from '../../lib/native/loader';
import { initTinyQwen3 } from '../rollout/tiny-agent-model';
import { Rng } from '../../lib/envs/demo/rng';

const ROOT = path.resolve(__dirname, '..', '..');
const KILLS = Number(process.env.ARPO_KILL_POINTS ?? 20);
const ifTorch = hasTorch() ? test : test.skip;

interface Outcome {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The last progress line the child wrote before it ended. */
  last: string;
}

/**
 * Runs `arpo train` and SIGKILLs it `kill.ms` after it starts or, with
 * `kill.afterStartup`, after its start-up (the model and tools loaded: the
 * `python sandbox:` line); never when `kill` is undefined. `startupMs` and
 * `ms` come back for the reference run.
 */
function runTrain(config: string, resume: boolean, kill?: { ms: number; afterStartup: boolean }): Promise<Outcome & { ms: number; startupMs: number }> {
  return runArpo(['train', '--config', config], 'python sandbox:', resume, kill);
}

/** The same for any arpo command; start-up ends when stderr first contains `startedMarker`. */
function runArpo(command: string[], startedMarker: string, resume: boolean, kill?: { ms: number; afterStartup: boolean }): Promise<Outcome & { ms: number; startupMs: number }> {
  return new Promise((resolve, reject) => {
    const args = [path.join(ROOT, 'bin', 'arpo.js'), ...command, ...(resume ? ['--resume'] : [])];
    const child = spawn(process.execPath, args, { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'] });
    const t0 = Date.now();
    let startupMs = -1;
    let err = '';
    let timer: NodeJS.Timeout | undefined;
    const arm = (): void => {
      if (kill && !timer) timer = setTimeout(() => child.kill('SIGKILL'), kill.ms);
    };
    child.stderr.on('data', (d: Buffer) => {
      err = (err + d.toString('utf8')).slice(-4000);
      if (startupMs < 0 && err.includes(startedMarker)) {
        startupMs = Date.now() - t0;
        if (kill?.afterStartup) arm();
      }
    });
    if (kill && !kill.afterStartup) arm();
    child.on('error', reject);
    child.on('close', (code, signal) => {
      if (timer) clearTimeout(timer);
      const lines = err.split(/[\r\n]+/).map((l) => l.trim()).filter(Boolean);
      if (signal === null && code !== 0) reject(new Error(`arpo ${command[0]} exited ${code}: ${err}`));
      else resolve({ code, signal, last: lines[lines.length - 1] ?? '(nothing yet)', ms: Date.now() - t0, startupMs });
    });
  });
}

/** Where a command keeps its metrics and checkpoints. */
interface RunFiles {
  metrics: string;
  checkpoints: string;
}
const TRAIN_FILES: RunFiles = { metrics: 'metrics.jsonl', checkpoints: 'checkpoints' };
const SFT_FILES: RunFiles = { metrics: 'sft-metrics.jsonl', checkpoints: 'sft-checkpoints' };

/** The run directory is readable: its config, metrics and (if any) latest checkpoint. */
function checkReadable(runDir: string, run: RunFiles = TRAIN_FILES): number {
  if (fs.existsSync(path.join(runDir, 'config.json'))) JSON.parse(fs.readFileSync(path.join(runDir, 'config.json'), 'utf8'));
  readMetrics(path.join(runDir, run.metrics));
  const latest = new CheckpointManager(runDir, 2, run.checkpoints).latest();
  if (!latest) return 0;
  for (const f of ['model.safetensors', 'config.json']) {
    if (!fs.existsSync(path.join(latest.dir, 'model', f))) throw new Error(`checkpoint ${latest.dir} lacks model/${f}`);
  }
  return latest.state.step;
}

function finalState(runDir: string, run: RunFiles = TRAIN_FILES): { metrics: unknown[]; files: Record<string, Buffer> } {
  const latest = new CheckpointManager(runDir, 2, run.checkpoints).latest();
  if (!latest) throw new Error(`${runDir}: no checkpoint`);
  const files: Record<string, Buffer> = {};
  for (const f of fs.readdirSync(path.join(latest.dir, 'model'))) if (f.endsWith('.safetensors')) files[f] = fs.readFileSync(path.join(latest.dir, 'model', f));
  const metrics = readMetrics(path.join(runDir, run.metrics)).map((r) => ({
    step: r.step, phase: r.phase, metrics: Object.fromEntries(Object.entries(r.metrics).filter(([k]) => !k.startsWith('time/'))),
  }));
  return { metrics, files };
}

describe('kill anywhere, resume to the same numbers', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-kill-'));
  afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

  ifTorch(`arpo train killed at ${KILLS} random moments and resumed ends exactly where an uninterrupted run ends`, async () => {
    const env = await buildDemoEnvironment({ seed: 6, dir: path.join(tmp, 'env'), sizes: { sft: 8, questions: { train: 40, valid: 10, test: 10 } } });
    const modelDir = path.join(tmp, 'model');
    // Weights shaped so the untrained model writes tool tags often (real search and python calls).
    await initTinyQwen3(modelDir, env.dir, 7, { toolTags: true });
    const rewardModule = path.join(tmp, 'reward.js');
    fs.writeFileSync(rewardModule, "exports.rewards = { 'kill-test-length': ({ response }) => (response.length % 3) / 2 };\n");
    const writeConfig = (runDir: string): string => {
      const file = path.join(tmp, `${path.basename(runDir)}.json`);
      fs.writeFileSync(file, JSON.stringify({
        model: { path: modelDir, threads: 1 },
        data: { train: env.files.train, systemPrompt: '' },
        reward: { name: 'kill-test-length', module: rewardModule },
        rollout: { budget: 4, initialSamples: 2, entropyWindow: 4, maxResponseTokens: 32, toolCallLimit: 2, branchProbability: 1 },
        tools: { search: { corpus: env.files.corpus, topK: 2, snippetChars: 120 }, python: { timeoutMs: 3000 }, concurrency: 4 },
        optim: { lr: 1e-3 },
        train: { steps: 5, batchPrompts: 2, miniBatchPrompts: 1, ppoEpochs: 2, validateEvery: 0, checkpointEvery: 1, seed: 4, outDir: runDir, deterministic: true, oldLogprobs: 'recompute' },
      }));
      return file;
    };

    const refDir = path.join(tmp, 'ref');
    const refRun = await runTrain(writeConfig(refDir), false);
    const wall = refRun.ms;
    const trainMs = Math.max(500, wall - refRun.startupMs);
    const ref = finalState(refDir);
    expect(ref.metrics.filter((r) => (r as { phase: string }).phase === 'train')).toHaveLength(5);

    const runDir = path.join(tmp, 'killed');
    const cfg = writeConfig(runDir);
    const rng = new Rng(20261203);
    const moments: string[] = [];
    let kills = 0;
    for (let starts = 0; ; starts++) {
      if (starts > 4 * KILLS + 10) throw new Error(`the run did not finish after ${starts} starts`);
      const resume = checkReadable(runDir) > 0;
      // One kill in four anywhere in a run (start-up included), the others after
      // start-up, spread over the rollout / update / checkpoint / report time.
      const early = rng.next() < 0.25;
      const o = await runTrain(cfg, resume, kills < KILLS ? { ms: early ? 200 + rng.int(0, wall - 1) : rng.int(0, trainMs - 1), afterStartup: !early } : undefined);
      const step = checkReadable(runDir);
      if (o.signal === 'SIGKILL') {
        kills++;
        moments.push(`${resume ? 'resumed' : 'fresh'}, killed at ${o.ms} ms (start-up ${o.startupMs < 0 ? 'not done' : `${o.startupMs} ms`}), checkpoint ${step} after; last output: ${o.last.slice(0, 40)}`);
        continue;
      }
      expect(step).toBe(5);
      if (kills >= KILLS) break;
      // It finished before its kill: start over so that the remaining kills land in a run.
      fs.rmSync(runDir, { recursive: true, force: true });
    }
    process.stdout.write(`kill points (${moments.length}; the reference run: ${wall} ms, start-up ${refRun.startupMs} ms):\n  ${moments.join('\n  ')}\n`);
    expect(moments).toHaveLength(KILLS);
    const got = finalState(runDir);
    expect(got.metrics).toEqual(ref.metrics);
    expect(Object.keys(ref.files).sort()).toEqual(['model.safetensors', 'optimizer.safetensors']); // weights and AdamW state
    expect(Object.keys(got.files).sort()).toEqual(Object.keys(ref.files).sort());
    for (const [f, bytes] of Object.entries(ref.files)) expect(Buffer.compare(got.files[f]!, bytes)).toBe(0);
  }, 900000);

  ifTorch(`arpo sft killed at ${Math.ceil(KILLS / 2)} random moments and resumed ends exactly where an uninterrupted run ends`, async () => {
    const kills = Math.ceil(KILLS / 2);
    const env = await buildDemoEnvironment({ seed: 8, dir: path.join(tmp, 'env-sft'), sizes: { sft: 24, questions: { train: 30, valid: 4, test: 4 } } });
    const modelDir = path.join(tmp, 'model-sft');
    await initTinyQwen3(modelDir, env.dir, 3);
    const command = (runDir: string): string[] => {
      const file = path.join(tmp, `${path.basename(runDir)}.json`);
      fs.writeFileSync(file, JSON.stringify({
        model: { path: modelDir, threads: 1 },
        sft: { data: env.files.sft, epochs: 3, batchSequences: 4, lr: 1e-3, checkpointEvery: 2 },
        optim: { warmupSteps: 3 },
        train: { microBatchTokens: 512, seed: 5, outDir: runDir },
      }));
      return ['sft', '--config', file, '--out', path.join(runDir, 'final')];
    };
    const ended = (runDir: string): Buffer => fs.readFileSync(path.join(runDir, 'final', 'model.safetensors'));

    const refDir = path.join(tmp, 'sft-ref');
    const refRun = await runArpo(command(refDir), 'sft ', false);
    const ref = finalState(refDir, SFT_FILES);
    expect(ref.metrics).toHaveLength(18); // 24 conversations / 4 per step x 3 epochs
    expect(Object.keys(ref.files).sort()).toEqual(['model.safetensors', 'optimizer.safetensors']);
    // The written model is the last checkpoint's weights.
    expect(Buffer.compare(ended(refDir), ref.files['model.safetensors']!)).toBe(0);
    const wall = refRun.ms;
    const stepsMs = Math.max(300, wall - refRun.startupMs);

    const runDir = path.join(tmp, 'sft-killed');
    const rng = new Rng(20261204);
    const moments: string[] = [];
    let done = 0;
    for (let starts = 0; ; starts++) {
      if (starts > 4 * kills + 10) throw new Error(`the SFT run did not finish after ${starts} starts`);
      const resume = checkReadable(runDir, SFT_FILES) > 0;
      const early = rng.next() < 0.25;
      const o = await runArpo(command(runDir), 'sft ', resume, done < kills ? { ms: early ? 200 + rng.int(0, wall - 1) : rng.int(0, stepsMs - 1), afterStartup: !early } : undefined);
      const step = checkReadable(runDir, SFT_FILES);
      if (o.signal === 'SIGKILL') {
        done++;
        moments.push(`${resume ? 'resumed' : 'fresh'}, killed at ${o.ms} ms, checkpoint ${step} after; last output: ${o.last.slice(0, 40)}`);
        continue;
      }
      expect(step).toBe(18);
      if (done >= kills) break;
      fs.rmSync(runDir, { recursive: true, force: true });
    }
    process.stdout.write(`sft kill points (${moments.length}; the reference run: ${wall} ms, start-up ${refRun.startupMs} ms):\n  ${moments.join('\n  ')}\n`);
    const got = finalState(runDir, SFT_FILES);
    expect(got.metrics).toEqual(ref.metrics);
    for (const [f, bytes] of Object.entries(ref.files)) expect(Buffer.compare(got.files[f]!, bytes)).toBe(0);
    expect(Buffer.compare(ended(runDir), ended(refDir))).toBe(0);
  }, 600000);
});
