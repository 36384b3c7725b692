// Tool latency and search quality: median per-call latency of each tool over
// 50 calls, and how often search finds the right pages for the 1,000 cached
// ARPO queries. Run: npx ts-node --transpile-only bench/tools.ts
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import {
  defaultSearchCachePath,
  McpConnection,
  PythonTool,
  SearchIndex,
  SearchTool,
  splitCachedPages,
  ToolCallCache,
  ToolRunner,
} from '../lib/tools';
import { quantile } from './summary';

const CALLS = 50;

async function time(label: string, runner: ToolRunner, tag: string, content: (i: number) => string): Promise<void> {
  const ms: number[] = [];
  for (let i = 0; i < CALLS; i++) {
    const t0 = performance.now();
    const r = await runner.run(tag, content(i));
    ms.push(performance.now() - t0);
    if (!r.ok) throw new Error(`${label}: call ${i} failed: ${r.text}`);
  }
  console.log(`${label.padEnd(44)} median ${quantile(ms, 0.5).toFixed(2).padStart(8)} ms   p90 ${quantile(ms, 0.9).toFixed(2).padStart(8)} ms`);
}

async function main(): Promise<void> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-bench-tools-'));
  const cacheFile = defaultSearchCachePath();
  const cache = JSON.parse(fs.readFileSync(cacheFile, 'utf8')) as Record<string, string>;
  const queries = Object.keys(cache);
  try {
    // ---- index build / reopen
    let t0 = performance.now();
    const index = await SearchIndex.openSearchCache(cacheFile, { indexPath: path.join(dir, 'cache.sqlite') });
    const buildMs = performance.now() - t0;
    index.close();
    t0 = performance.now();
    const reopened = await SearchIndex.openSearchCache(cacheFile, { indexPath: path.join(dir, 'cache.sqlite') });
    console.log(`search index: ${reopened.size} pages; build ${buildMs.toFixed(0)} ms, reopen ${(performance.now() - t0).toFixed(1)} ms (rebuilt: ${reopened.built})`);

    // ---- search quality (definitions in the report)
    const exactTool = new SearchTool(reopened);
    let exact = 0;
    let withPages = 0;
    let top1 = 0;
    let top10 = 0;
    for (const q of queries) {
      const answer = cache[q] as string;
      if (exactTool.answer(q) === answer) exact++;
      const pages = new Set(splitCachedPages(answer));
      if (pages.size === 0) continue;
      withPages++;
      const hits = reopened.search(q, 10);
      if (hits[0] && pages.has(hits[0].text)) top1++;
      if (hits.some((h) => pages.has(h.text))) top10++;
    }
    const pct = (a: number, b: number) => `${a}/${b} = ${((100 * a) / b).toFixed(1)}%`;
    console.log(`exact hit returns the cached answer verbatim: ${pct(exact, queries.length)}`);
    console.log(`BM25 only (exact hits off), top-1 page is one of the query's cached pages: ${pct(top1, withPages)} of queries with pages (${pct(top1, queries.length)} of all)`);
    console.log(`BM25 only, any of top-10 pages is one of the query's cached pages: ${pct(top10, withPages)}`);

    // ---- latency per tool call (through the runner: pool, timeout, truncation included)
    const runner = new ToolRunner({ concurrency: 1 });
    runner.register(exactTool);
    await time('search, exact cache hit', runner, 'search', (i) => queries[i] as string);
    const bm25 = new ToolRunner({ concurrency: 1 }).register(new SearchTool(reopened, { exactHits: false }));
    await time('search, BM25 top-10 + snippets', bm25, 'search', (i) => queries[i + 100] as string);
    const py = new ToolRunner({ concurrency: 1 }).register(new PythonTool());
    console.log(`python isolation: ${(py.tool('python') as PythonTool).sandbox.isolation.summary}`);
    await time('python, `sum(range(i))` (fresh sandbox)', py, 'python', (i) => `sum(range(${i}))`);
    await time('python, import numpy + sympy', py, 'python', (i) => `import numpy as np, sympy\nint(np.arange(${i}).sum())`);
    const conn = await McpConnection.connect({ command: process.execPath, args: [path.join(__dirname, '..', 'test', 'tools', 'fixtures', 'mcp-server.js')], name: 'bench' });
    const mcp = new ToolRunner({ concurrency: 1 }).register(conn.mount('reverse'));
    await time('mcp (stdio, node server), reverse', mcp, 'reverse', (i) => `text ${i}`);
    await conn.close();
    const replay = ToolCallCache.open(path.join(dir, 'calls.sqlite'));
    const cached = new ToolRunner({ concurrency: 1, cache: replay }).register(new PythonTool());
    await cached.run('python', '6 * 7');
    await time('python, replay-cache hit', cached, 'python', () => '6 * 7');
    replay.close();
    reopened.close();
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
