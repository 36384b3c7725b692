// The demo's model stages (pretraining, SFT) data-parallel over 2 processes
// (`arpo demo --nproc 2`, the default on 2+ cores): this process is rank 0 and
// `arpo demo --model-rank <spec>` children the others. Reference: the same
// stages in one process on the same world, seed and settings, both in
// float64 (model.dtype) so that the only difference, the order in which the
// ranks' gradients are summed, stays near 1e-15: each step's loss and grad
// norm and every final weight must agree to 1e-9 (in float32, AdamW turns
// that order into differences of lr on parameters whose gradient is near
// zero, too coarse a check), rank 0
// alone writes the metrics and the models, and a bad spec file is an error
// naming it.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { demoPretrainSettings, demoRunConfig, runDemoModelRank, trainDemoModelRanks, type DemoModelRun } from '../../lib/cli/demo';
import { buildDemoEnvironment } from '../../lib/envs';
import { hasTorch, loadNative } from '../../lib/native/loader';
import { bytesToFloat64, SafetensorsFile } from '../../lib/model/safetensors';
import { readMetrics } from '../../lib/train/metrics';

const ifGloo = hasTorch() && loadNative().hasGloo ? test : test.skip;

let tmp: string;
beforeAll(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-demo-ranks-'));
});
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

function weights(dir: string): Map<string, Float64Array> {
  const file = SafetensorsFile.open(path.join(dir, 'model.safetensors'));
  const out = new Map<string, Float64Array>();
  for (const [name, info] of file.tensors) out.set(name, bytesToFloat64(info.dtype, file.loadBytes(name)));
  return out;
}

async function stages(envDir: string, out: string, nproc: number): Promise<DemoModelRun> {
  const cfg = demoRunConfig(envDir, path.join(out, 'model-sft'), path.join(out, 'rl'), 3, true, undefined, { sft: { epochs: 1, batchSequences: 16 }, model: { dtype: 'float64' } });
  // 160 traces / 16 = 10 SFT steps; 6 pretraining steps of 8 sequences (4 per rank).
  const pretrain = { ...demoPretrainSettings(true), steps: 6, batchSequences: 8 };
  return trainDemoModelRanks(nproc, { envDir, sftFile: path.join(envDir, 'sft.jsonl'), traces: 160, out, seed: 3, cfg, pretrain, progress: { write: () => true } });
}

ifGloo('pretraining and SFT on 2 ranks end with the losses and weights of one process', async () => {
  const envDir = path.join(tmp, 'env');
  await buildDemoEnvironment({ seed: 3, dir: envDir, sizes: { sft: 160, questions: { test: 40, valid: 40 } } });
  const one = await stages(envDir, path.join(tmp, 'one'), 1);
  const two = await stages(envDir, path.join(tmp, 'two'), 2);
  expect(two.pretrain.steps).toBe(6);
  expect(two.sft.steps).toBe(10);
  for (const file of ['pretrain-metrics.jsonl', 'sft-metrics.jsonl']) {
    const a = readMetrics(path.join(tmp, 'one', file));
    const b = readMetrics(path.join(tmp, 'two', file));
    // Rank 0 alone logs: one line per step.
    expect(b.map((r) => r.step)).toEqual(a.map((r) => r.step));
    for (let i = 0; i < a.length; i++) {
      for (const k of ['actor/loss', 'actor/grad_norm']) {
        const x = a[i]!.metrics[k] as number;
        const y = b[i]!.metrics[k] as number;
        expect(Math.abs(x - y)).toBeLessThanOrEqual(1e-9 * Math.max(1, Math.abs(x)));
      }
      // The token counts are the whole batch's, summed over the ranks.
      const tokens = file.startsWith('sft') ? 'sft/tokens' : 'pretrain/tokens';
      expect(b[i]!.metrics[tokens]).toBe(a[i]!.metrics[tokens]);
    }
  }
  for (const stage of ['model-pretrained', 'model-sft']) {
    const a = weights(path.join(tmp, 'one', stage));
    const b = weights(path.join(tmp, 'two', stage));
    expect([...b.keys()].sort()).toEqual([...a.keys()].sort());
    for (const [name, x] of a) {
      const y = b.get(name)!;
      let scale = 0;
      let worst = 0;
      for (let i = 0; i < x.length; i++) {
        scale = Math.max(scale, Math.abs(x[i]!));
        worst = Math.max(worst, Math.abs(x[i]! - y[i]!));
      }
      expect({ name, rel: worst / Math.max(scale, 1e-12) < 1e-9 }).toEqual({ name, rel: true });
    }
  }
  // The helper's spec is what rank 0 trained with.
  const spec = JSON.parse(fs.readFileSync(path.join(tmp, 'two', 'model-ranks.json'), 'utf8')) as { pretrain: { steps: number }; traces: number };
  expect(spec.pretrain.steps).toBe(6);
  expect(spec.traces).toBe(160);
}, 300_000);

test('a helper rank given an unreadable spec stops with an error naming the file', async () => {
  const missing = path.join(tmp, 'no-such-spec.json');
  await expect(runDemoModelRank(missing)).rejects.toThrow(`--model-rank: cannot read the model-stage spec ${missing}`);
  const bad = path.join(tmp, 'bad-spec.json');
  fs.writeFileSync(bad, '{"cfg": ');
  await expect(runDemoModelRank(bad)).rejects.toThrow(bad);
});
