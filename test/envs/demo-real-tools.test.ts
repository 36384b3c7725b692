// The demo environment with the product's real tools (lib/tools: FTS5 search, sandboxed python):
// the SFT traces' planned queries retrieve their facts, and python computes the ground truths.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { buildDemoEnvironment } from '../../lib/envs/demo';
import { localPython } from '../../lib/envs/demo/local-tools';
import { openDemoTools, type DemoTools } from '../../lib/envs/demo/tools';
import { formatViolation } from './helpers';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-envs-real-'));
let tools: DemoTools | undefined;
afterAll(async () => {
  await tools?.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('demo environment with the real tools', () => {
  it('grounds every clean trace: top-3 BM25 pages hold the facts, python prints the answers', async () => {
    const env = await buildDemoEnvironment({
      seed: 9, dir: tmp,
      sizes: { questions: { train: 120, valid: 20, test: 20 }, sft: 120 },
      flawRates: { wrong_answer: 0, skipped_tool: 0, extra_search: 0, off_query: 0, bad_format: 0 },
      createRunTool: async ({ corpus }) => {
        tools = await openDemoTools(corpus, { indexPath: path.join(tmp, 'index.sqlite') });
        return tools.runTool;
      },
    });
    expect(env.manifest.toolBackend).toBe('custom');
    const search = env.traces.flatMap((t) => t.toolCalls.filter((c) => c.tool === 'search'));
    const python = env.traces.flatMap((t) => t.toolCalls.filter((c) => c.tool === 'python'));
    expect(search.length).toBeGreaterThan(60);
    expect(python.length).toBeGreaterThan(40);
    const ungrounded = env.traces.filter((t) => !t.grounded).map((t) => `${t.template}: ${JSON.stringify(t.toolCalls)}`);
    expect(ungrounded).toEqual([]);
    for (const t of env.traces) {
      expect(formatViolation(t.messages[2].content)).toBeNull();
      expect(t.correct).toBe(true);
    }
    for (const c of search) expect(c.result).toMatch(/^Page 1: \[/);
    // The recorded results are what the tools answer (the search index is deterministic).
    for (const c of search.slice(0, 20)) expect(await (tools as DemoTools).runTool('search', c.call)).toBe(c.result);
    expect((tools as DemoTools).runner.metrics().python?.failures).toBe(0);
    // The in-process stand-in prints the same text as the sandbox for these programs.
    for (const c of python) expect(localPython(c.call)).toBe(c.result);
    if (process.env.ARPO_ENVS_SHOW) console.log(env.traces.slice(0, 3).map((t) => t.messages[2].content).join('\n\n'));
  });
});
