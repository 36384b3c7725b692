// The rollout with a tiny real policy model (libtorch PolicyModel, paged KV
// cache with fork) and the real tools (BM25 search over the ARPO cache, the
// python sandbox): budget, branch placement, KV sharing, unforked replay,
// determinism under random tool latency and batch width, ARPO vs trajectory.
// Needs the full addon (ARPO_ADDON=/path/to/arpo.node built by cmake-js).
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import type { PolicyModel } from '../../lib/model/policy-model';
import { runnerExecutor } from '../../lib/rollout/adapters';
import { rollout, type RolloutDeps, type RolloutResult } from '../../lib/rollout/scheduler';
import type { RolloutSettings } from '../../lib/rollout/settings';
import type { RolloutTree } from '../../lib/rollout/tree';
import type { ToolExecutor } from '../../lib/rollout/types';
import { PythonTool } from '../../lib/tools/python';
import { ToolRunner } from '../../lib/tools/runner';
import { SearchIndex, SearchTool } from '../../lib/tools/search';
import { EOS, fakePrompt, fakeText, lcg } from './fake-engine';
import { tinyAgentModel, torchAvailable } from './tiny-agent-model';

const CACHE = path.resolve(__dirname, '../../../shared/data/arpo/search_cache.json');
const ready = torchAvailable() && fs.existsSync(CACHE);
if (!ready) console.warn('full addon (libtorch) or search cache missing: real-model rollout tests skipped (set ARPO_ADDON)');
const maybe = ready ? describe : describe.skip;

maybe('rollout with a tiny real model and the real tools', () => {
  let dir: string;
  let model: PolicyModel;
  let index: SearchIndex;
  let runner: ToolRunner;
  const prompts = [fakePrompt(1), fakePrompt(2), fakePrompt(3)];
  const settings: Partial<RolloutSettings> = { budget: 6, initialSamples: 3, toolCallLimit: 3, maxResponseTokens: 96, branchProbability: 0.95 };

  beforeAll(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-rollout-model-'));
    model = await tinyAgentModel(path.join(dir, 'model'), 3);
    index = await SearchIndex.openSearchCache(CACHE, { indexPath: path.join(dir, 'cache.sqlite') });
    runner = new ToolRunner({ concurrency: 4, timeoutMs: 10000 });
    runner.register(new SearchTool(index, { topK: 1, snippetChars: 60 }));
    runner.register(new PythonTool({ timeoutMs: 5000 }));
  }, 60000);

  afterAll(async () => {
    model?.dispose();
    await runner?.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  const deps = (executeTool: ToolExecutor = runnerExecutor(runner)): RolloutDeps => ({ engine: model, text: fakeText, executeTool, eosTokenIds: [EOS] });
  const withLatency = (seed: number): ToolExecutor => {
    const r = lcg(seed);
    const exec = runnerExecutor(runner);
    return async (tag, content, signal) => {
      await new Promise((res) => setTimeout(res, Math.floor(r() * 30)));
      return exec(tag, content, signal);
    };
  };

  let first: RolloutResult;

  test('exactly M leaves per prompt, branches at tool-result ends, KV shared and fully released', async () => {
    let shared = 0;
    const engine = Object.create(model) as PolicyModel;
    engine.extend = async (paths, inputs, sampling) => {
      const s = model.cacheStats();
      shared = Math.max(shared, s.bytesUnshared - s.bytesUsed);
      return model.extend(paths, inputs, sampling);
    };
    first = await rollout({ ...deps(), engine }, prompts, 21, settings);
    for (const tree of first.trees) expect(tree.leafCount).toBe(6);
    expect(first.metrics.paths.branch).toBeGreaterThan(0);
    for (const d of first.decisions.filter((x) => x.branches > 0)) {
      const tree = first.trees[d.prompt] as RolloutTree;
      for (const b of d.branchPaths) {
        const node = tree.nodes.find((n) => n.path === b && n.origin === 'branch');
        const parent = tree.node(node?.parent as number);
        expect(parent.kind).toBe('tool_result');
        expect(node?.start).toBe(parent.start + parent.tokens.length);
      }
    }
    expect(shared).toBeGreaterThan(0); // forks hold shared blocks while they run
    const stats = model.cacheStats();
    expect(stats.paths).toBe(0);
    expect(stats.blocksUsed).toBe(0);
    const executed = Object.values(first.metrics.toolCalls).reduce((a, c) => a + c.executed, 0);
    expect(executed).toBeGreaterThan(3);
  }, 60000);

  test('every leaf matches an unforked replay on the same model token for token', async () => {
    let own = 0;
    for (const tree of first.trees) {
      for (const leaf of tree.leaves) {
        const t = tree.trajectory(leaf.index);
        const firstOwn = Array.from(t.nodes).map((id) => tree.node(id)).find((n) => n.kind === 'generated' && n.path === leaf.path);
        if (!firstOwn) throw new Error('leaf without own tokens');
        const id = model.newPath(leaf.stream);
        try {
          let pos = firstOwn.start;
          let feed = t.tokens.slice(0, pos);
          while (pos < t.tokens.length) {
            const r = await model.extend([id], [feed], { temperature: 1, seed: 21 });
            expect(r.tokens[0]).toBe(t.tokens[pos]);
            expect(Math.abs((r.logprobs[0] as number) - (t.logprobs[pos] as number))).toBeLessThan(1e-4);
            own++;
            let end = pos + 1;
            while (end < t.tokens.length && t.lossMask[end] === 0) end++;
            feed = t.tokens.slice(pos, end);
            pos = end;
          }
        } finally {
          model.freePath(id);
        }
      }
    }
    expect(own).toBeGreaterThan(100);
  }, 60000);

  test('same seed, random tool latency and a narrow batch: the same trees', async () => {
    const again = await rollout(deps(withLatency(5)), prompts, 21, { ...settings, maxBatchPaths: 2 });
    const shape = (r: RolloutResult) => JSON.stringify(r.trees.map((t) => t.toJSON().nodes.map((n) => [n.kind, n.parent, n.path, n.tokens, n.tool?.content])));
    expect(shape(again)).toBe(shape(first));
    const lp = (r: RolloutResult) => r.trees.flatMap((t) => t.nodes.flatMap((n) => [...n.logprobs]));
    const a = lp(first);
    const b = lp(again);
    expect(b.length).toBe(a.length);
    a.forEach((x, i) => expect(Math.abs(x - (b[i] as number))).toBeLessThan(1e-4));
    expect(again.decisions.map((d) => [d.prompt, d.path, d.toolCall, d.fired, d.branches])).toEqual(first.decisions.map((d) => [d.prompt, d.path, d.toolCall, d.fired, d.branches]));
  }, 60000);

  test('ARPO and the trajectory-level baseline at equal M on the same prompts', async () => {
    const traj = await rollout(deps(), prompts, 21, { ...settings, mode: 'trajectory' });
    for (const tree of traj.trees) expect(tree.leafCount).toBe(6);
    const sum = (r: RolloutResult) => Object.values(r.metrics.toolCalls).reduce((a, c) => a + c.executed, 0);
    console.log(
      [
        `M = 6, 3 prompts, tiny real model + real tools`,
        `arpo:       computed ${first.metrics.tokensComputed}, generated ${first.metrics.tokensGenerated}, tool calls ${sum(first)}, branches ${first.metrics.branches}, wall ${first.metrics.wallMs.toFixed(0)} ms`,
        `trajectory: computed ${traj.metrics.tokensComputed}, generated ${traj.metrics.tokensGenerated}, tool calls ${sum(traj)}, wall ${traj.metrics.wallMs.toFixed(0)} ms`,
      ].join('\n'),
    );
    expect(traj.metrics.branches).toBe(0);
    expect(traj.metrics.leafTokensTotal).toBe(traj.metrics.leafTokensUnique);
    expect(first.metrics.leafTokensUnique).toBeLessThan(first.metrics.leafTokensTotal);
  }, 60000);
});
