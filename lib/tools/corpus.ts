// Corpus readers for the search index: JSONL of {id, title, text}, and the ARPO
// reference's search cache ({ query: "Page 1: …\nPage 2: …" }) split into pages.
import * as fs from 'fs';
import * as readline from 'readline';
import { ArpoError, describeType, describeValue } from '../errors';

export type CorpusKind = 'jsonl' | 'search-cache';

/** One indexable page; search-cache pages also carry their query and rank. */
export interface CorpusPage {
  readonly id: string;
  readonly title: string;
  /** Undefined only for a cached query whose answer had no pages. */
  readonly text?: string;
  readonly query?: string;
  /** 1-based rank in the cached answer. */
  readonly page?: number;
}

function badData(file: string, where: string, what: string, name: string, value: unknown): ArpoError {
  return new ArpoError(
    'BAD_DATA',
    `${file}, ${where}: Expected ${what} for ${name} but received ${describeValue(value)} of type ${describeType(value)}`,
  );
}

/**
 * Splits a cached answer into its pages. The reference writes
 * `"\n".join(f"Page {i}: {snippet}")` (BingSearchTool._format_results), so a
 * line that starts with the next expected `Page i: ` opens a page and any other
 * line continues the current one; "No search results found." has no pages.
 */
export function splitCachedPages(answer: string): string[] {
  const pages: string[] = [];
  for (const line of answer.split('\n')) {
    const prefix = `Page ${pages.length + 1}: `;
    if (line.startsWith(prefix)) pages.push(line.slice(prefix.length));
    else if (pages.length > 0) pages[pages.length - 1] += `\n${line}`;
  }
  return pages;
}

async function* readSearchCache(file: string): AsyncGenerator<CorpusPage> {
  let data: unknown;
  try {
    data = JSON.parse(await fs.promises.readFile(file, 'utf8'));
  } catch (e) {
    throw new ArpoError('BAD_DATA', `${file} is not a JSON search cache: ${(e as Error).message}`, { cause: e });
  }
  if (data === null || typeof data !== 'object' || Array.isArray(data)) {
    throw badData(file, 'top level', 'an object mapping queries to cached answers', 'search cache', data);
  }
  let q = 0;
  for (const [query, answer] of Object.entries(data as Record<string, unknown>)) {
    if (typeof answer !== 'string') throw badData(file, `query ${JSON.stringify(query.slice(0, 60))}`, 'a string', 'cached answer', answer);
    const pages = splitCachedPages(answer);
    if (pages.length === 0) yield { id: `${q}`, title: '', query };
    for (let i = 0; i < pages.length; i++) yield { id: `${q}:${i + 1}`, title: '', text: pages[i] as string, query, page: i + 1 };
    q += 1;
  }
}

async function* readJsonl(file: string): AsyncGenerator<CorpusPage> {
  const lines = readline.createInterface({ input: fs.createReadStream(file, { encoding: 'utf8' }), crlfDelay: Infinity });
  let n = 0;
  for await (const line of lines) {
    n += 1;
    if (line.trim() === '') continue;
    let row: unknown;
    try {
      row = JSON.parse(line);
    } catch (e) {
      throw new ArpoError('BAD_DATA', `${file}, line ${n}: not JSON (${(e as Error).message})`, { cause: e });
    }
    if (row === null || typeof row !== 'object' || Array.isArray(row)) throw badData(file, `line ${n}`, 'an object {id, title, text}', 'line', row);
    const r = row as Record<string, unknown>;
    const id = r.id ?? String(n);
    if (typeof id !== 'string' && typeof id !== 'number') throw badData(file, `line ${n}`, 'a string or number', 'id', id);
    const title = r.title ?? '';
    if (typeof title !== 'string') throw badData(file, `line ${n}`, 'a string', 'title', title);
    if (typeof r.text !== 'string') throw badData(file, `line ${n}`, 'a string', 'text', r.text);
    yield { id: String(id), title, text: r.text };
  }
}

/** Pages of a corpus file, in file order. */
export function readCorpus(file: string, kind: CorpusKind): AsyncGenerator<CorpusPage> {
  return kind === 'jsonl' ? readJsonl(file) : readSearchCache(file);
}
