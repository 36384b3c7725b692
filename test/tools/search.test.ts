// Tests of the offline search engine: the real ARPO search cache (exact hits,
// BM25 quality), BM25 scores against a naive implementation of FTS5's formula,
// hostile queries, index reuse and rebuild, JSONL corpora and their errors.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import {
  createProtocol,
  defaultSearchCachePath,
  formatResult,
  makeSnippet,
  NO_RESULTS,
  parseToolCall,
  SearchIndex,
  SearchTool,
  splitCachedPages,
  toFtsQuery,
  ToolRunner,
} from '../../lib/tools';
import { mulberry32 as rng } from '../../lib/random';

const CACHE_FILE = defaultSearchCachePath();
const cache = JSON.parse(fs.readFileSync(CACHE_FILE, 'utf8')) as Record<string, string>;

let dir: string;
let index: SearchIndex;
beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-search-'));
  index = await SearchIndex.openSearchCache(CACHE_FILE, { indexPath: path.join(dir, 'cache.sqlite') });
});
afterAll(() => {
  index?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe('the ARPO search cache', () => {
  test('the default path finds the shared cache; ARPO_SEARCH_CACHE overrides it', () => {
    expect(fs.existsSync(CACHE_FILE)).toBe(true);
    expect(CACHE_FILE.endsWith(path.join('shared', 'data', 'arpo', 'search_cache.json'))).toBe(true);
    const before = process.env.ARPO_SEARCH_CACHE;
    process.env.ARPO_SEARCH_CACHE = '/somewhere/else.json';
    try {
      expect(defaultSearchCachePath()).toBe('/somewhere/else.json');
    } finally {
      if (before === undefined) delete process.env.ARPO_SEARCH_CACHE;
      else process.env.ARPO_SEARCH_CACHE = before;
    }
  });

  test('pages split and re-join to the cached text for all 1,000 queries', () => {
    let pages = 0;
    for (const answer of Object.values(cache)) {
      const p = splitCachedPages(answer);
      pages += p.length;
      expect(p.length ? p.map((x, i) => `Page ${i + 1}: ${x}`).join('\n') : NO_RESULTS).toBe(answer);
    }
    expect(index.size).toBe(pages);
    expect(index.cachedQueries()).toEqual(Object.keys(cache));
  });

  test('an exact hit returns the cached answer byte for byte (all 1,000), as the reference does', () => {
    const tool = new SearchTool(index);
    for (const [query, answer] of Object.entries(cache)) expect(tool.answer(query)).toBe(answer);
    // The reference strips double quotes before its lookup; we also collapse whitespace.
    const [q, a] = Object.entries(cache)[5] as [string, string];
    expect(tool.answer(`  "${q.replace(/ /g, '   ')}" `)).toBe(a);
    // Its top-k and length limits apply to hits too.
    const short = new SearchTool(index, { topK: 2, snippetChars: 20 });
    const want = splitCachedPages(a).slice(0, 2).map((p, i) => `Page ${i + 1}: ${[...p].slice(0, 20).join('')}`).join('\n');
    expect(short.answer(q)).toBe(want);
  });

  test('BM25 quality with exact hits off: the top page belongs to the query\'s cached pages', () => {
    let withPages = 0;
    let top1 = 0;
    let top10 = 0;
    for (const [query, answer] of Object.entries(cache)) {
      const pages = new Set(splitCachedPages(answer));
      if (pages.size === 0) continue;
      withPages++;
      const hits = index.search(query, 10);
      if (hits[0] && pages.has(hits[0].text)) top1++;
      if (hits.some((h) => pages.has(h.text))) top10++;
    }
    // Measured: 899 / 996 top-1, 983 / 996 top-10 (see bench/tools.ts).
    expect(withPages).toBe(996);
    expect(top1 / withPages).toBeGreaterThan(0.85);
    expect(top10 / withPages).toBeGreaterThan(0.95);
  });

  test('answers without an exact hit are formatted like the reference', () => {
    const tool = new SearchTool(index, { exactHits: false, topK: 3 });
    const text = tool.answer('Campfire Tales 1997 anthology horror film directors');
    const lines = text.split('\n');
    expect(lines).toHaveLength(3);
    lines.forEach((l, i) => expect(l.startsWith(`Page ${i + 1}: `)).toBe(true));
    expect(lines[0]).toMatch(/Campfire Tales/);
    expect(tool.answer('zzqxjv qqzzvx')).toBe(NO_RESULTS);
  });
});

describe('model-written queries never break the engine', () => {
  const hostile = [
    '',
    '   ',
    '"',
    '""""',
    "'; DROP TABLE docs; --",
    'a AND OR NOT b',
    'NEAR(a b, 2)',
    'NEAR',
    'film*',
    '*',
    '-',
    '-film -director',
    'title:Campfire',
    '{title text}: x',
    '^start',
    '(((unbalanced',
    'unbalanced)))',
    'a + b',
    '\u0000\u0001\u0002',
    '\u0301\u0301',
    '東京 タワー 高さ',
    'Ünïcödé ßtraße',
    '😀 🎬 film',
    'x'.repeat(100000),
    Array.from({ length: 5000 }, (_, i) => `w${i}`).join(' '),
    'search query: ',
    'search query: "Amy Smart"',
    '\uD800 lone surrogate',
    'AND',
    'OR OR OR',
  ];
  test.each(hostile.map((q) => [JSON.stringify(q).slice(0, 40), q]))('%s', (_label, q) => {
    const tool = new SearchTool(index, { exactHits: false });
    const out = tool.answer(q as string);
    expect(out === NO_RESULTS || out.startsWith('Page 1: ')).toBe(true);
    const fts = toFtsQuery(q as string);
    // Every FTS5 token is a quoted word: no operator survives.
    if (fts !== undefined) expect(fts).toMatch(/^"[^"]+"( OR "[^"]+")*$/);
  });
  test('queries with no word at all give no results', () => {
    expect(toFtsQuery('*-^:"()')).toBeUndefined();
    expect(index.search('*-^:"()')).toEqual([]);
  });
});

/** Naive BM25 exactly as SQLite's fts5_aux.c computes it (k1 = 1.2, b = 0.75, column weights). */
function naiveBm25(docs: Array<{ title: string; text: string }>, query: string[], weights: [number, number]): number[] {
  const tok = (s: string): string[] => s.toLowerCase().match(/[a-z0-9]+/g) ?? [];
  const rows = docs.map((d) => ({ title: tok(d.title), text: tok(d.text) }));
  const N = rows.length;
  const avgdl = rows.reduce((s, r) => s + r.title.length + r.text.length, 0) / N;
  return rows.map((r) => {
    let score = 0;
    for (const t of query) {
      const nHit = rows.filter((x) => x.title.includes(t) || x.text.includes(t)).length;
      let idf = Math.log((N - nHit + 0.5) / (nHit + 0.5));
      if (idf <= 0) idf = 1e-6;
      const f = weights[0] * r.title.filter((w) => w === t).length + weights[1] * r.text.filter((w) => w === t).length;
      const D = r.title.length + r.text.length;
      score += (idf * (f * 2.2)) / (f + 1.2 * (0.25 + (0.75 * D) / avgdl));
    }
    return -score;
  });
}


describe('JSONL corpora', () => {
  // Porter-stable, distinct words, so FTS5's stems and the naive words coincide.
  const words = ['alpha', 'bravo', 'delta', 'echo', 'golf', 'hotel', 'kilo', 'lima', 'oscar', 'papa', 'romeo', 'sierra', 'tango', 'victor', 'zulu'];
  const rand = rng(7);
  const pick = (n: number) => Array.from({ length: n }, () => words[Math.floor(rand() * words.length)]).join(' ');
  const docs = Array.from({ length: 40 }, (_, i) => ({ id: `d${i}`, title: pick(1 + Math.floor(rand() * 2)), text: pick(3 + Math.floor(rand() * 25)) }));

  test('BM25 scores and order equal the naive formula', async () => {
    const file = path.join(dir, 'docs.jsonl');
    fs.writeFileSync(file, docs.map((d) => JSON.stringify(d)).join('\n') + '\n');
    const idx = await SearchIndex.openJsonl(file, { indexPath: path.join(dir, 'docs.sqlite') });
    for (const query of [['alpha'], ['tango', 'zulu'], ['kilo', 'lima', 'papa'], ['victor', 'echo', 'golf', 'hotel']]) {
      const want = naiveBm25(docs, query, [2, 1]);
      const hits = idx.search(query.join(' '), 40);
      const matching = want.filter((s) => s < 0).length;
      expect(hits).toHaveLength(matching);
      for (const h of hits) expect(h.score).toBeCloseTo(want[Number(h.id.slice(1))] as number, 9);
      for (let i = 1; i < hits.length; i++) expect((hits[i] as { score: number }).score).toBeGreaterThanOrEqual((hits[i - 1] as { score: number }).score);
    }
    idx.close();
  });

  test('the index is reused while the corpus is unchanged and rebuilt when it changes', async () => {
    const file = path.join(dir, 'change.jsonl');
    const indexPath = path.join(dir, 'change.sqlite');
    fs.writeFileSync(file, '{"id":1,"title":"Old","text":"original words here"}\n');
    const a = await SearchIndex.openJsonl(file, { indexPath });
    expect(a.built).toBe(true);
    a.close();
    const b = await SearchIndex.openJsonl(file, { indexPath });
    expect(b.built).toBe(false);
    b.close();
    // Same bytes, new mtime: the stored SHA-256 still matches.
    const later = new Date(Date.now() + 5000);
    fs.utimesSync(file, later, later);
    const c = await SearchIndex.openJsonl(file, { indexPath });
    expect(c.built).toBe(false);
    c.close();
    // Same size, different bytes: rebuilt, and the new text is searchable.
    fs.writeFileSync(file, '{"id":1,"title":"New","text":"replaced words here"}\n');
    const d = await SearchIndex.openJsonl(file, { indexPath });
    expect(d.built).toBe(true);
    expect(d.search('replaced').map((h) => h.title)).toEqual(['New']);
    expect(d.search('original')).toEqual([]);
    d.close();
    // A garbage index file is replaced, not trusted.
    fs.writeFileSync(indexPath, 'not sqlite');
    const e = await SearchIndex.openJsonl(file, { indexPath });
    expect(e.built).toBe(true);
    e.close();
  });

  test('bad corpus lines are named with their line and field', async () => {
    const cases: Array<[string, string]> = [
      ['{"id":1,"text":"ok"}\n{"id":2,"title":"t"}\n', 'line 2: Expected a string for text but received undefined of type undefined'],
      ['{"id":1,"text":"ok"}\nnot json\n', 'line 2: not JSON'],
      ['[1,2]\n', 'line 1: Expected an object {id, title, text} for line but received Array(2) of type array'],
      ['{"id":{"a":1},"text":"x"}\n', 'line 1: Expected a string or number for id but received {"a":1} of type object'],
    ];
    for (const [body, message] of cases) {
      const file = path.join(dir, 'bad.jsonl');
      fs.writeFileSync(file, body);
      await expect(SearchIndex.openJsonl(file, { indexPath: path.join(dir, 'bad.sqlite') })).rejects.toThrow(message);
    }
    await expect(SearchIndex.openJsonl(path.join(dir, 'missing.jsonl'))).rejects.toThrow('Cannot read the search corpus');
    fs.writeFileSync(path.join(dir, 'badcache.json'), '{"q": 3}');
    await expect(SearchIndex.openSearchCache(path.join(dir, 'badcache.json'), { indexPath: path.join(dir, 'bc.sqlite') })).rejects.toThrow(
      'Expected a string for cached answer but received 3 of type number',
    );
  });

  test('long pages are cut to a snippet around the query words', () => {
    const filler = (n: number) => Array.from({ length: n }, (_, i) => `filler${i % 50}`).join(' ');
    const text = `${filler(300)} the quokka lives on Rottnest Island and the quokka smiles. ${filler(300)}`;
    const s = makeSnippet(text, 'where does the quokka live', 200);
    expect(s.length).toBeLessThanOrEqual(200);
    expect(s).toContain('quokka lives on Rottnest Island');
    expect(s.startsWith('…') && s.endsWith('…')).toBe(true);
    expect(text).toContain(s.slice(1, -1));
    expect(makeSnippet('short  text\n here', 'x', 200)).toBe('short text here');
  });
});

test('end to end: a model\'s search call parsed, run through the runner, formatted', async () => {
  const protocol = createProtocol();
  const runner = new ToolRunner().register(new SearchTool(index));
  const modelText = '<think> I need the director. </think> <search> search query: Who directed the film Love Finds Andy Hardy? </search>';
  const call = parseToolCall(modelText, protocol);
  expect(call.kind).toBe('call');
  if (call.kind !== 'call') return;
  const r = await runner.run(call.tag, call.content);
  expect(r.ok).toBe(true);
  expect(r.text).toBe(cache['search query: Who directed the film Love Finds Andy Hardy?']);
  const next = modelText + formatResult(r.text, protocol);
  expect(next.endsWith('\n</result>')).toBe(true);
  expect(parseToolCall(next, protocol)).toEqual({ kind: 'none', reason: 'no_call' });
});
