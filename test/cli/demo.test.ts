// `arpo demo --quick` end to end (the README's main command, shortened): world, pretraining,
// SFT, held-out evaluation, ARPO RL, evaluation again and the report, with every artefact on
// disk and the summary consistent with the per-question evaluation files.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { runDemo } from '../../lib/cli/demo';
import { readMetrics } from '../../lib/train/metrics';

let tmp: string;
beforeAll(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-demo-'));
});
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

function meanOf(file: string, key: string): number {
  const rows = fs.readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, number>);
  return rows.reduce((a, r) => a + (r[key] as number), 0) / rows.length;
}

test('the quick demo runs every stage and writes consistent results', async () => {
  const lines: string[] = [];
  const out = path.join(tmp, 'run');
  const s = await runDemo({ out, seed: 5, quick: true, progress: { write: (x) => lines.push(x) > 0 } });
  for (const d of ['model-init', 'model-pretrained', 'model-sft']) expect(fs.existsSync(path.join(out, d, 'model.safetensors'))).toBe(true);
  expect(fs.existsSync(path.join(out, 'report.html'))).toBe(true);
  expect(s.pretrain.steps).toBe(40);
  expect(readMetrics(path.join(out, 'pretrain-metrics.jsonl')).length).toBe(40);
  expect(s.sft.lastLoss).toBeLessThan(s.sft.firstLoss);
  expect(s.rl.steps).toBe(3);
  expect(readMetrics(path.join(out, 'rl', 'metrics.jsonl')).filter((r) => r.phase === 'train').length).toBe(3);
  // The summary's accuracies are the means of the per-question files.
  expect(s.sft.testAccuracy).toBeCloseTo(meanOf(path.join(out, 'test-sft.jsonl'), 'accuracy'), 10);
  expect(s.rl.testAccuracy).toBeCloseTo(meanOf(path.join(out, 'test-rl.jsonl'), 'accuracy'), 10);
  expect(JSON.parse(fs.readFileSync(path.join(out, 'summary.json'), 'utf8'))).toEqual(JSON.parse(JSON.stringify(s)));
  // Per family: the counts, accuracies and standard errors of the per-question files, recomputed naively.
  for (const [stage, file] of [['before', 'test-sft.jsonl'], ['after', 'test-rl.jsonl']] as const) {
    const rows = fs.readFileSync(path.join(out, file), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { family: string; accuracy: number });
    expect(new Set(rows.map((r) => r.family))).toEqual(new Set(Object.keys(s.families).filter((f) => f !== 'all')));
    for (const [f, c] of Object.entries(s.families)) {
      const rs = f === 'all' ? rows : rows.filter((r) => r.family === f);
      const p = rs.reduce((a, r) => a + r.accuracy, 0) / rs.length;
      expect(c[stage].n).toBe(rs.length);
      expect(c[stage].accuracy).toBeCloseTo(p, 12);
      expect(c[stage].se).toBeCloseTo(Math.sqrt((p * (1 - p)) / rs.length), 12);
    }
  }
  expect(['search', 'python', 'both'].some((f) => f in s.families)).toBe(true);
  const html = fs.readFileSync(path.join(out, 'report.html'), 'utf8');
  expect(html).toContain('<section id="heldout">');
  expect(html).toContain('<section id="stages">');
  const text = lines.join('');
  expect(text).toContain('| SFT + ARPO (3 steps) |');
  expect(text).toMatch(/\| all \| 24 \| /);
  expect(text).toMatch(/wall time: \d+ s \(build \d+, pretraining \d+, SFT \d+, RL \d+\)/);
}, 600_000);
