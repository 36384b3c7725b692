// The fixed model checkpoint of the end-to-end bench: the demo world for a
// seed, the demo's tiny model, pretrained and SFT'd on the world's traces by
// the demo's own recipe (trainDemoModel in lib/cli/demo.ts), cached under
// bench/.cache/ so every run (and every seed of the comparison) starts from
// the same weights.
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import { demoModelConfig, demoPretrainSettings, demoRunConfig, trainDemoModel } from '../lib/cli/demo';
import { buildDemoEnvironment, localPython, openDemoTools } from '../lib/envs';
import { Tokenizer } from '../lib/model/tokenizer';
import { evaluate } from '../lib/train/evaluate';

export interface DemoCheckpoint {
  dir: string;
  envDir: string;
  modelDir: string;
  worldSeed: number;
  pretrain: { steps: number; firstLoss: number; lastLoss: number; seconds: number };
  sft: { epochs: number; traces: number; steps: number; firstLoss: number; lastLoss: number; seconds: number };
  /** Greedy evaluation of the SFT model on the held-out valid split (the tool-use check). */
  check: { examples: number; accuracy: number; reward: number; formatOk: number; toolCallsPerTrajectory: number };
}

/** Bump when the recipe below changes, so stale caches are rebuilt rather than reused. */
const RECIPE = 3;

/**
 * Returns the cached checkpoint for this world, model config and SFT recipe,
 * building it when absent. The world is rebuilt every time (about a second)
 * and the cache key hashes its files with the model config and SFT settings,
 * so a change to the demo (lib/envs, lib/cli/demo.ts) never reuses a stale
 * checkpoint. The folder is complete only once checkpoint.json exists (written last).
 * sftEpochs null = the demo's own SFT recipe (demoRunConfig); quickPretrain
 * = the demo's --quick pretraining (too short for the model to learn to copy).
 */
export async function demoCheckpoint(o: { cacheDir: string; worldSeed: number; sftEpochs: number | null; quickPretrain: boolean; traces: number; checkExamples: number; log: (s: string) => void }): Promise<DemoCheckpoint> {
  fs.mkdirSync(o.cacheDir, { recursive: true });
  const build = path.resolve(o.cacheDir, `world-build-${process.pid}`);
  fs.rmSync(build, { recursive: true, force: true });
  const envBuild = path.join(build, 'env');
  let tools: Awaited<ReturnType<typeof openDemoTools>> | undefined;
  const env = await buildDemoEnvironment({
    seed: o.worldSeed,
    dir: envBuild,
    sizes: { sft: o.traces },
    createRunTool: async ({ corpus }) => {
      tools = await openDemoTools(corpus);
      const search = tools.runTool;
      // As the demo: python results of the traces come from the in-process evaluator (prints what the sandbox prints).
      return async (tag: string, content: string) => (tag === 'python' ? localPython(content) : search(tag, content));
    },
  });
  await tools?.close();

  let tokenizer = Tokenizer.fromDir(envBuild);
  const eos = tokenizer.eosTokenId ?? 0;
  const modelConfig = demoModelConfig(tokenizer.vocabSize, eos, tokenizer.bosTokenId ?? eos);
  const probe = demoRunConfig(envBuild, 'model', 'rl', o.worldSeed, false, 1, o.sftEpochs === null ? {} : { sft: { epochs: o.sftEpochs } });
  const hash = crypto.createHash('sha256');
  const pretrain = demoPretrainSettings(o.quickPretrain);
  hash.update(JSON.stringify({ RECIPE, modelConfig, pretrain, sft: probe.sft, systemPrompt: probe.data.systemPrompt, optim: probe.optim, microBatchTokens: probe.train.microBatchTokens }));
  for (const f of [env.files.corpus, env.files.train, env.files.valid, env.files.sft, env.files.tokenizer, env.files.tokenizerConfig]) hash.update(fs.readFileSync(f));
  const key = hash.digest('hex').slice(0, 12);
  const dir = path.resolve(o.cacheDir, `demo-world${o.worldSeed}-pre${pretrain.steps}-sft${o.traces}x${probe.sft.epochs}-${key}`);
  const marker = path.join(dir, 'checkpoint.json');
  if (fs.existsSync(marker)) {
    fs.rmSync(build, { recursive: true, force: true });
    // Paths are re-derived from where the cache is now (the folder may have moved with the checkout).
    const cached = { ...(JSON.parse(fs.readFileSync(marker, 'utf8')) as DemoCheckpoint), dir, envDir: path.join(dir, 'env'), modelDir: path.join(dir, 'model-sft') };
    if (fs.existsSync(path.join(cached.modelDir, 'config.json'))) {
      o.log(`[bench] e2e: reusing the SFT checkpoint ${cached.modelDir}`);
      return cached;
    }
  }
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const envDir = path.join(dir, 'env');
  fs.renameSync(envBuild, envDir);
  fs.rmSync(build, { recursive: true, force: true });
  o.log(`[bench] e2e: demo world (seed ${o.worldSeed}) in ${envDir}`);
  const modelDir = path.join(dir, 'model-sft');
  const cfg = demoRunConfig(envDir, modelDir, path.join(dir, 'rl'), o.worldSeed, false, 1, { ...(o.sftEpochs === null ? {} : { sft: { epochs: o.sftEpochs } }), data: { validLimit: o.checkExamples } });
  o.log(`[bench] e2e: pretraining (${pretrain.steps} steps) and SFT of the demo model on ${env.traces.length} traces x ${cfg.sft.epochs} epochs (cached afterwards)`);
  // One line every 100 steps: the full progress would drown the bench output.
  const quiet = { write: (s: string): boolean => (/step \d*00\//.test(s) ? process.stderr.write(`  ${s.trimStart()}`) : true) };
  const trained = await trainDemoModel({ envDir, sftFile: path.join(envDir, path.basename(env.files.sft)), traces: env.traces.length, out: dir, seed: o.worldSeed, cfg, pretrain, progress: quiet });
  const ev = await evaluate(modelDir, path.join(envDir, path.basename(env.files.valid)), cfg, { limit: o.checkExamples, workDir: dir });
  const m = ev.metrics;
  const result: DemoCheckpoint = {
    dir,
    envDir,
    modelDir,
    worldSeed: o.worldSeed,
    pretrain: { ...trained.pretrain },
    sft: { epochs: cfg.sft.epochs, traces: env.traces.length, steps: trained.sft.steps, firstLoss: trained.sft.firstLoss, lastLoss: trained.sft.lastLoss, seconds: trained.seconds.sft },
    check: {
      examples: m['valid/examples'] ?? 0,
      accuracy: m['acc/mean'] ?? NaN,
      reward: m['reward/mean'] ?? NaN,
      formatOk: m['format/ok'] ?? NaN,
      toolCallsPerTrajectory: m['tools/calls_per_traj'] ?? NaN,
    },
  };
  const tmp = `${marker}.tmp-${process.pid}`;
  fs.writeFileSync(tmp, `${JSON.stringify(result, null, 2)}\n`);
  fs.renameSync(tmp, marker);
  return result;
}
