// ARPO tree rollout vs the trajectory-level baseline at equal budget M on the
// same prompts, with the real tools (BM25 search over the ARPO search cache,
// the python sandbox): tokens computed, tool calls executed, wall time.
//
//   npx ts-node --transpile-only bench/rollout.ts [--prompts 8] [--budget 16] [--initial 8] [--seed 1]
//       [--engine fake|tiny|model] [--model-dir DIR] [--max-tokens 512] [--json out.json]
//
// `fake` (default): the deterministic fake agent of test/rollout (pure TS).
// `tiny`: a tiny real libtorch PolicyModel over the fake agent's vocabulary,
// weighted to write tool tags (test/rollout/tiny-agent-model.ts; needs the full
// addon). `model`: lib/model's PolicyModel from an HF directory (tokenizer +
// weights), prompts from the ARPO valid set.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import type { GenerationEngine } from '../lib/model/types';
import { rollout, runnerExecutor, type RolloutMetrics, type TokenText } from '../lib/rollout';
import { PythonTool } from '../lib/tools/python';
import { ToolRunner } from '../lib/tools/runner';
import { SearchIndex, SearchTool } from '../lib/tools/search';
import { EOS, FakeEngine, fakePrompt, fakeText } from '../test/rollout/fake-engine';

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? (process.argv[i + 1] as string) : fallback;
}

interface Setup {
  engine: () => GenerationEngine;
  text: TokenText;
  eos: number[];
  prompts: number[][];
  dispose: () => Promise<void>;
}

async function fakeSetup(n: number): Promise<Setup> {
  return { engine: () => new FakeEngine(), text: fakeText, eos: [EOS], prompts: Array.from({ length: n }, (_, i) => fakePrompt(i)), dispose: async () => {} };
}

async function tinySetup(n: number): Promise<Setup> {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { tinyAgentModel } = require('../test/rollout/tiny-agent-model') as typeof import('../test/rollout/tiny-agent-model');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-bench-tiny-'));
  const model = await tinyAgentModel(dir, 3);
  return {
    engine: () => model,
    text: fakeText,
    eos: [EOS],
    prompts: Array.from({ length: n }, (_, i) => fakePrompt(i)),
    dispose: async () => {
      model.dispose();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The real policy model, loaded only when asked for (lib/model/policy-model.ts is optional at this layer). */
async function modelSetup(n: number, dir: string): Promise<Setup> {
  /* eslint-disable @typescript-eslint/no-require-imports */
  const pm = require('../lib/model/policy-model') as { PolicyModel: { load(dir: string, opts?: object): Promise<GenerationEngine & { dispose(): void }> } };
  const { Tokenizer } = require('../lib/model/tokenizer') as typeof import('../lib/model/tokenizer');
  const { PromptDataset } = require('../lib/data') as typeof import('../lib/data');
  /* eslint-enable @typescript-eslint/no-require-imports */
  const tokenizer = Tokenizer.fromDir(dir);
  const model = await pm.PolicyModel.load(dir);
  const data = await (PromptDataset as unknown as { load(file: string, o?: object): Promise<{ examples: { prompt: { role: string; content: string }[] }[] }> }).load(
    path.resolve(__dirname, '../../shared/data/arpo/valid.parquet'),
  );
  const prompts = data.examples.slice(0, n).map((e) => Array.from(tokenizer.applyChatTemplate(e.prompt as never, { addGenerationPrompt: true } as never).ids as ArrayLike<number>));
  const eos = [tokenizer.eosTokenId, tokenizer.padTokenId].filter((x): x is number => x !== null);
  return {
    engine: () => model,
    text: { encode: (t) => tokenizer.encodeToolResult(t), decode: (ids) => tokenizer.decode(ids) },
    eos,
    prompts,
    dispose: async () => model.dispose(),
  };
}

function row(name: string, m: RolloutMetrics): string {
  const executed = Object.values(m.toolCalls).reduce((a, c) => a + c.executed, 0);
  const inherited = Object.values(m.toolCalls).reduce((a, c) => a + c.inherited, 0);
  return [
    name.padEnd(11),
    String(m.trajectories).padStart(6),
    String(m.tokensComputed).padStart(9),
    String(m.tokensGenerated).padStart(9),
    `${m.leafTokensUnique}/${m.leafTokensTotal}`.padStart(13),
    String(executed).padStart(6),
    String(inherited).padStart(6),
    `${m.decisionsFired}/${m.decisions}`.padStart(7),
    String(m.branches).padStart(5),
    m.wallMs.toFixed(0).padStart(8),
    m.modelMs.toFixed(0).padStart(8),
    m.toolMs.toFixed(0).padStart(8),
  ].join(' ');
}

async function main(): Promise<void> {
  const n = Number(arg('prompts', '8'));
  const budget = Number(arg('budget', '16'));
  const initial = Number(arg('initial', '8'));
  const seed = Number(arg('seed', '1'));
  const maxTokens = Number(arg('max-tokens', '512'));
  const kind = arg('engine', 'fake');
  const setup = kind === 'model' ? await modelSetup(n, arg('model-dir', '')) : kind === 'tiny' ? await tinySetup(n) : await fakeSetup(n);

  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-bench-rollout-'));
  const index = await SearchIndex.openSearchCache(undefined, { indexPath: path.join(dir, 'cache.sqlite') });
  const runner = new ToolRunner({ concurrency: 8, timeoutMs: 20000 });
  runner.register(new SearchTool(index, { topK: 3, snippetChars: 200 }));
  runner.register(new PythonTool({ timeoutMs: 10000 }));
  const common = { budget, maxResponseTokens: maxTokens };
  const out: Record<string, RolloutMetrics> = {};
  try {
    console.log(`${kind} engine, ${n} prompts, M = ${budget}, N = ${initial}, seed ${seed}, real tools (search cache BM25 + python sandbox)`);
    console.log('mode        leaves  computed generated  unique/total  tools inhrtd  fired  brch   wallms  modelms   toolms');
    for (const [name, settings] of [
      ['arpo', { ...common, mode: 'arpo' as const, initialSamples: initial }],
      ['trajectory', { ...common, mode: 'trajectory' as const }],
    ] as const) {
      const r = await rollout({ engine: setup.engine(), text: setup.text, executeTool: runnerExecutor(runner), eosTokenIds: setup.eos }, setup.prompts, seed, settings);
      out[name] = r.metrics;
      console.log(row(name, r.metrics));
    }
  } finally {
    await runner.close();
    fs.rmSync(dir, { recursive: true, force: true });
    await setup.dispose();
  }
  const json = arg('json', '');
  if (json) fs.writeFileSync(json, JSON.stringify(out, null, 2));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
