// Load: many python and search calls at concurrency 16, a mix of normal,
// slow, crashing, output-flooding and process-leaving code. Every call gets
// the right kind of answer, and once the tools are closed nothing is left:
// no sandbox processes, no extra file descriptors, no temp directories. p50 /
// p99 latency per kind is printed. ARPO_LOAD_CALLS sets the number of calls
// (default 400 in the suite; the long setting is 2000).
// The python tool keeps a warm pool of 16 sandboxes (one per concurrent call),
// so "nothing left once closed" covers the pool too.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { detectIsolation, PythonTool, SearchIndex, SearchTool, ToolRunner, type ToolRunResult } from '../../lib/tools';
import { quantile } from '../../bench/summary';
import { alive, cmdline, pids, uidOf } from './proc';

const CALLS = Number(process.env.ARPO_LOAD_CALLS ?? 400);
const UID = 63123;
const POOL = 16;
const MODE = detectIsolation('/usr/bin/python3', UID, UID, 'full', POOL).missing.length === 0 ? 'full' : 'basic';

/** Live (non-zombie) processes of the sandbox uids, or whose command line has `marker`. */
function leftovers(marker: string): string[] {
  return pids().flatMap((p) => {
    const uid = uidOf(p);
    const cmd = cmdline(p);
    if (uid === null || cmd === null || !alive(p)) return [];
    return (uid >= UID && uid < UID + POOL) || cmd.includes(marker) ? [`${p}: uid ${uid} ${cmd.slice(0, 80)}`] : [];
  });
}

const openFds = (): number => fs.readdirSync('/proc/self/fd').length;
const tempDirs = (): string[] => fs.readdirSync(os.tmpdir()).filter((f) => f.startsWith('arpo-python-'));

test(`${CALLS} python and search calls at concurrency 16 leave no process, fd or temp dir behind`, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-load-'));
  const corpus = path.join(dir, 'corpus.jsonl');
  fs.writeFileSync(corpus, Array.from({ length: 200 }, (_, i) => JSON.stringify({ id: `d${i}`, title: `Page ${i}`, text: `Entity ${i} lives in city ${i % 17} and was founded in ${1800 + i}.` })).join('\n'));
  const marker = `arpo-load-${process.pid}`;
  const fdsBefore = openFds();
  const tempBefore = tempDirs();
  const index = await SearchIndex.openJsonl(corpus, { indexPath: path.join(dir, 'index.sqlite') });
  const runner = new ToolRunner({ concurrency: 16, timeoutMs: 20000, maxOutputChars: 2000 })
    .register(new SearchTool(index, { topK: 3, snippetChars: 100 }))
    .register(new PythonTool({ uid: UID, gid: UID, uidPoolSize: POOL, isolation: MODE, timeoutMs: 4000, maxOutputBytes: 64 * 1024, warm: 16 }));
  type Kind = 'normal' | 'slow' | 'crash' | 'flood' | 'leave' | 'search';
  const kinds: Kind[] = ['normal', 'normal', 'normal', 'slow', 'crash', 'flood', 'leave', 'search', 'search', 'search'];
  const calls: Array<{ kind: Kind; i: number; p: Promise<ToolRunResult> }> = [];
  const t0 = performance.now();
  for (let i = 0; i < CALLS; i++) {
    const kind = kinds[i % kinds.length] as Kind;
    const code: Record<Exclude<Kind, 'search'>, string> = {
      normal: `# ${i}\nsum(range(${i + 10}))`,
      slow: `# ${i}\nimport time\ntime.sleep(0.3)\nprint("slept")`,
      crash: i % 2 === 0 ? `# ${i}\nraise ValueError("boom ${i}")` : `# ${i}\nimport os\nos.abort()`,
      flood: `# ${i}\nimport sys\nfor _ in range(200):\n    sys.stdout.write("x" * 10000)`,
      leave: `# ${i}\nimport subprocess\nsubprocess.Popen(["/bin/sh", "-c", "sleep 30; : ${marker}"])\nprint("left one")`,
    };
    const p = kind === 'search' ? runner.run('search', `city ${i % 17} founded ${1800 + (i % 200)}`) : runner.run('python', code[kind]);
    calls.push({ kind, i, p });
  }
  const results = await Promise.all(calls.map(async (c) => ({ ...c, r: await c.p })));
  const wall = performance.now() - t0;
  for (const { kind, i, r } of results) {
    if (kind === 'normal') expect([i, r.ok, r.text]).toEqual([i, true, String(((i + 10) * (i + 9)) / 2)]);
    else if (kind === 'slow') expect([i, r.ok, r.text]).toEqual([i, true, 'slept']);
    else if (kind === 'crash') expect([i, r.ok]).toEqual([i, false]);
    else if (kind === 'flood') expect([i, r.truncated, r.text.startsWith('xxxx')]).toEqual([i, true, true]);
    else if (kind === 'leave') expect([i, r.ok, r.text]).toEqual([i, true, 'left one']);
    else expect([i, r.ok, r.text.includes('Page')]).toEqual([i, true, true]);
  }
  await runner.close();
  index.close();
  // Settle: killed process trees are reaped asynchronously.
  let left: string[] = [];
  for (let t = 0; t < 50; t++) {
    left = leftovers(marker);
    if (left.length === 0 && openFds() <= fdsBefore && tempDirs().length <= tempBefore.length) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  const lines = (['normal', 'slow', 'crash', 'flood', 'leave', 'search'] as Kind[]).map((k) => {
    const ms = results.filter((x) => x.kind === k).map((x) => x.r.ms);
    return `${k}: ${ms.length} calls, p50 ${quantile(ms, 0.5).toFixed(0)} ms, p99 ${quantile(ms, 0.99).toFixed(0)} ms`;
  });
  process.stdout.write(`load (${MODE} isolation, ${CALLS} calls in ${(wall / 1000).toFixed(1)} s):\n  ${lines.join('\n  ')}\n`);
  expect(left).toEqual([]);
  expect(openFds()).toBeLessThanOrEqual(fdsBefore);
  expect(tempDirs().filter((d) => !tempBefore.includes(d))).toEqual([]);
  fs.rmSync(dir, { recursive: true, force: true });
}, 600000);
