// The HTML report of one or more runs: static SVG charts rendered with
// vega-lite + vega in Node (no network, no scripts in the page) from each
// run's metrics.jsonl; with several runs, every chart overlays them by colour
// and a table puts their final numbers side by side.
import { execFile } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { ArpoError } from '../errors';
import { packageRoot } from '../native/loader';
import { MetricsRecord, readMetrics } from './metrics';
import { escapeXml, readTreeViews, renderTreeSvg } from './tree-view';
import type { compareFamilies, FamilyStats } from './evaluate';

/** Renders vega-lite specs to SVG in a child Node process (lib/train/render-charts.mjs). */
function renderSpecs(specs: readonly unknown[]): Promise<string[]> {
  const script = path.join(packageRoot(), 'lib', 'train', 'render-charts.mjs');
  return new Promise((resolve, reject) => {
    const child = execFile(process.execPath, [script], { maxBuffer: 256 * 1024 * 1024, cwd: packageRoot() }, (err, stdout, stderr) => {
      if (err) return reject(new ArpoError('BAD_DATA', `report: chart rendering failed: ${stderr.trim() || err.message}`));
      try {
        resolve(JSON.parse(stdout) as string[]);
      } catch (e) {
        reject(new ArpoError('BAD_DATA', `report: chart renderer returned bad output: ${(e as Error).message}`));
      }
    });
    child.stdin?.end(JSON.stringify(specs));
  });
}

interface ChartDef {
  title: string;
  yTitle: string;
  /** metric keys, or a key prefix ending in '/*' (every matching key becomes a series) */
  series: { key: string; phase: string; label?: string }[];
  /** A horizontal rule at the run's step-0 value of this series (the model before RL), when it has one. */
  baseline?: { key: string; phase: string; label: string };
}

export const REPORT_CHARTS: ChartDef[] = [
  { title: 'Reward', yTitle: 'mean reward', series: [{ key: 'reward/mean', phase: 'train', label: 'train' }, { key: 'reward/mean', phase: 'valid', label: 'valid' }] },
  {
    title: 'Accuracy',
    yTitle: 'accuracy',
    series: [{ key: 'acc/mean', phase: 'train', label: 'train' }, { key: 'acc/mean', phase: 'valid', label: 'valid' }],
    baseline: { key: 'acc/mean', phase: 'valid', label: 'before RL (step 0 validation)' },
  },
  { title: 'Response length', yTitle: 'tokens per trajectory', series: [{ key: 'response/length_mean', phase: 'train', label: 'generated' }] },
  { title: 'Tool calls per trajectory, by tool', yTitle: 'calls', series: [{ key: 'tools/calls/*', phase: 'train' }] },
  { title: 'Entropy around tool calls', yTitle: 'normalised entropy', series: [{ key: 'entropy/before_tool', phase: 'train', label: 'before' }, { key: 'entropy/after_tool', phase: 'train', label: 'after' }] },
  { title: 'Branch events per step', yTitle: 'branches', series: [{ key: 'rollout/branch_events', phase: 'train', label: 'branches' }] },
];

export interface RunData {
  name: string;
  dir: string;
  records: MetricsRecord[];
}

export function readRun(dir: string, name?: string): RunData {
  const file = path.join(dir, 'metrics.jsonl');
  if (!fs.existsSync(file)) throw new ArpoError('BAD_DATA', `report: no metrics.jsonl in ${dir}`);
  return { name: name ?? path.basename(path.resolve(dir)), dir, records: readMetrics(file) };
}

interface Point {
  step: number;
  value: number;
  series: string;
}

/** The points of one chart for one run (exported for tests). */
export function chartPoints(def: ChartDef, run: RunData): Point[] {
  const pts: Point[] = [];
  for (const s of def.series) {
    for (const r of run.records) {
      if (r.phase !== s.phase) continue;
      if (s.key.endsWith('/*')) {
        const prefix = s.key.slice(0, -1);
        for (const [k, v] of Object.entries(r.metrics)) {
          if (k.startsWith(prefix) && Number.isFinite(v)) pts.push({ step: r.step, value: v, series: k.slice(prefix.length) });
        }
      } else {
        const v = r.metrics[s.key];
        if (v !== undefined && Number.isFinite(v)) pts.push({ step: r.step, value: v, series: s.label ?? s.key });
      }
    }
  }
  return pts;
}

const escapeHtml = escapeXml;

/** The vega-lite spec of one chart, or null when no run has data for it. */
function chartSpec(def: ChartDef, runs: RunData[]): object | null {
  const values = runs.flatMap((run) => chartPoints(def, run).map((p) => ({ ...p, run: run.name, line: runs.length > 1 ? `${run.name}: ${p.series}` : p.series })));
  if (values.length === 0) return null;
  const line = {
    data: { values },
    mark: { type: 'line', point: values.length < 200 },
    encoding: {
      // Steps are whole numbers: ticks only at integers.
      x: { field: 'step', type: 'quantitative', title: 'step', axis: { tickMinStep: 1, format: 'd' } },
      // '~r': a flat series (all zeros) gets tick labels like 0, not 0.000000.
      y: { field: 'value', type: 'quantitative', title: def.yTitle, axis: { format: '~r' } },
      color: { field: 'line', type: 'nominal', title: runs.length > 1 ? 'run: series' : 'series' },
      ...(runs.length > 1 ? { strokeDash: { field: 'run', type: 'nominal', title: 'run' } } : {}),
    },
  };
  const rules = def.baseline ? baselineValues(def.baseline, runs) : [];
  const head = { $schema: 'https://vega.github.io/schema/vega-lite/v6.json', width: 420, height: 220, title: def.title };
  if (rules.length === 0) return { ...head, ...line };
  const y = { field: 'value', type: 'quantitative' };
  return {
    ...head,
    layer: [
      line,
      { data: { values: rules }, mark: { type: 'rule', strokeDash: [4, 3], color: '#666' }, encoding: { y } },
      { data: { values: rules }, mark: { type: 'text', align: 'left', baseline: 'bottom', dx: 2, dy: -2, color: '#444', fontSize: 10 }, encoding: { y, x: { datum: 0, type: 'quantitative' }, text: { field: 'label' } } },
    ],
  };
}

/**
 * The step-0 values of a baseline series, one line per distinct value, naming the runs that have it
 * (runs from the same checkpoint, as in the demo's --compare, share one line and one label rather
 * than drawing their labels over each other); exported for tests.
 */
export function baselineValues(b: NonNullable<ChartDef['baseline']>, runs: RunData[]): { value: number; label: string }[] {
  const byValue = new Map<number, string[]>();
  for (const run of runs) {
    const r = run.records.find((x) => x.phase === b.phase && x.step === 0 && Number.isFinite(x.metrics[b.key]));
    const value = r?.metrics[b.key];
    if (value !== undefined) byValue.set(value, [...(byValue.get(value) ?? []), run.name]);
  }
  return [...byValue].map(([value, names]) => ({ value, label: `${runs.length > 1 ? `${names.join(', ')}: ` : ''}${b.label} ${value.toFixed(3)}` }));
}

/** The report's tree-view section: each run's rollout trees of its last step, or why they cannot be shown. */
export function treeSection(runs: RunData[]): string {
  const blocks = runs.flatMap((run) => {
    const v = readTreeViews(run.dir);
    if (v === null) return [];
    const who = runs.length > 1 ? `${escapeHtml(run.name)}: ` : '';
    if ('error' in v) return [`<p class="empty">${who}rollout trees not shown: ${escapeHtml(v.error)}</p>`];
    return [
      `<h3>${who}step ${v.step}, ${v.trees.length} prompt${v.trees.length === 1 ? '' : 's'} (${v.attribution} attribution)</h3>`,
      ...v.trees.map((t) => `<figure class="tree">${renderTreeSvg(t, v.attribution)}</figure>`),
    ];
  });
  if (blocks.length === 0) return '';
  return [
    '<section id="trees"><h2>Rollout trees (last step)</h2>',
    '<p>Each row is one trajectory (leaf); a segment is a run of tokens shared by the rows below it, placed by token position in the response. ',
    'Blue: generated, orange: a tool result, red: a tool error; ◆ a branch decision after a tool result with its ΔH (entropy of the next k tokens minus the path\'s initial entropy) and P (branch probability), filled when it fired; ',
    'leaves coloured by reward (red -1, grey 0, green 1), with their reward r and advantage A; hover a segment for its text and attributed advantage.</p>',
    ...blocks,
    '</section>',
  ].join('\n');
}

function lastValue(run: RunData, key: string, phase: string): number | undefined {
  for (let i = run.records.length - 1; i >= 0; i--) {
    const r = run.records[i]!;
    if (r.phase === phase && r.metrics[key] !== undefined) return r.metrics[key];
  }
  return undefined;
}

function firstValue(run: RunData, key: string, phase: string): number | undefined {
  for (const r of run.records) if (r.phase === phase && r.metrics[key] !== undefined) return r.metrics[key];
  return undefined;
}

const SUMMARY_ROWS: { label: string; key: string; phase: string; which: 'first' | 'last' }[] = [
  { label: 'validation accuracy (first)', key: 'acc/mean', phase: 'valid', which: 'first' },
  { label: 'validation accuracy (last)', key: 'acc/mean', phase: 'valid', which: 'last' },
  { label: 'validation reward (last)', key: 'reward/mean', phase: 'valid', which: 'last' },
  { label: 'train reward (last step)', key: 'reward/mean', phase: 'train', which: 'last' },
  { label: 'tool calls per trajectory (last step)', key: 'tools/calls_per_traj', phase: 'train', which: 'last' },
  { label: 'validation tool calls per question (last)', key: 'tools/calls_per_traj', phase: 'valid', which: 'last' },
  { label: 'steps', key: 'step', phase: 'train', which: 'last' },
];

/** What a caller that ran more than the training (the demo) adds to the report. */
export interface ReportExtras {
  /**
   * Held-out evaluation per family, before and after RL (evaluate.ts
   * compareFamilies); `alt`: a second RL run from the same model (e.g. GRPO
   * beside ARPO), its columns next to the first's.
   */
  heldOut?: { before: string; after: string; families: ReturnType<typeof compareFamilies>; alt?: { name: string; families: ReturnType<typeof compareFamilies> } };
  /** Wall time per stage, in seconds, in order. */
  stages?: Record<string, number>;
}

/** The held-out table: per family its count, accuracy ± standard error before and after, the change ± its error, tool calls, bad format. */
export function heldOutSection(h: NonNullable<ReportExtras['heldOut']>): string {
  const pct = (s: FamilyStats): string => `${s.accuracy.toFixed(3)} ± ${s.se.toFixed(3)}`;
  type Change = ReturnType<typeof compareFamilies>[string];
  const change = (c: Change): string => `<td${c.worse ? ' class="worse"' : ''}>${c.delta >= 0 ? '+' : ''}${c.delta.toFixed(3)} ± ${c.se.toFixed(3)}</td>`;
  // Bad format: the share of responses the reward's format check failed (its -1), with the share cut off at the length limit.
  const share = (s: FamilyStats): string => `${(100 * s.badFormat).toFixed(0)}% (${(100 * s.cutOff).toFixed(0)}%)`;
  const alt = h.alt;
  const n = (s: string): string => escapeHtml(s);
  // A column per model (before, after, and the second run's after when there is one).
  const models = (what: string): string => `<th>${what}: ${n(h.before)}</th><th>${what}: ${n(h.after)}</th>${alt ? `<th>${what}: ${n(alt.name)}</th>` : ''}`;
  const rows = Object.entries(h.families).map(([f, c]) => {
    const a = alt?.families[f];
    const cells = (value: (s: FamilyStats) => string): string => `<td>${value(c.before)}</td><td>${value(c.after)}</td>${alt ? `<td>${a ? value(a.after) : '-'}</td>` : ''}`;
    return (
      `<tr><th>${escapeHtml(f)}</th><td>${c.before.n}</td><td>${pct(c.before)}</td><td>${pct(c.after)}</td>${change(c)}` +
      (alt ? (a ? `<td>${pct(a.after)}</td>${change(a)}` : '<td>-</td><td>-</td>') : '') +
      `${cells((s) => s.toolCalls.toFixed(2))}${cells(share)}</tr>`
    );
  });
  return [
    '<section id="heldout"><h2>Held-out test questions, by family</h2>',
    `<table><tr><th>family</th><th>questions</th><th>accuracy: ${n(h.before)}</th><th>accuracy: ${n(h.after)}</th><th>change</th>` +
      (alt ? `<th>accuracy: ${n(alt.name)}</th><th>change</th>` : '') +
      `${models('tool calls')}${models('bad format (cut off)')}</tr>`,
    ...rows,
    '</table><p>± one standard error (sqrt(p(1-p)/n); for the change, of both). A change that fell by more than that error is marked red. Bad format: the share of responses the reward scored -1 for their format; cut off: of all responses, those stopped by the response-length limit (repetition loops).</p></section>',
  ].join('\n');
}

/** Wall time per stage. */
export function stagesSection(stages: Record<string, number>): string {
  const total = Object.values(stages).reduce((a, b) => a + b, 0);
  const rows = Object.entries(stages).map(([k, v]) => `<tr><th>${escapeHtml(k)}</th><td>${v.toFixed(0)} s</td><td>${total > 0 ? ((100 * v) / total).toFixed(0) : '-'}%</td></tr>`);
  return `<section id="stages"><h2>Wall time per stage</h2><table>${rows.join('')}<tr><th>total</th><td>${total.toFixed(0)} s</td><td></td></tr></table></section>`;
}

/** Renders the report HTML (a complete static page) for one or more runs. */
export async function renderReport(runs: RunData[], title = 'arpo report', extras: ReportExtras = {}): Promise<string> {
  if (runs.length === 0) throw new ArpoError('INVALID_ARGUMENT', 'report: no runs given');
  const specs = REPORT_CHARTS.map((def) => chartSpec(def, runs));
  const svgs = await renderSpecs(specs.filter((s): s is object => s !== null));
  let k = 0;
  const charts = specs.map((s, i) => `<figure>${s === null ? `<p class="empty">${escapeHtml(REPORT_CHARTS[i]!.title)}: no data</p>` : svgs[k++]}</figure>`);
  const head = `<tr><th></th>${runs.map((r) => `<th>${escapeHtml(r.name)}</th>`).join('')}</tr>`;
  const rows = SUMMARY_ROWS.map((row) => {
    const cells = runs.map((run) => {
      const v = row.key === 'step' ? run.records.filter((r) => r.phase === 'train').length : row.which === 'first' ? firstValue(run, row.key, row.phase) : lastValue(run, row.key, row.phase);
      return `<td>${v === undefined ? '-' : Number.isInteger(v) ? String(v) : v.toFixed(3)}</td>`;
    });
    return `<tr><th>${escapeHtml(row.label)}</th>${cells.join('')}</tr>`;
  });
  return [
    '<!doctype html>',
    '<html lang="en"><head><meta charset="utf-8">',
    `<title>${escapeHtml(title)}</title>`,
    '<style>body{font-family:system-ui,sans-serif;margin:24px;color:#222}figure{display:inline-block;margin:8px}figure.tree{display:block}',
    'table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}th:first-child{text-align:left}.empty{color:#888}td.worse{color:#c00}</style>',
    '</head><body>',
    `<h1>${escapeHtml(title)}</h1>`,
    `<p>Runs: ${runs.map((r) => `<code>${escapeHtml(r.dir)}</code>`).join(', ')}</p>`,
    `<table id="summary">${head}${rows.join('')}</table>`,
    extras.heldOut ? heldOutSection(extras.heldOut) : '',
    `<section id="charts">${charts.join('\n')}</section>`,
    treeSection(runs),
    extras.stages ? stagesSection(extras.stages) : '',
    '</body></html>',
  ].join('\n');
}

/** Writes <out> (default: <first run>/report.html) atomically and returns its path. */
export async function writeReport(runDirs: readonly string[], out?: string, extras: ReportExtras = {}): Promise<string> {
  const runs = runDirs.map((d) => readRun(d));
  const names = new Set<string>();
  runs.forEach((r, i) => {
    if (names.has(r.name)) r.name = `${r.name} (${i + 1})`;
    names.add(r.name);
  });
  const html = await renderReport(runs, runs.length > 1 ? `arpo report: ${runs.map((r) => r.name).join(' vs ')}` : `arpo report: ${runs[0]!.name}`, extras);
  const file = out ?? path.join(runDirs[0]!, 'report.html');
  const tmp = `${file}.tmp-${process.pid}`;
  fs.writeFileSync(tmp, html);
  fs.renameSync(tmp, file);
  return file;
}
