// The cost of train.deterministic (batch-invariant decoding), in its own
// process: the same ARPO rollout of the demo world from the bench checkpoint
// (same prompts and seed) with the plain engine and with the batch-invariant
// one, alternated rep by rep; wall and model seconds, and whether two
// invariant rollouts gave identical trees while the tools' timing varied.
//
//   ts-node --transpile-only bench/determinism-run.ts '{"envDir":...,"modelDir":...,"seed":1,"quick":true,"reps":2}'
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { demoRunConfig } from '../lib/cli/demo';
import { PolicyModel } from '../lib/model/policy-model';
import { Tokenizer } from '../lib/model/tokenizer';
import { rollout, type RolloutResult } from '../lib/rollout';
import { buildTools, loadDataset, promptIds, rolloutDeps, rolloutSettings } from '../lib/train/setup';
import { childMain } from './summary';
import { stepSeed } from '../lib/train/trainer';

export interface DeterminismRunSpec {
  envDir: string;
  modelDir: string;
  seed: number;
  quick: boolean;
  reps: number;
}

export interface DeterminismResult {
  plain: { wallSeconds: number; modelSeconds: number; tokensComputed: number }[];
  invariant: { wallSeconds: number; modelSeconds: number; tokensComputed: number }[];
  /** Invariant rollouts of every rep: identical token trees. */
  invariantIdentical: boolean;
  /** Plain rollouts of every rep: identical token trees (they need not be). */
  plainIdentical: boolean;
  trajectories: number;
}

const fingerprint = (r: RolloutResult): string => JSON.stringify(r.trees.map((t) => t.nodes.map((n) => [n.parent, n.tokens])));

export async function runDeterminism(spec: DeterminismRunSpec): Promise<DeterminismResult> {
  const runDir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-determinism-'));
  try {
    const cfg = demoRunConfig(spec.envDir, spec.modelDir, runDir, spec.seed, spec.quick, 1, {});
    const tokenizer = Tokenizer.fromDir(cfg.model.tokenizer ?? spec.modelDir);
    const plainModel = await PolicyModel.load(spec.modelDir, { threads: cfg.model.threads });
    const invariantModel = await PolicyModel.load(spec.modelDir, { threads: cfg.model.threads, batchInvariant: true });
    const tools = await buildTools(cfg, runDir);
    try {
      const data = await loadDataset(cfg.data.train!, cfg);
      const examples = data.sampler({ batchSize: cfg.train.batchPrompts, seed: spec.seed, shuffle: true }).next();
      const prompts = examples.map((e) => promptIds(e, tokenizer, cfg.data.systemPrompt));
      const out: DeterminismResult = { plain: [], invariant: [], invariantIdentical: true, plainIdentical: true, trajectories: 0 };
      const prints = { plain: new Set<string>(), invariant: new Set<string>() };
      for (let rep = 0; rep < spec.reps; rep++) {
        for (const kind of rep % 2 === 0 ? (['plain', 'invariant'] as const) : (['invariant', 'plain'] as const)) {
          const model = kind === 'plain' ? plainModel : invariantModel;
          const t0 = process.hrtime.bigint();
          const r = await rollout(rolloutDeps(model, tokenizer, tools.runner, cfg.model.path), prompts, stepSeed(spec.seed, 'train', 1), rolloutSettings(cfg));
          out[kind].push({ wallSeconds: Number(process.hrtime.bigint() - t0) / 1e9, modelSeconds: r.metrics.modelMs / 1000, tokensComputed: r.metrics.tokensComputed });
          prints[kind].add(fingerprint(r));
          out.trajectories = r.metrics.trajectories;
        }
      }
      out.invariantIdentical = prints.invariant.size === 1;
      out.plainIdentical = prints.plain.size === 1;
      return out;
    } finally {
      await tools.close();
      plainModel.dispose();
      invariantModel.dispose();
    }
  } finally {
    fs.rmSync(runDir, { recursive: true, force: true });
  }
}

if (require.main === module) {
  childMain<DeterminismRunSpec, unknown>('determinism-run', "ts-node --transpile-only bench/determinism-run.ts '{\"envDir\":...,\"modelDir\":...,\"seed\":1,\"quick\":true,\"reps\":2}'", () => true, runDeterminism);
}
