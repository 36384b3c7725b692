// Replay cache of tool calls: every (tool, content) -> output is stored in one
// SQLite file (WAL), so a run with tools can be replayed exactly and a paid tool
// is never asked the same question twice, even by several processes at once.
import { createHash } from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import Database from 'better-sqlite3';
import { ArpoError, describeType, describeValue, invalidArgument } from '../errors';

/**
 * `off`: no cache. `record`: always call the tool, store new answers.
 * `replay`: answer only from the cache; a miss is a failed call (reproducible
 * runs, no tool reachable). `auto`: answer from the cache, else call and store.
 */
export type ReplayMode = 'off' | 'record' | 'replay' | 'auto';
export const REPLAY_MODES: readonly ReplayMode[] = ['off', 'record', 'replay', 'auto'];

/** One stored call. */
export interface CachedCall {
  readonly tool: string;
  readonly input: string;
  readonly text: string;
  readonly ok: boolean;
  readonly meta?: Readonly<Record<string, unknown>>;
  /** Wall time of the original call. */
  readonly ms: number;
  /** ISO time it was stored. */
  readonly createdAt: string;
}

/** Key of a call: SHA-256 over the tool's name, its cache key and the exact content. */
export function callKey(toolName: string, toolCacheKey: string, content: string): string {
  // JSON of an array keeps the three fields unambiguous (no separator injection).
  return createHash('sha256').update(JSON.stringify([toolName, toolCacheKey, content])).digest('hex');
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS tool_calls (
  tool TEXT NOT NULL,
  key TEXT NOT NULL,
  input TEXT NOT NULL,
  text TEXT NOT NULL,
  ok INTEGER NOT NULL,
  meta TEXT,
  ms REAL NOT NULL,
  created_at TEXT NOT NULL,
  PRIMARY KEY (tool, key)
) WITHOUT ROWID;
`;

interface Row {
  tool: string;
  input: string;
  text: string;
  ok: number;
  meta: string | null;
  ms: number;
  created_at: string;
}

/**
 * A stored row as the cached call it records. SQLite keeps whatever a column
 * was given (a foreign or damaged file may hold numbers, blobs or broken
 * JSON), so every field is checked; a bad one is an error naming the file,
 * the row and the field.
 */
function rowToCall(file: string, row: Row): CachedCall {
  const where = `${file}: tool_calls row (tool ${describeValue(row.tool)})`;
  const bad = (field: string, what: string, value: unknown): ArpoError =>
    new ArpoError('BAD_DATA', `${where}: expected ${what} for ${field} but received ${describeValue(value)} of type ${describeType(value)}`);
  for (const f of ['tool', 'input', 'text', 'created_at'] as const) if (typeof row[f] !== 'string') throw bad(f, 'a string', row[f]);
  if (typeof row.ok !== 'number' && typeof row.ok !== 'bigint') throw bad('ok', 'an integer', row.ok);
  if (typeof row.ms !== 'number' || !Number.isFinite(row.ms) || row.ms < 0) throw bad('ms', 'a finite number >= 0', row.ms);
  let meta: Record<string, unknown> | undefined;
  if (row.meta !== null) {
    if (typeof row.meta !== 'string') throw bad('meta', 'JSON text or null', row.meta);
    try {
      meta = JSON.parse(row.meta) as Record<string, unknown>;
    } catch (e) {
      throw bad('meta', `JSON text (${(e as Error).message})`, row.meta);
    }
    if (meta === null || typeof meta !== 'object' || Array.isArray(meta)) throw bad('meta', 'a JSON object', meta);
  }
  return {
    tool: row.tool,
    input: row.input,
    text: row.text,
    ok: Number(row.ok) !== 0,
    ms: row.ms,
    createdAt: row.created_at,
    ...(meta !== undefined ? { meta } : {}),
  };
}

/**
 * The cache file. Writers in several processes are safe: SQLite's WAL mode
 * serialises them with its own locks (busy_timeout waits instead of failing),
 * and `INSERT OR IGNORE` keeps the first stored answer, so a replayed run sees
 * one answer per question no matter who wrote it.
 */
export class ToolCallCache {
  readonly path: string;
  private db: Database.Database | undefined;
  private readonly getStmt: Database.Statement<[string, string], Row>;
  private readonly putStmt: Database.Statement<[string, string, string, string, number, string | null, number, string]>;

  private constructor(file: string, db: Database.Database) {
    this.path = file;
    this.db = db;
    this.getStmt = db.prepare('SELECT tool, input, text, ok, meta, ms, created_at FROM tool_calls WHERE tool = ? AND key = ?');
    this.putStmt = db.prepare(
      'INSERT OR IGNORE INTO tool_calls (tool, key, input, text, ok, meta, ms, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
    );
  }

  /** Opens (creating if needed) the cache at `file`. */
  static open(file: string): ToolCallCache {
    if (typeof file !== 'string' || file.length === 0) throw invalidArgument('a file path', 'cache file', file);
    fs.mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
    let db: Database.Database;
    try {
      db = new Database(file, { timeout: 30000 });
      db.pragma('journal_mode = WAL');
      db.pragma('synchronous = NORMAL');
      db.exec(SCHEMA);
    } catch (e) {
      throw new ArpoError('BAD_DATA', `Cannot open the tool-call cache ${file}: ${(e as Error).message}`, { cause: e });
    }
    return new ToolCallCache(file, db);
  }

  private live(): Database.Database {
    if (!this.db) throw new ArpoError('DISPOSED', `The tool-call cache ${this.path} is closed`);
    return this.db;
  }

  get(tool: string, key: string): CachedCall | undefined {
    this.live();
    const row = this.getStmt.get(tool, key);
    if (!row) return undefined;
    return rowToCall(this.path, row);
  }

  /** Stores a call unless one with the same key exists; returns whether this call was stored. */
  put(tool: string, key: string, input: string, result: { text: string; ok: boolean; meta?: Readonly<Record<string, unknown>>; ms: number }): boolean {
    this.live();
    const meta = result.meta === undefined ? null : JSON.stringify(result.meta);
    const info = this.putStmt.run(tool, key, input, result.text, result.ok ? 1 : 0, meta, result.ms, new Date().toISOString());
    return info.changes === 1;
  }

  /** Number of stored calls (of one tool, or all). */
  count(tool?: string): number {
    const db = this.live();
    const row = (tool === undefined
      ? db.prepare('SELECT count(*) AS n FROM tool_calls').get()
      : db.prepare('SELECT count(*) AS n FROM tool_calls WHERE tool = ?').get(tool)) as { n: number };
    return row.n;
  }

  /** Every stored call, oldest first (for inspection and export). */
  *entries(): IterableIterator<CachedCall> {
    const db = this.live();
    for (const row of db.prepare('SELECT tool, input, text, ok, meta, ms, created_at FROM tool_calls ORDER BY created_at').iterate() as IterableIterator<Row>) {
      yield rowToCall(this.path, row);
    }
  }

  close(): void {
    if (this.db) {
      this.db.close();
      this.db = undefined;
    }
  }
}
