// The HTML report: built by the CLI from metrics.jsonl files, checked in headless Chromium.
import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { formatStepLine, MetricsLog, Progress, readMetrics } from '../../lib/train/metrics';
import { REPORT_CHARTS, baselineValues, chartPoints, heldOutSection, readRun, stagesSection } from '../../lib/train/report';
import { compareFamilies, familyStats } from '../../lib/train/evaluate';
import { writeTreeViews, type TreeViewsFile } from '../../lib/train/tree-view';

const root = path.resolve(__dirname, '..', '..');
const chromium = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => fs.existsSync(p));

function fakeRun(dir: string, seed: number, baseline?: number): void {
  const log = new MetricsLog(dir);
  if (baseline !== undefined) log.append({ step: 0, phase: 'valid', time: 0, metrics: { 'acc/mean': baseline } });
  for (let step = 1; step <= 6; step++) {
    log.append({
      step,
      phase: 'train',
      time: step,
      metrics: {
        'reward/mean': 0.1 * step + seed,
        'acc/mean': 0.05 * step,
        'response/length_mean': 100 + step,
        'tools/calls/search': 1 + step / 10,
        'tools/calls/python': 0.5,
        'tools/calls_per_traj': 1.5 + step / 10,
        'entropy/before_tool': 0.2,
        'entropy/after_tool': 0.35,
        'rollout/branch_events': step,
      },
    });
    if (step % 3 === 0) log.append({ step, phase: 'valid', time: step, metrics: { 'acc/mean': 0.1 * step, 'reward/mean': 0.2 * step } });
  }
}

/** One prompt's tree: a shared search prefix, a branch after the tool result, two leaves (rewards 1 and -1). */
function treeFile(step: number): TreeViewsFile {
  const node = (id: number, parent: number, kind: 'prompt' | 'generated' | 'tool_result', start: number, length: number, value: number, leavesBelow: number, extra = {}) => ({
    id, parent, kind, start, length, text: `node ${id}`, path: 0, value, advantage: value / leavesBelow, leavesBelow, ...extra,
  });
  const leaf = (index: number, reward: number) => ({ leaf: { index, reward, accuracy: reward > 0 ? 1 : 0, advantage: reward * 0.7, finishReason: 'answer', toolCalls: 1 } });
  return {
    version: 1,
    step,
    attribution: 'soft',
    trees: [
      {
        prompt: 0,
        question: 'Who wrote <Faust>?',
        groundTruth: 'Goethe',
        promptLength: 12,
        nodes: [
          node(0, -1, 'prompt', -12, 12, 0, 2),
          node(1, 0, 'generated', 0, 6, 0, 2, { meanNormEntropy: 0.2 }),
          node(2, 1, 'tool_result', 6, 4, 0, 2, { tool: { tag: 'search', ok: true, query: 'Faust author' }, decision: { toolCall: 1, entropy: 0.5, initialEntropy: 0.3, deltaEntropy: 0.2, probability: 0.6, fired: true, branches: 1 } }),
          node(3, 2, 'generated', 10, 3, 0.7, 1, leaf(0, 1)),
          { ...node(4, 2, 'generated', 10, 5, -0.7, 1, leaf(1, -1)), path: 1, origin: 'branch' },
        ],
      },
    ],
  };
}

describe('report', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-report-'));
  afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

  test('metrics log survives a torn last line and chart points follow the records', () => {
    const dir = path.join(tmp, 'torn');
    fakeRun(dir, 0);
    fs.appendFileSync(path.join(dir, 'metrics.jsonl'), '{"step": 7, "phase": "tr');
    const recs = readMetrics(path.join(dir, 'metrics.jsonl'));
    expect(recs).toHaveLength(8);
    const run = readRun(dir);
    const tools = chartPoints(REPORT_CHARTS.find((c) => c.title.startsWith('Tool calls'))!, run);
    expect(new Set(tools.map((p) => p.series))).toEqual(new Set(['search', 'python']));
    const acc = chartPoints(REPORT_CHARTS.find((c) => c.title === 'Accuracy')!, run);
    expect(acc.filter((p) => p.series === 'valid').map((p) => p.value)).toEqual([0.1 * 3, 0.1 * 6]);
  });

  test('arpo report renders two runs side by side, and Chromium shows every chart', () => {
    const a = path.join(tmp, 'arpo-run');
    const b = path.join(tmp, 'grpo-run');
    fakeRun(a, 0, 0.15);
    fakeRun(b, 1);
    writeTreeViews(a, treeFile(6));
    const out = path.join(tmp, 'cmp.html');
    const printed = execFileSync(process.execPath, [path.join(root, 'bin', 'arpo.js'), 'report', a, b, '--out', out], { encoding: 'utf8' });
    expect(printed.trim()).toBe(out);
    const html = fs.readFileSync(out, 'utf8');
    expect(html).not.toMatch(/<script/i);
    expect(html).not.toMatch(/https?:\/\/(?!www\.w3\.org)/);
    // One SVG per chart, one per rollout tree (run a wrote one, run b none).
    expect((html.match(/<svg/g) ?? []).length).toBe(REPORT_CHARTS.length + 1);
    expect(html).toContain('<section id="trees">');
    expect(html).toContain('arpo-run: step 6, 1 prompt (soft attribution)');
    expect(html).toContain('Who wrote &lt;Faust&gt;?');
    expect(html).toContain('before RL (step 0 validation) 0.150'); // the SFT baseline on the accuracy chart
    expect(html).toContain('<th>arpo-run</th><th>grpo-run</th>');
    if (!chromium) throw new Error('Chromium is not installed: run scripts/install-deps.sh (package chromium)');
    const dom = execFileSync(
      chromium,
      ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync', `--user-data-dir=${path.join(tmp, 'chrome')}`, '--dump-dom', `file://${out}`],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 60000 },
    );
    expect((dom.match(/<svg/g) ?? []).length).toBe(REPORT_CHARTS.length + 1);
    expect(dom).toContain('Entropy around tool calls');
    expect(dom).toContain('grpo-run');
    expect(dom).toContain('class="branch-point"');
    // Rendered to pixels: a PNG of the whole page.
    const png = path.join(tmp, 'cmp.png');
    execFileSync(
      chromium,
      ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync', `--user-data-dir=${path.join(tmp, 'chrome')}`, '--hide-scrollbars', '--window-size=1200,3000', `--screenshot=${png}`, `file://${out}`],
      { stdio: 'ignore', timeout: 60000 },
    );
    const head = fs.readFileSync(png).subarray(0, 24);
    expect(head.subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
    expect([head.readUInt32BE(16), head.readUInt32BE(20)]).toEqual([1200, 3000]);
  });

  test('a damaged tree file is named in the report, and the baseline is each run\'s step-0 validation', () => {
    const a = path.join(tmp, 'damaged');
    fakeRun(a, 0, 0.25);
    fs.writeFileSync(path.join(a, 'rollout-trees.json'), '{"version": 1, "trees": [');
    const out = path.join(tmp, 'damaged.html');
    execFileSync(process.execPath, [path.join(root, 'bin', 'arpo.js'), 'report', a, '--out', out], { encoding: 'utf8' });
    const html = fs.readFileSync(out, 'utf8');
    expect(html).toMatch(/rollout trees not shown: [^<]*rollout-trees\.json/);
    expect((html.match(/<svg/g) ?? []).length).toBe(REPORT_CHARTS.length);
    const b = path.join(tmp, 'no-baseline');
    fakeRun(b, 0);
    const def = REPORT_CHARTS.find((c) => c.title === 'Accuracy')!.baseline!;
    expect(baselineValues(def, [readRun(a)])).toEqual([{ value: 0.25, label: 'before RL (step 0 validation) 0.250' }]);
    expect(baselineValues(def, [readRun(a), readRun(b)])).toEqual([{ value: 0.25, label: 'damaged: before RL (step 0 validation) 0.250' }]);
    // Runs from the same checkpoint share one line and one label; another value gets its own.
    const same = path.join(tmp, 'same-start');
    const other = path.join(tmp, 'other-start');
    fakeRun(same, 1, 0.25);
    fakeRun(other, 2, 0.5);
    expect(baselineValues(def, [readRun(a), readRun(b), readRun(same), readRun(other)])).toEqual([
      { value: 0.25, label: 'damaged, same-start: before RL (step 0 validation) 0.250' },
      { value: 0.5, label: 'other-start: before RL (step 0 validation) 0.500' },
    ]);
  });
});

describe('held-out table', () => {
  test('per-family accuracy, standard error and change; a family that fell by more than its error is marked', () => {
    // A wrong answer has bad format (reward -1); the first wrong one of each list was cut off at the length limit.
    let cut = 0;
    const row = (family: string, accuracy: number, toolCalls = 1) => ({ family, accuracy, score: accuracy * 2 - 1, formatOk: accuracy > 0, finish: (accuracy > 0 || cut++ > 0 ? 'answer' : 'length') as 'answer' | 'length', toolCalls });
    const rows = (...rs: (() => ReturnType<typeof row>)[]) => ((cut = 0), rs.map((r) => r()));
    // search: 3/4 -> 1/4 (falls by 0.5, error sqrt(2 * 3/16 / 4) = 0.306); python: 1/2 -> 2/2.
    const before = familyStats(rows(() => row('search', 1), () => row('search', 1), () => row('python', 0, 2), () => row('search', 1), () => row('python', 1), () => row('search', 0)));
    const after = familyStats(rows(() => row('search', 0), () => row('search', 1), () => row('python', 1), () => row('search', 0), () => row('python', 1), () => row('search', 0)));
    expect(Object.keys(before)).toEqual(['search', 'python', 'all']);
    expect(before.search).toEqual({ n: 4, accuracy: 0.75, se: Math.sqrt(0.75 * 0.25 / 4), reward: 0.5, badFormat: 0.25, cutOff: 0, toolCalls: 1 });
    expect(before.python).toMatchObject({ n: 2, accuracy: 0.5, badFormat: 0.5, cutOff: 0.5, toolCalls: 1.5 });
    expect(after.search).toMatchObject({ badFormat: 0.75, cutOff: 0.25 });
    expect(after.all).toMatchObject({ n: 6, badFormat: 0.5, cutOff: 1 / 6 });
    expect(after.python!.se).toBe(0);
    const c = compareFamilies(before, after);
    expect(c.search!.delta).toBeCloseTo(-0.5, 15);
    expect(c.search!.se).toBeCloseTo(Math.sqrt(2 * (0.75 * 0.25) / 4), 15);
    expect(c.search!.worse).toBe(true);
    expect(c.python).toMatchObject({ delta: 0.5, worse: false });
    expect(c.all!.worse).toBe(false); // 4/6 -> 3/6: -0.167 against an error of 0.283
    const html = heldOutSection({ before: 'SFT', after: 'SFT + ARPO', families: c });
    expect((html.match(/<td class="worse">/g) ?? []).length).toBe(1);
    expect(html).toContain('<th>search</th><td>4</td><td>0.750 ± 0.217</td><td>0.250 ± 0.217</td><td class="worse">-0.500 ± 0.306</td><td>1.00</td><td>1.00</td><td>25% (0%)</td><td>75% (25%)</td></tr>');
    // A second run beside the first (the demo's --compare): its accuracy, change and tool calls per family.
    const alt = compareFamilies(before, familyStats(rows(() => row('search', 1), () => row('search', 1), () => row('python', 1, 3), () => row('search', 1), () => row('python', 0, 3), () => row('search', 1))));
    const both = heldOutSection({ before: 'SFT', after: 'SFT + ARPO', families: c, alt: { name: 'SFT + GRPO', families: alt } });
    expect(both).toContain('<th>accuracy: SFT + GRPO</th><th>change</th>');
    expect(both).toContain('<th>search</th><td>4</td><td>0.750 ± 0.217</td><td>0.250 ± 0.217</td><td class="worse">-0.500 ± 0.306</td><td>1.000 ± 0.000</td><td>+0.250 ± 0.217</td><td>1.00</td><td>1.00</td><td>1.00</td><td>25% (0%)</td><td>75% (25%)</td><td>0% (0%)</td></tr>');
    expect(both).toContain('<th>python</th><td>2</td><td>0.500 ± 0.354</td><td>1.000 ± 0.000</td><td>+0.500 ± 0.354</td><td>0.500 ± 0.354</td><td>+0.000 ± 0.500</td><td>1.50</td><td>1.00</td><td>3.00</td><td>50% (50%)</td><td>0% (0%)</td><td>50% (50%)</td></tr>');
    expect(both).toContain('<th>bad format (cut off): SFT</th><th>bad format (cut off): SFT + ARPO</th><th>bad format (cut off): SFT + GRPO</th></tr>');
    expect(stagesSection({ a: 30, b: 90 })).toContain('<tr><th>b</th><td>90 s</td><td>75%</td></tr><tr><th>total</th><td>120 s</td>');
    expect(familyStats([]).all).toMatchObject({ n: 0 });
  });
});

describe('progress lines', () => {
  test('show the fields a phase has, and a resumed run times only its own steps', () => {
    expect(formatStepLine(3, 10, { 'reward/mean': 0.25, 'acc/mean': 0.5, 'tools/calls_per_traj': 1, 'response/length_mean': 20, 'actor/loss': 0.5 }, 30)).toBe(
      'step 3/10 | reward 0.250 | acc 0.500 | tool calls 1.00 | len 20.0 | loss 0.5000 | eta 1:10', // 30 s / 3 steps x 7 left
    );
    // SFT: no reward, accuracy or tool calls; 2 steps timed in 30 s, 7 left.
    expect(formatStepLine(3, 10, { 'actor/loss': 0.5 }, 30, 2)).toBe('step 3/10 | loss 0.5000 | eta 1:45');
    const lines: string[] = [];
    const p = new Progress(10, { write: (s: string) => lines.push(s) > 0, isTTY: false }, 'sft');
    p.step(8, { 'actor/loss': 1 });
    expect(lines[0]).toMatch(/^sft step 8\/10 \| loss 1\.0000 \| eta 0:00\n$/); // resumed at step 7: one step timed, instantly
  });

  test('a caller that shows every n-th step times all the steps since its start, not only the last one', () => {
    const lines: string[] = [];
    const now = Date.now();
    const spy = jest.spyOn(Date, 'now').mockReturnValue(now);
    try {
      const p = new Progress(2000, { write: (s: string) => lines.push(s) > 0, isTTY: false }, 'pretrain', 0);
      spy.mockReturnValue(now + 10_000); // 50 steps in 10 s: 1950 left take 390 s
      p.step(50, { 'actor/loss': 2 });
    } finally {
      spy.mockRestore();
    }
    expect(lines[0]).toBe('pretrain step 50/2000 | loss 2.0000 | eta 6:30\n');
  });
});

describe('truncateJsonlAfter', () => {
  test('keeps the lines up to a step, drops later and torn ones, and leaves a missing file alone', () => {
    const { truncateJsonlAfter } = require('../../lib/train/metrics') as typeof import('../../lib/train/metrics');
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-trunc-'));
    const f = path.join(dir, 't.jsonl');
    fs.writeFileSync(f, '{"step":1,"a":[1]}\n{"step":2}\n{"step":3}\n{"step":2,"late":true}\n{"step":4,"torn\n');
    truncateJsonlAfter(f, 2);
    expect(fs.readFileSync(f, 'utf8')).toBe('{"step":1,"a":[1]}\n{"step":2}\n{"step":2,"late":true}\n');
    truncateJsonlAfter(path.join(dir, 'none.jsonl'), 1);
    expect(fs.existsSync(path.join(dir, 'none.jsonl'))).toBe(false);
    fs.rmSync(dir, { recursive: true, force: true });
  });
});
