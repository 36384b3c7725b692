// `arpo demo --quick` end to end (the README's main command, shortened): world, pretraining,
// SFT, held-out evaluation, ARPO RL, evaluation again and the report, with every artefact on
// disk and the summary consistent with the per-question evaluation files.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { DEMO_COST, estimateDemo, formatEstimate, runDemo } from '../../lib/cli/demo';
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

test('the quick demo with --compare runs every stage, trains GRPO beside ARPO from the same SFT model, and writes consistent results', async () => {
  const lines: string[] = [];
  const out = path.join(tmp, 'run');
  const s = await runDemo({ out, seed: 5, quick: true, compare: true, progress: { write: (x) => lines.push(x) > 0 } });
  for (const d of ['model-init', 'model-pretrained', 'model-sft']) expect(fs.existsSync(path.join(out, d, 'model.safetensors'))).toBe(true);
  expect(fs.existsSync(path.join(out, 'report.html'))).toBe(true);
  expect(s.pretrain.steps).toBe(40);
  expect(readMetrics(path.join(out, 'pretrain-metrics.jsonl')).length).toBe(40);
  expect(s.sft.lastLoss).toBeLessThan(s.sft.firstLoss);
  expect(s.rl.steps).toBe(3);
  const arpoTrain = readMetrics(path.join(out, 'rl', 'metrics.jsonl')).filter((r) => r.phase === 'train');
  const grpoTrain = readMetrics(path.join(out, 'grpo', 'metrics.jsonl')).filter((r) => r.phase === 'train');
  expect(arpoTrain.length).toBe(3);
  expect(grpoTrain.length).toBe(3);
  // GRPO is trajectory-level (no branching) at the same M over the same prompts.
  expect(grpoTrain.every((r) => r.metrics['rollout/branch_events'] === 0)).toBe(true);
  expect(grpoTrain.map((r) => r.metrics['rollout/trajectories'])).toEqual(arpoTrain.map((r) => r.metrics['rollout/trajectories']));
  expect(JSON.parse(fs.readFileSync(path.join(out, 'grpo', 'config.json'), 'utf8')).rollout.mode).toBe('trajectory');
  // The training tool calls per prompt are the mean over the run's steps.
  const meanMetric = (rs: typeof arpoTrain, k: string) => rs.reduce((a, r) => a + (r.metrics[k] as number), 0) / rs.length;
  expect(s.rl.trainToolCallsPerPrompt).toBeCloseTo(meanMetric(arpoTrain, 'tools/executed_per_prompt'), 12);
  expect(s.grpo!.trainToolCallsPerPrompt).toBeCloseTo(meanMetric(grpoTrain, 'tools/executed_per_prompt'), 12);
  expect(s.grpo!.steps).toBe(3);
  // The summary's accuracies are the means of the per-question files.
  expect(s.sft.testAccuracy).toBeCloseTo(meanOf(path.join(out, 'test-sft.jsonl'), 'accuracy'), 10);
  expect(s.rl.testAccuracy).toBeCloseTo(meanOf(path.join(out, 'test-rl.jsonl'), 'accuracy'), 10);
  expect(s.grpo!.testAccuracy).toBeCloseTo(meanOf(path.join(out, 'test-grpo.jsonl'), 'accuracy'), 10);
  expect(s.grpo!.testToolCalls).toBeCloseTo(meanOf(path.join(out, 'test-grpo.jsonl'), 'toolCalls'), 10);
  expect(JSON.parse(fs.readFileSync(path.join(out, 'summary.json'), 'utf8'))).toEqual(JSON.parse(JSON.stringify(s)));
  // Per family: the counts, accuracies and standard errors of the per-question files, recomputed naively.
  for (const [stage, file, fams] of [['before', 'test-sft.jsonl', s.families], ['after', 'test-rl.jsonl', s.families], ['after', 'test-grpo.jsonl', s.grpoFamilies!]] as const) {
    const rows = fs.readFileSync(path.join(out, file), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { family: string; accuracy: number; score: number; finish: string });
    expect(new Set(rows.map((r) => r.family))).toEqual(new Set(Object.keys(fams).filter((f) => f !== 'all')));
    for (const [f, c] of Object.entries(fams)) {
      const rs = f === 'all' ? rows : rows.filter((r) => r.family === f);
      const p = rs.reduce((a, r) => a + r.accuracy, 0) / rs.length;
      expect(c[stage].n).toBe(rs.length);
      expect(c[stage].accuracy).toBeCloseTo(p, 12);
      expect(c[stage].se).toBeCloseTo(Math.sqrt((p * (1 - p)) / rs.length), 12);
      // Bad format: the reward's -1; cut off: generation stopped by the response-length limit.
      expect(c[stage].badFormat).toBeCloseTo(rs.filter((r) => r.score === -1).length / rs.length, 12);
      expect(c[stage].cutOff).toBeCloseTo(rs.filter((r) => r.finish === 'length').length / rs.length, 12);
    }
  }
  expect(['search', 'python', 'both'].some((f) => f in s.families)).toBe(true);
  const html = fs.readFileSync(path.join(out, 'report.html'), 'utf8');
  expect(html).toContain('<section id="heldout">');
  expect(html).toContain('<section id="stages">');
  expect(html).toContain('<th>accuracy: SFT + GRPO</th>');
  expect(html).toContain('<th>bad format (cut off): SFT + GRPO</th>');
  expect(html).toContain('<th>rl</th><th>grpo</th>'); // both runs in the summary table and every chart
  const text = lines.join('');
  // The time estimate comes before SFT starts, from the first pretraining steps.
  expect(text.indexOf('[demo] estimated time on this machine: ~')).toBeGreaterThan(-1);
  expect(text.indexOf('[demo] estimated time on this machine')).toBeLessThan(text.indexOf('[demo] SFT on'));
  expect(text).toMatch(/estimated time on this machine: ~[\d.]+ (s|min) \(world build \d+ s, pretraining [\d.]+ (s|min), SFT [\d.]+ (s|min), ARPO RL [\d.]+ (s|min), GRPO RL [\d.]+ (s|min), evaluations [\d.]+ (s|min)\)/);
  expect(text).toContain('| SFT + ARPO (3 steps) |');
  expect(text).toContain('| SFT + GRPO (3 steps) |');
  expect(text).toMatch(/\| ARPO: all \| 24 \| /);
  expect(text).toMatch(/\| GRPO: all \| 24 \| /);
  expect(text).toMatch(/wall time: \d+ s \(build \d+, pretraining \d+, SFT \d+, RL \d+, GRPO \d+\)/);
}, 600_000);

test('the time estimate: each stage is its work times its cost in pretraining steps', () => {
  const plan = { pretrainSteps: 2000, sftSteps: 600, rl: [{ name: 'ARPO', steps: 40, mode: 'arpo' as const }, { name: 'GRPO', steps: 40, mode: 'trajectory' as const }], evalQuestions: 500 };
  const e = estimateDemo(plan, 0.2);
  expect(e.pretraining).toBeCloseTo(400, 9);
  expect(e.SFT).toBeCloseTo(600 * 0.2 * DEMO_COST.sftStep, 9);
  expect(e['ARPO RL']).toBeCloseTo(40 * 0.2 * DEMO_COST.rlStep.arpo, 9);
  expect(e['GRPO RL']).toBeCloseTo(40 * 0.2 * DEMO_COST.rlStep.trajectory, 9);
  expect(e.evaluations).toBeCloseTo(500 * 0.2 * DEMO_COST.evalQuestion, 9);
  expect(formatEstimate({ a: 30, b: 150 })).toBe('~3.0 min (a 30 s, b 2.5 min)');
  expect(formatEstimate({ a: 1200 })).toBe('~20 min (a 20 min)');
});
