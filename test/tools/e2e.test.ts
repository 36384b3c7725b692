// End to end: a model's multi-turn output handled as the rollout engine will:
// parse the call, run it with createArpoTools' runner, append the formatted result.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { canCallTool, createArpoTools, DEFAULT_PROTOCOL, defaultSearchCachePath, formatResult, parseToolCall, type ToolRunner } from '../../lib/tools';

let dir: string;
let runner: ToolRunner;
const cache = JSON.parse(fs.readFileSync(defaultSearchCachePath(), 'utf8')) as Record<string, string>;

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-e2e-'));
  runner = await createArpoTools({ search: { indexPath: path.join(dir, 'index.sqlite') }, python: { timeoutMs: 5000 }, cacheFile: path.join(dir, 'calls.sqlite') });
});
afterAll(async () => {
  await runner?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

/** The rollout loop in miniature: model turns come from a script instead of a policy. */
async function rollout(turns: string[]): Promise<{ text: string; calls: number; end: string }> {
  let text = '';
  let calls = 0;
  for (const turn of turns) {
    const from = text.length;
    text += turn;
    const call = parseToolCall(text, DEFAULT_PROTOCOL, { from });
    if (call.kind !== 'call') return { text, calls, end: call.reason };
    if (!canCallTool(calls, DEFAULT_PROTOCOL)) return { text, calls, end: 'call limit' };
    calls++;
    const r = await runner.run(call.tag, call.content);
    text += formatResult(r.text, DEFAULT_PROTOCOL);
  }
  return { text, calls, end: 'turns exhausted' };
}

test('search then python then answer', async () => {
  const q = 'search query: Who directed the film Love Finds Andy Hardy?';
  const out = await rollout([
    `<think> Find the director. </think> <search> ${q} </search>`,
    ' <think> Now compute. </think> <python>import math\nmath.factorial(5)</python>',
    ' <think> Done. </think> <answer> \\boxed{120} </answer>',
  ]);
  expect(out.end).toBe('answer');
  expect(out.calls).toBe(2);
  expect(out.text).toContain(` <result>\n${cache[q]}\n</result>`);
  expect(out.text).toContain('</python> <result>\n120\n</result>');
  const m = runner.metrics();
  expect(m.search).toMatchObject({ calls: 1, ok: 1 });
  expect(m.python).toMatchObject({ calls: 1, ok: 1 });
});

test('the call limit ends the path', async () => {
  const out = await rollout(Array.from({ length: 7 }, (_, i) => ` <python>${i}</python>`));
  expect(out).toMatchObject({ calls: 5, end: 'call limit' });
});

test('repeated calls come from the replay cache', async () => {
  const first = await runner.run('python', 'sum(range(10))');
  const again = await runner.run('python', 'sum(range(10))');
  expect(first).toMatchObject({ ok: true, text: '45', cached: false });
  expect(again).toMatchObject({ ok: true, text: '45', cached: true });
});
