// Tests of the replay cache file: round trip, first answer wins, and several
// processes writing at once without corruption or lost writes.
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import Database from 'better-sqlite3';
import { callKey, ToolCallCache } from '../../lib/tools';

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-replay-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

test('round trip, first stored answer wins, keys separate tools and settings', () => {
  const cache = ToolCallCache.open(path.join(dir, 'a', 'nested', 'calls.sqlite'));
  const k = callKey('python', 'cfg1', 'print(1)');
  expect(k).toMatch(/^[0-9a-f]{64}$/);
  // Field boundaries are unambiguous: ("a", "bc") and ("ab", "c") differ.
  expect(callKey('a', 'bc', 'x')).not.toBe(callKey('ab', 'c', 'x'));
  expect(callKey('python', 'cfg2', 'print(1)')).not.toBe(k);
  expect(cache.put('python', k, 'print(1)', { text: '1', ok: true, ms: 12.5, meta: { isolation: 'x' } })).toBe(true);
  expect(cache.put('python', k, 'print(1)', { text: 'other', ok: true, ms: 1 })).toBe(false);
  expect(cache.get('python', k)).toMatchObject({ tool: 'python', input: 'print(1)', text: '1', ok: true, ms: 12.5, meta: { isolation: 'x' } });
  expect(cache.get('search', k)).toBeUndefined();
  const unicode = 'caf\u00e9 \ud83d\ude00 \u0000 nul';
  cache.put('search', callKey('search', '', unicode), unicode, { text: unicode, ok: true, ms: 0 });
  expect(cache.get('search', callKey('search', '', unicode))?.text).toBe(unicode);
  expect([...cache.entries()].map((e) => e.tool).sort()).toEqual(['python', 'search']);
  cache.close();
  expect(() => cache.get('python', k)).toThrow('is closed');
  expect(() => ToolCallCache.open('')).toThrow('Expected a file path for cache file but received "" of type string');
});

test('four processes writing the same file at once: no corruption, no lost writes, one answer per question', async () => {
  const file = path.join(dir, 'shared.sqlite');
  ToolCallCache.open(file).close();
  const writers = 4;
  const calls = 1000;
  // Each child loads ts-node (1-2 s, more on a busy machine), prints `ready`, and waits for a
  // line on stdin: the go goes out once every writer is ready, so their writes overlap.
  const script = path.join(__dirname, 'fixtures', 'replay-writer.js');
  const children = Array.from({ length: writers }, (_, w) => spawn(process.execPath, [script, file, String(w), String(calls)], { stdio: ['pipe', 'pipe', 'pipe'] }));
  let ready = 0;
  const outputs = await Promise.all(
    children.map(
      (child, w) =>
        new Promise<{ stored: number[]; seen: string[]; began: number; ended: number }>((resolve, reject) => {
          let stdout = '';
          let stderr = '';
          let isReady = false;
          const timer = setTimeout(() => child.kill('SIGKILL'), 50000);
          child.stdout.on('data', (d: Buffer) => {
            stdout += d.toString();
            if (!isReady && stdout.startsWith('ready\n')) {
              isReady = true;
              if (++ready === writers) children.forEach((c) => c.stdin.end('go\n'));
            }
          });
          child.stderr.on('data', (d: Buffer) => void (stderr += d.toString()));
          child.on('close', (code, signal) => {
            clearTimeout(timer);
            if (code !== 0 || !isReady) {
              children.forEach((c) => c.kill('SIGKILL'));
              reject(new Error(`writer ${w} failed (exit ${code}, signal ${signal}): ${stderr}`));
            }
            else resolve(JSON.parse(stdout.slice('ready\n'.length)));
          });
        }),
    ),
  );
  // The write loops really overlapped in time.
  expect(Math.max(...outputs.map((o) => o.began))).toBeLessThan(Math.min(...outputs.map((o) => o.ended)));
  // Every shared question was stored by exactly one writer.
  const storedBy = new Map<number, number>();
  outputs.forEach((o) => o.stored.forEach((i) => storedBy.set(i, (storedBy.get(i) ?? 0) + 1)));
  expect(storedBy.size).toBe(calls);
  expect([...storedBy.values()].every((c) => c === 1)).toBe(true);
  // All writers read the same (winning) answer for each shared question.
  for (let i = 0; i < calls; i++) {
    const answers = new Set(outputs.map((o) => o.seen[i]));
    expect(answers.size).toBe(1);
    const winner = outputs.findIndex((o) => o.stored.includes(i));
    expect(outputs[0]?.seen[i]).toBe(`writer ${winner} answer ${i}`);
  }
  // The file is intact and holds every write: shared + each writer's own.
  const db = new Database(file, { readonly: true });
  expect(db.pragma('integrity_check', { simple: true })).toBe('ok');
  db.close();
  const cache = ToolCallCache.open(file);
  expect(cache.count('search')).toBe(calls + writers * calls);
  for (let w = 0; w < writers; w++) {
    const q = `writer ${w} question ${calls - 1}`;
    expect(cache.get('search', callKey('search', '', q))).toMatchObject({ text: `own ${w} ${calls - 1}`, meta: { writer: w } });
  }
  cache.close();
}, 60000);
