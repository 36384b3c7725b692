// The rollout with the real tools of lib/tools (BM25 search over the ARPO
// search cache, the python sandbox) behind a ToolRunner, driven by the fake
// agent: real latencies and outputs, same determinism and accounting.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { runnerExecutor } from '../../lib/rollout/adapters';
import { rollout, type RolloutDeps } from '../../lib/rollout/scheduler';
import { formatResult } from '../../lib/tools/protocol';
import { ToolRunner } from '../../lib/tools/runner';
import { SearchIndex, SearchTool } from '../../lib/tools/search';
import { PythonTool } from '../../lib/tools/python';
import { EOS, FakeEngine, fakePrompt, fakeText } from './fake-engine';

const CACHE = path.resolve(__dirname, '../../../shared/data/arpo/search_cache.json');
const haveCache = fs.existsSync(CACHE);
const maybe = haveCache ? describe : describe.skip;

maybe('rollout with the real search and python tools', () => {
  let dir: string;
  let index: SearchIndex;
  let runner: ToolRunner;

  beforeAll(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-rollout-tools-'));
    index = await SearchIndex.openSearchCache(CACHE, { indexPath: path.join(dir, 'cache.sqlite') });
    runner = new ToolRunner({ concurrency: 4, timeoutMs: 10000 });
    runner.register(new SearchTool(index, { topK: 2, snippetChars: 80 }));
    runner.register(new PythonTool({ timeoutMs: 5000 }));
  }, 60000);

  afterAll(async () => {
    await index?.close?.();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  test('results from the real tools land in the tree, escaped and masked; two runs give identical trees', async () => {
    const run = () => {
      const engine = new FakeEngine({ toolRate: 0.08 });
      const deps: RolloutDeps = { engine, text: fakeText, executeTool: runnerExecutor(runner), eosTokenIds: [EOS] };
      return rollout(deps, [fakePrompt(1), fakePrompt(2)], 11, { budget: 4, initialSamples: 2, toolCallLimit: 2, maxResponseTokens: 1500, branchProbability: 0.7 }).then((r) => ({ r, engine }));
    };
    const { r: a, engine } = await run();
    const { r: b } = await run();
    expect(JSON.stringify(b.trees.map((t) => t.toJSON()))).toBe(JSON.stringify(a.trees.map((t) => t.toJSON())));
    expect(engine.livePaths).toBe(0);
    const results = a.trees.flatMap((t) => t.nodes.filter((n) => n.kind === 'tool_result'));
    expect(results.length).toBeGreaterThan(4);
    for (const n of results) {
      const text = fakeText.decode(n.tokens);
      // the real tool's answer for that content, formatted by the protocol, is exactly what was appended
      const again = await runner.run(n.tool?.tag as string, n.tool?.content as string);
      expect(text).toBe(fakeText.decode(fakeText.encode(formatResult(again.text))));
      expect(text.startsWith(' <result>\n') && text.endsWith('\n</result>')).toBe(true);
    }
    for (const t of a.trees.flatMap((x) => x.trajectories())) {
      for (const id of t.nodes) {
        const n = a.trees[t.prompt]?.node(id);
        if (n?.kind === 'tool_result') for (let i = n.start; i < n.start + n.tokens.length; i++) expect(t.lossMask[i]).toBe(0);
      }
    }
    const m = a.metrics;
    expect(Object.keys(m.toolCalls).sort()).toEqual(['python', 'search']);
    expect(m.toolMs).toBeGreaterThan(0);
    expect(m.toolResultsDropped).toBe(0);
  }, 60000);
});
