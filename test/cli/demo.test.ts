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
  const text = lines.join('');
  expect(text).toContain('| SFT + ARPO (3 steps) |');
  expect(text).toMatch(/wall time: \d+ s \(build \d+, pretraining \d+, SFT \d+, RL \d+\)/);
}, 600_000);
