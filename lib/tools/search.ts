// Offline search engine: SQLite FTS5 (BM25 ranking) over a JSONL corpus or the
// ARPO reference's cache of real web-search results, formatted like the
// reference's search tool ("Page 1: …\nPage 2: …").
import { createHash } from 'crypto';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import Database from 'better-sqlite3';
import { ArpoError, invalidArgument } from '../errors';
import { packageRoot } from '../native/loader';
import { readCorpus, type CorpusKind, type CorpusPage } from './corpus';
import type { Tool, ToolCallContext } from './tool';

/** Bumped whenever the index layout or tokenizer changes, forcing a rebuild. */
const INDEX_VERSION = '1';
// Porter stemming over unicode61 (case folding, diacritics removed): "films" matches "film".
const TOKENIZER = 'porter unicode61 remove_diacritics 2';

/** The reference's answer when nothing matches (BingSearchTool._format_results). */
export const NO_RESULTS = 'No search results found.';

/** The ARPO search cache: `ARPO_SEARCH_CACHE`, else `../shared/data/arpo/search_cache.json` from the package root. */
export function defaultSearchCachePath(): string {
  const fromEnv = process.env.ARPO_SEARCH_CACHE;
  if (fromEnv) return path.resolve(fromEnv);
  return path.resolve(packageRoot(), '..', 'shared', 'data', 'arpo', 'search_cache.json');
}

/** Where indexes live unless told: `ARPO_SEARCH_INDEX_DIR`, else `~/.cache/arpo/search`. */
export function defaultIndexDir(): string {
  return process.env.ARPO_SEARCH_INDEX_DIR ? path.resolve(process.env.ARPO_SEARCH_INDEX_DIR) : path.join(os.homedir(), '.cache', 'arpo', 'search');
}

/**
 * The cache's lookup key: the reference strips every `"` before its exact
 * dictionary lookup (`query.replace('"', '')`); we also trim and collapse
 * whitespace, so `  a   b ` finds `a b`.
 */
export function normalizeQuery(query: string): string {
  return query.replace(/"/g, '').replace(/\s+/g, ' ').trim();
}

const MAX_TERMS = 64;
const MAX_TERM_CHARS = 64;

/** Query words as FTS5 sees them: runs of letters, digits and combining marks, lower-cased, deduplicated. */
export function queryTerms(query: string): string[] {
  const seen = new Set<string>();
  for (const m of query.normalize('NFC').matchAll(/[\p{L}\p{N}\p{M}]+/gu)) {
    const t = m[0].toLowerCase().slice(0, MAX_TERM_CHARS);
    // A lone mark is not a token for unicode61; it would make an empty phrase.
    if (/[\p{L}\p{N}]/u.test(t)) seen.add(t);
    if (seen.size >= MAX_TERMS) break;
  }
  return [...seen];
}

// Function words: they match nearly every page, so BM25 gains nothing from
// them and each costs a long posting-list scan (6x slower on the ARPO cache).
const STOPWORDS = new Set(
  'a an and are as at be been by did do does for from how in into is it its of on or than that the then this to was were what when where which who whom whose why with'.split(' '),
);

/**
 * The words a query is searched by: a leading `search query:` is dropped
 * (626 of the 1,000 real model-written queries in the ARPO cache start with
 * it, copied from the system prompt's placeholder "search query here"), and so
 * are stopwords unless nothing else is left.
 */
export function searchTerms(query: string): string[] {
  const terms = queryTerms(query.replace(/^\s*search\s+query\s*:\s*/i, ''));
  const content = terms.filter((t) => !STOPWORDS.has(t));
  return content.length ? content : terms;
}

/**
 * A model-written query as a safe FTS5 expression: each word becomes a quoted
 * string (so `AND`, `NEAR`, `*`, `-`, `col:`, `^` are plain words) joined by OR
 * (BM25 then ranks pages by how many and how rare the matched words are).
 * Returns undefined when the query has no word at all.
 */
export function toFtsQuery(query: string): string | undefined {
  const terms = searchTerms(query);
  return terms.length ? terms.map((t) => `"${t}"`).join(' OR ') : undefined;
}

/** One ranked page. */
export interface SearchHit {
  readonly id: string;
  readonly title: string;
  readonly text: string;
  /** bm25() of FTS5: lower is better (0 for exact cache hits). */
  readonly score: number;
  /** For search-cache corpora: the cached query the page came from. */
  readonly sourceQuery?: string;
}

export interface SearchIndexOptions {
  /** Index file; default `<defaultIndexDir()>/<corpus name>-<hash of its path>.sqlite`. */
  indexPath?: string;
  /** Rebuild even when the stored corpus fingerprint matches. */
  rebuild?: boolean;
}

interface Fingerprint {
  size: number;
  mtimeMs: number;
  sha256: string;
}

function sha256File(file: string): string {
  return createHash('sha256').update(fs.readFileSync(file)).digest('hex');
}

const BUILD_SQL = `
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE queries (qid INTEGER PRIMARY KEY, query TEXT NOT NULL, norm TEXT NOT NULL UNIQUE);
CREATE TABLE docs (rowid INTEGER PRIMARY KEY, id TEXT NOT NULL, title TEXT NOT NULL, text TEXT NOT NULL, qid INTEGER, page INTEGER);
CREATE INDEX docs_qid ON docs (qid, page);
CREATE VIRTUAL TABLE docs_fts USING fts5(title, text, content='docs', content_rowid='rowid', tokenize='${TOKENIZER}');
`;

/**
 * A BM25 index of one corpus file, built once into an SQLite file and reopened
 * while the corpus is unchanged (its size, mtime and SHA-256 are stored).
 */
export class SearchIndex {
  readonly corpusPath: string;
  readonly indexPath: string;
  readonly kind: CorpusKind;
  /** SHA-256 of the corpus file the index was built from. */
  readonly corpusHash: string;
  /** Whether this open built the index (false: reused the file). */
  readonly built: boolean;
  private db: Database.Database | undefined;

  private constructor(corpusPath: string, indexPath: string, kind: CorpusKind, db: Database.Database, built: boolean) {
    this.corpusPath = corpusPath;
    this.indexPath = indexPath;
    this.kind = kind;
    this.db = db;
    this.built = built;
    this.corpusHash = this.meta('corpus_sha256') ?? '';
  }

  /** Opens (building if needed) the index of a JSONL corpus of `{id, title, text}` lines. */
  static async openJsonl(corpusPath: string, options: SearchIndexOptions = {}): Promise<SearchIndex> {
    return SearchIndex.open(corpusPath, 'jsonl', options);
  }

  /** Opens (building if needed) the index of an ARPO search cache (`{query: "Page 1: …"}`); default file: {@link defaultSearchCachePath}. */
  static async openSearchCache(cachePath: string = defaultSearchCachePath(), options: SearchIndexOptions = {}): Promise<SearchIndex> {
    return SearchIndex.open(cachePath, 'search-cache', options);
  }

  static async open(corpusPath: string, kind: CorpusKind, options: SearchIndexOptions = {}): Promise<SearchIndex> {
    if (typeof corpusPath !== 'string' || corpusPath.length === 0) throw invalidArgument('a corpus file path', 'corpusPath', corpusPath);
    if (kind !== 'jsonl' && kind !== 'search-cache') throw invalidArgument('"jsonl" or "search-cache"', 'kind', kind);
    const corpus = path.resolve(corpusPath);
    let stat: fs.Stats;
    try {
      stat = fs.statSync(corpus);
    } catch (e) {
      throw new ArpoError('BAD_DATA', `Cannot read the search corpus ${corpus}: ${(e as Error).message}. Set ARPO_SEARCH_CACHE or pass the path.`, { cause: e });
    }
    const indexPath = path.resolve(
      options.indexPath ?? path.join(defaultIndexDir(), `${path.basename(corpus).replace(/[^\w.-]/g, '_')}-${createHash('sha256').update(corpus).digest('hex').slice(0, 12)}.sqlite`),
    );
    if (!options.rebuild && fs.existsSync(indexPath)) {
      const reused = SearchIndex.tryReuse(corpus, indexPath, kind, stat);
      if (reused) return reused;
    }
    const fp: Fingerprint = { size: stat.size, mtimeMs: stat.mtimeMs, sha256: sha256File(corpus) };
    await SearchIndex.build(corpus, indexPath, kind, fp);
    const db = new Database(indexPath, { readonly: true, fileMustExist: true });
    return new SearchIndex(corpus, indexPath, kind, db, true);
  }

  /** The existing index when it was built from this very corpus (size+mtime, else SHA-256), else undefined. */
  private static tryReuse(corpus: string, indexPath: string, kind: CorpusKind, stat: fs.Stats): SearchIndex | undefined {
    let db: Database.Database | undefined;
    try {
      db = new Database(indexPath, { readonly: true, fileMustExist: true });
      const rows = db.prepare('SELECT key, value FROM meta').all() as Array<{ key: string; value: string }>;
      const meta = new Map(rows.map((r) => [r.key, r.value]));
      const same =
        meta.get('version') === INDEX_VERSION &&
        meta.get('kind') === kind &&
        meta.get('corpus_size') === String(stat.size) &&
        (meta.get('corpus_mtime_ms') === String(stat.mtimeMs) || meta.get('corpus_sha256') === sha256File(corpus));
      if (same) return new SearchIndex(corpus, indexPath, kind, db, false);
    } catch {
      /* unreadable or foreign file: rebuild it */
    }
    db?.close();
    return undefined;
  }

  /** Builds into a temporary file, then renames it over `indexPath` (atomic: readers never see half an index). */
  private static async build(corpus: string, indexPath: string, kind: CorpusKind, fp: Fingerprint): Promise<void> {
    fs.mkdirSync(path.dirname(indexPath), { recursive: true });
    const tmp = `${indexPath}.${process.pid}.${Date.now()}.tmp`;
    const db = new Database(tmp);
    try {
      db.pragma('journal_mode = OFF');
      db.pragma('synchronous = OFF');
      db.exec(BUILD_SQL);
      const putQuery = db.prepare('INSERT OR IGNORE INTO queries (query, norm) VALUES (?, ?)');
      const findQuery = db.prepare('SELECT qid FROM queries WHERE norm = ?');
      const putDoc = db.prepare('INSERT INTO docs (id, title, text, qid, page) VALUES (?, ?, ?, ?, ?)');
      let batch: CorpusPage[] = [];
      const flush = db.transaction((pages: CorpusPage[]) => {
        for (const p of pages) {
          let qid: number | null = null;
          if (p.query !== undefined) {
            const norm = normalizeQuery(p.query);
            putQuery.run(p.query, norm);
            qid = (findQuery.get(norm) as { qid: number }).qid;
          }
          // A query with no pages ("No search results found.") is stored with no docs.
          if (p.text !== undefined) putDoc.run(p.id, p.title, p.text, qid, p.page ?? null);
        }
      });
      for await (const page of readCorpus(corpus, kind)) {
        batch.push(page);
        if (batch.length >= 2000) {
          flush(batch);
          batch = [];
        }
      }
      flush(batch);
      db.exec("INSERT INTO docs_fts (docs_fts) VALUES ('rebuild'); INSERT INTO docs_fts (docs_fts) VALUES ('optimize');");
      const putMeta = db.prepare('INSERT INTO meta (key, value) VALUES (?, ?)');
      const meta: Array<[string, string]> = [
        ['version', INDEX_VERSION],
        ['kind', kind],
        ['tokenizer', TOKENIZER],
        ['corpus_path', corpus],
        ['corpus_size', String(fp.size)],
        ['corpus_mtime_ms', String(fp.mtimeMs)],
        ['corpus_sha256', fp.sha256],
      ];
      db.transaction(() => meta.forEach(([k, v]) => putMeta.run(k, v)))();
      db.close();
      fs.renameSync(tmp, indexPath);
    } catch (e) {
      if (db.open) db.close();
      fs.rmSync(tmp, { force: true });
      throw e;
    }
  }

  private live(): Database.Database {
    if (!this.db) throw new ArpoError('DISPOSED', `The search index ${this.indexPath} is closed`);
    return this.db;
  }

  private meta(key: string): string | undefined {
    const row = this.live().prepare('SELECT value FROM meta WHERE key = ?').get(key) as { value: string } | undefined;
    return row?.value;
  }

  /** Number of indexed pages. */
  get size(): number {
    return (this.live().prepare('SELECT count(*) AS n FROM docs').get() as { n: number }).n;
  }

  /** Every cached query of a search-cache corpus, in file order. */
  cachedQueries(): string[] {
    return (this.live().prepare('SELECT query FROM queries ORDER BY qid').all() as Array<{ query: string }>).map((r) => r.query);
  }

  /**
   * Exact hit in a search cache: the pages cached for this query (after
   * {@link normalizeQuery}), in their cached order; `[]` for a cached
   * "No search results found."; undefined when the query is not cached.
   */
  exact(query: string): SearchHit[] | undefined {
    const db = this.live();
    const q = db.prepare('SELECT qid, query FROM queries WHERE norm = ?').get(normalizeQuery(query)) as { qid: number; query: string } | undefined;
    if (!q) return undefined;
    const rows = db.prepare('SELECT id, title, text FROM docs WHERE qid = ? ORDER BY page').all(q.qid) as Array<{ id: string; title: string; text: string }>;
    return rows.map((r) => ({ id: r.id, title: r.title, text: r.text, score: 0, sourceQuery: q.query }));
  }

  /** The `limit` best pages by BM25 (title weighted 2x), best first; [] for a query with no words. */
  search(query: string, limit = 10): SearchHit[] {
    if (typeof query !== 'string') throw invalidArgument('a string', 'query', query);
    if (!Number.isInteger(limit) || limit < 1) throw invalidArgument('a positive integer', 'limit', limit);
    const match = toFtsQuery(query);
    if (match === undefined) return [];
    const rows = this.live()
      .prepare(
        `SELECT d.id AS id, d.title AS title, d.text AS text, q.query AS query, bm25(docs_fts, 2.0, 1.0) AS score
         FROM docs_fts JOIN docs d ON d.rowid = docs_fts.rowid LEFT JOIN queries q ON q.qid = d.qid
         WHERE docs_fts MATCH ? ORDER BY score, d.rowid LIMIT ?`,
      )
      .all(match, limit) as Array<{ id: string; title: string; text: string; query: string | null; score: number }>;
    return rows.map((r) => ({ id: r.id, title: r.title, text: r.text, score: r.score, ...(r.query !== null ? { sourceQuery: r.query } : {}) }));
  }

  close(): void {
    if (this.db) {
      this.db.close();
      this.db = undefined;
    }
  }
}

/** Word stems for snippet highlighting: lower case, a few English suffixes off (a light cousin of Porter). */
function stem(word: string): string {
  const w = word.toLowerCase();
  return w.length > 4 ? w.replace(/(?:ing|ed|es|s)$/u, '') : w;
}

/**
 * The `maxChars` window of `text` holding the most query words, cut at word
 * boundaries, with `…` where text was left out. Whitespace is collapsed so a
 * page stays on one "Page i:" line.
 */
export function makeSnippet(text: string, query: string, maxChars: number): string {
  const flat = text.replace(/\s+/g, ' ').trim();
  if (flat.length <= maxChars) return flat;
  const wanted = new Set(searchTerms(query).map(stem));
  const hits: number[] = [];
  for (const m of flat.matchAll(/[\p{L}\p{N}\p{M}]+/gu)) if (wanted.has(stem(m[0]))) hits.push(m.index as number);
  // Two pointers: the window [hits[a], hits[a] + maxChars) with the most hits.
  let bestStart = 0;
  let bestCount = 0;
  for (let a = 0, b = 0; a < hits.length; a++) {
    while (b < hits.length && (hits[b] as number) < (hits[a] as number) + maxChars) b++;
    if (b - a > bestCount) {
      bestCount = b - a;
      bestStart = hits[a] as number;
    }
  }
  // Open the window a little before the first hit, at a word boundary.
  let start = Math.max(0, bestStart - Math.floor(maxChars / 8));
  if (start > 0) {
    const space = flat.indexOf(' ', start);
    start = space >= 0 && space < bestStart ? space + 1 : start;
  }
  const budget = maxChars - (start > 0 ? 1 : 0) - 1;
  let end = Math.min(flat.length, start + budget);
  if (end < flat.length) {
    const space = flat.lastIndexOf(' ', end);
    if (space > start) end = space;
  }
  return `${start > 0 ? '…' : ''}${flat.slice(start, end)}${end < flat.length ? '…' : ''}`;
}

/** Options of {@link SearchTool}. */
export interface SearchToolOptions {
  /** Pages per answer (reference `max_results`: 10). */
  topK?: number;
  /** Characters per page (reference `result_length`: 1000). */
  snippetChars?: number;
  /** Answer a query found in a search cache with its cached pages (default true). */
  exactHits?: boolean;
  /** Tag (default `search`). */
  tag?: string;
  /** Name for metrics and the replay cache (default `search`). */
  name?: string;
}

/** Formats pages as the reference does: one `Page i: …` line each, duplicates dropped. */
export function formatPages(pages: ReadonlyArray<{ title: string; snippet: string }>): string {
  if (pages.length === 0) return NO_RESULTS;
  return pages.map((p, i) => `Page ${i + 1}: ${p.title ? `[${p.title}] ` : ''}${p.snippet}`).join('\n');
}

/** The `<search>` tool over a {@link SearchIndex}. */
export class SearchTool implements Tool {
  readonly name: string;
  readonly tag: string;
  readonly cacheKey: string;
  readonly topK: number;
  readonly snippetChars: number;
  readonly exactHits: boolean;

  constructor(readonly index: SearchIndex, options: SearchToolOptions = {}) {
    this.topK = options.topK ?? 10;
    this.snippetChars = options.snippetChars ?? 1000;
    if (!Number.isInteger(this.topK) || this.topK < 1) throw invalidArgument('a positive integer', 'topK', this.topK);
    if (!Number.isInteger(this.snippetChars) || this.snippetChars < 16) throw invalidArgument('an integer >= 16', 'snippetChars', this.snippetChars);
    this.exactHits = options.exactHits ?? true;
    this.tag = options.tag ?? 'search';
    this.name = options.name ?? 'search';
    this.cacheKey = JSON.stringify([index.corpusHash, this.topK, this.snippetChars, this.exactHits]);
  }

  /** The answer text for a query (synchronous: one SQLite lookup). */
  answer(query: string): string {
    if (this.exactHits && this.index.kind === 'search-cache') {
      const cached = this.index.exact(query);
      if (cached) {
        // Verbatim like the reference's cache hit, within its top-k and length limits.
        return formatPages(cached.slice(0, this.topK).map((h) => ({ title: h.title, snippet: [...h.text].slice(0, this.snippetChars).join('') })));
      }
    }
    // Fetch extra rows: identical snippets are dropped, as the reference does.
    const hits = this.index.search(query, this.topK * 3);
    const seen = new Set<string>();
    const pages: Array<{ title: string; snippet: string }> = [];
    for (const h of hits) {
      const snippet = makeSnippet(h.text, query, this.snippetChars);
      if (snippet.length === 0 || seen.has(snippet)) continue;
      seen.add(snippet);
      pages.push({ title: h.title, snippet });
      if (pages.length >= this.topK) break;
    }
    return formatPages(pages);
  }

  async execute(content: string, ctx: ToolCallContext): Promise<string> {
    if (ctx.signal.aborted) throw new ArpoError('TOOL_FAILED', 'search cancelled');
    return this.answer(content);
  }

  async close(): Promise<void> {
    this.index.close();
  }
}
