// Tests of ToolRunner: pool bound, timeouts, retries, truncation, metrics,
// cancellation, replay cache and de-duplication, with small scripted tools.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { ToolCallCache, ToolRunner, truncateOutput, type Tool, type ToolCallContext } from '../../lib/tools';

const delay = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => (clearTimeout(t), reject(new Error('aborted'))), { once: true });
  });

/** A tool whose behaviour per call is scripted; records concurrency and calls. */
class ScriptedTool implements Tool {
  active = 0;
  maxActive = 0;
  calls: string[] = [];
  constructor(
    readonly tag: string,
    private readonly behave: (content: string, n: number, ctx: ToolCallContext) => Promise<string>,
    readonly name = tag,
  ) {}
  async execute(content: string, ctx: ToolCallContext): Promise<string> {
    this.calls.push(content);
    this.active++;
    this.maxActive = Math.max(this.maxActive, this.active);
    try {
      return await this.behave(content, this.calls.length, ctx);
    } finally {
      this.active--;
    }
  }
}

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-runner-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

test('concurrency never exceeds the pool size and every call completes', async () => {
  const tool = new ScriptedTool('echo', async (c, _n, ctx) => {
    await delay(20, ctx.signal);
    return `got ${c}`;
  });
  const runner = new ToolRunner({ concurrency: 3 }).register(tool);
  const results = await Promise.all(Array.from({ length: 12 }, (_, i) => runner.run('echo', String(i))));
  expect(tool.maxActive).toBe(3);
  expect(results.map((r) => r.text)).toEqual(Array.from({ length: 12 }, (_, i) => `got ${i}`));
  expect(results.every((r) => r.ok && !r.cached && r.attempts === 1)).toBe(true);
  const m = runner.metrics().echo;
  expect(m).toMatchObject({ calls: 12, ok: 12, failures: 0, timeouts: 0 });
  // Time is measured from leaving the queue: each call ran ~20 ms.
  expect((m?.totalMs ?? 0) / 12).toBeGreaterThanOrEqual(15);
});

test('each tool has its own limit and queue: a quick tool never waits behind a slow one', async () => {
  const slow = new ScriptedTool('slow', async (_c, _n, ctx) => {
    await delay(200, ctx.signal);
    return 'slow done';
  });
  const quick = new ScriptedTool('quick', async () => 'quick done');
  const runner = new ToolRunner({ concurrency: 2 }).register(slow).register(quick);
  const t0 = performance.now();
  const slowCalls = Array.from({ length: 6 }, (_, i) => runner.run('slow', String(i)));
  // Four slow calls wait for the two running ones; the quick call runs at once.
  expect(runner.queued).toBe(4);
  const q = await runner.run('quick', 'x');
  expect(q).toMatchObject({ text: 'quick done', ok: true });
  expect(performance.now() - t0).toBeLessThan(150);
  expect(slow.active).toBe(2);
  const done = await Promise.all(slowCalls);
  expect(done.every((r) => r.text === 'slow done')).toBe(true);
  expect(slow.maxActive).toBe(2);
  expect(runner.queued).toBe(0);
});

test('a timed-out call returns an explanatory text and aborts the tool', async () => {
  let sawAbort = false;
  const tool = new ScriptedTool('slow', async (_c, _n, ctx) => {
    ctx.signal.addEventListener('abort', () => (sawAbort = true));
    await delay(5000, ctx.signal);
    return 'late';
  });
  const runner = new ToolRunner({ timeoutMs: 50, retries: 3 }).register(tool);
  const t0 = performance.now();
  const r = await runner.run('slow', 'x');
  expect(performance.now() - t0).toBeLessThan(1000);
  expect(r).toMatchObject({ ok: false, timedOut: true, attempts: 1, text: 'Error: tool <slow> timed out after 0.1 s.' });
  expect(sawAbort).toBe(true);
  expect(runner.metrics().slow).toMatchObject({ calls: 1, timeouts: 1, failures: 0 });
});

test('a tool that ignores its signal still times out', async () => {
  const tool = new ScriptedTool('stubborn', () => new Promise((r) => setTimeout(() => r('late'), 300)));
  const r = await new ToolRunner({ timeoutMs: 30 }).register(tool).run('stubborn', '');
  expect(r.timedOut).toBe(true);
});

test('thrown errors are retried, then reported', async () => {
  const flaky = new ScriptedTool('flaky', async (_c, n) => {
    if (n < 3) throw new Error(`boom ${n}`);
    return 'fine';
  });
  const runner = new ToolRunner({ retries: 2, retryDelayMs: 1 }).register(flaky);
  expect(await runner.run('flaky', 'a')).toMatchObject({ ok: true, text: 'fine', attempts: 3 });
  const broken = new ScriptedTool('broken', async () => {
    throw new Error('service down');
  });
  runner.register(broken);
  const r = await runner.run('broken', 'b');
  expect(r).toMatchObject({ ok: false, timedOut: false, attempts: 3, error: 'service down', text: 'Error: tool <broken> failed: service down' });
  expect(runner.metrics()).toMatchObject({ flaky: { ok: 1, retries: 2 }, broken: { failures: 1, retries: 2 } });
});

test('ok:false answers are failures but not retried', async () => {
  const tool: Tool = { name: 'judge', tag: 'judge', execute: async () => ({ text: 'Traceback: boom', ok: false }) };
  const r = await new ToolRunner({ retries: 5 }).register(tool).run('judge', '');
  expect(r).toMatchObject({ ok: false, attempts: 1, text: 'Traceback: boom' });
});

test('output is truncated at the limit without splitting a surrogate pair', async () => {
  expect(truncateOutput('abcdef', 4)).toEqual({ text: 'abcd\n[output truncated: 2 more characters]', truncated: true });
  expect(truncateOutput('ab😀cd', 3)).toEqual({ text: 'ab\n[output truncated: 4 more characters]', truncated: true });
  expect(truncateOutput('abc', 3)).toEqual({ text: 'abc', truncated: false });
  const tool = new ScriptedTool('big', async () => 'y'.repeat(100000));
  const r = await new ToolRunner({ maxOutputChars: 1000 }).register(tool).run('big', '');
  expect(r.truncated).toBe(true);
  expect(r.text.startsWith('y'.repeat(1000) + '\n[output truncated: 99000')).toBe(true);
});

test('unknown tags, overlong input and cancellation give texts, not exceptions', async () => {
  const tool = new ScriptedTool('echo', async (c, _n, ctx) => {
    await delay(200, ctx.signal);
    return c;
  });
  const runner = new ToolRunner({ concurrency: 1, maxInputChars: 10 }).register(tool);
  expect(await runner.run('nope', 'x')).toMatchObject({ ok: false, text: 'Error: no tool is mounted for <nope>; mounted: <echo>.' });
  expect(await runner.run('echo', 'x'.repeat(11))).toMatchObject({ ok: false, text: 'Error: the <echo> call is 11 characters long; the limit is 10.' });
  expect(tool.calls).toEqual([]);
  const ac = new AbortController();
  const running = runner.run('echo', 'a', { signal: ac.signal });
  const queued = runner.run('echo', 'b', { signal: ac.signal });
  await delay(20);
  expect(runner.queued).toBe(1);
  ac.abort();
  expect(await running).toMatchObject({ ok: false, error: 'cancelled' });
  expect(await queued).toMatchObject({ ok: false, error: 'cancelled', text: 'Error: the <echo> call was cancelled.' });
  expect(tool.calls).toEqual(['a']);
  expect(() => runner.register(new ScriptedTool('echo', async () => ''))).toThrow('Tag "echo" already holds tool "echo"');
  expect(() => new ToolRunner({ concurrency: 0 })).toThrow('Expected an integer >= 1 for concurrency but received 0 of type number');
  expect(() => new ToolRunner({ replay: 'replay' })).toThrow('Expected a cache for replay mode replay');
});

test('replay cache: identical questions are asked once, replayed exactly, concurrent duplicates share a call', async () => {
  const file = path.join(dir, 'calls.sqlite');
  const cache = ToolCallCache.open(file);
  const paid = new ScriptedTool('paid', async (c, n, ctx) => {
    await delay(30, ctx.signal);
    return `answer ${n} to ${c}`;
  });
  const runner = new ToolRunner({ cache }).register(paid);
  const first = await Promise.all([runner.run('paid', 'q1'), runner.run('paid', 'q1'), runner.run('paid', 'q2')]);
  expect(paid.calls).toEqual(['q1', 'q2']);
  expect(first[0]?.text).toBe(first[1]?.text);
  expect(first.map((r) => r.cached)).toEqual([false, true, false]);
  const again = await runner.run('paid', 'q1');
  expect(again).toMatchObject({ cached: true, attempts: 0, text: first[0]?.text });
  expect(paid.calls.length).toBe(2);
  cache.close();

  // A later run in replay mode gets the same texts without any tool call.
  const cache2 = ToolCallCache.open(file);
  const offline = new ScriptedTool('paid', async () => {
    throw new Error('must not be called');
  });
  const replay = new ToolRunner({ cache: cache2, replay: 'replay' }).register(offline);
  expect((await replay.run('paid', 'q2')).text).toBe(first[2]?.text);
  expect(await replay.run('paid', 'q3')).toMatchObject({ ok: false, text: 'Error: no recorded result for this <paid> call (replay mode).' });
  expect(offline.calls).toEqual([]);
  expect(cache2.count('paid')).toBe(2);
  cache2.close();
});

test('failures are not cached; non-cacheable tools bypass the cache', async () => {
  const cache = ToolCallCache.open(path.join(dir, 'fail.sqlite'));
  const flaky = new ScriptedTool('f', async (_c, n) => {
    if (n === 1) throw new Error('first fails');
    return 'second works';
  });
  const clock: Tool & { n: number } = { name: 'clock', tag: 'clock', cacheable: false, n: 0, execute: async () => `tick ${++clock.n}` };
  const runner = new ToolRunner({ cache, retries: 0 }).register(flaky).register(clock);
  expect((await runner.run('f', 'x')).ok).toBe(false);
  expect(await runner.run('f', 'x')).toMatchObject({ ok: true, cached: false, text: 'second works' });
  expect((await runner.run('clock', '')).text).toBe('tick 1');
  expect((await runner.run('clock', '')).text).toBe('tick 2');
  expect(cache.count()).toBe(1);
  expect(runner.metricsFlat()).toMatchObject({ 'tools/f/calls': 2, 'tools/f/failures': 1, 'tools/f/success_rate': 0.5, 'tools/clock/cache_hits': 0 });
  cache.close();
});
