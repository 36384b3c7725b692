// The HTML report: built by the CLI from metrics.jsonl files, checked in headless Chromium.
import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { formatStepLine, MetricsLog, Progress, readMetrics } from '../../lib/train/metrics';
import { REPORT_CHARTS, chartPoints, readRun } from '../../lib/train/report';

const root = path.resolve(__dirname, '..', '..');
const chromium = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => fs.existsSync(p));

function fakeRun(dir: string, seed: number): void {
  const log = new MetricsLog(dir);
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
    fakeRun(a, 0);
    fakeRun(b, 1);
    const out = path.join(tmp, 'cmp.html');
    const printed = execFileSync(process.execPath, [path.join(root, 'bin', 'arpo.js'), 'report', a, b, '--out', out], { encoding: 'utf8' });
    expect(printed.trim()).toBe(out);
    const html = fs.readFileSync(out, 'utf8');
    expect(html).not.toMatch(/<script/i);
    expect(html).not.toMatch(/https?:\/\/(?!www\.w3\.org)/);
    expect((html.match(/<svg/g) ?? []).length).toBe(REPORT_CHARTS.length);
    expect(html).toContain('<th>arpo-run</th><th>grpo-run</th>');
    if (!chromium) throw new Error('Chromium is not installed: run scripts/install-deps.sh (package chromium)');
    const dom = execFileSync(
      chromium,
      ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync', `--user-data-dir=${path.join(tmp, 'chrome')}`, '--dump-dom', `file://${out}`],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 60000 },
    );
    expect((dom.match(/<svg/g) ?? []).length).toBe(REPORT_CHARTS.length);
    expect(dom).toContain('Entropy around tool calls');
    expect(dom).toContain('grpo-run');
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
