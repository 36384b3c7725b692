// Run checkpoints: atomic save, latest pointer, pruning, and survival of a process killed mid-write.
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { CheckpointManager, TrainerState, readTrainerState } from '../../lib/train/checkpoint';

const root = path.resolve(__dirname, '..', '..');

function state(step: number): TrainerState {
  return { version: 1, step, dataCursor: { epoch: 0, index: step * 4 }, seed: 7, configHash: 'abc' };
}

async function writeModel(dir: string, tag: string): Promise<void> {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify({ tag }));
  fs.writeFileSync(path.join(dir, 'model.safetensors'), Buffer.alloc(1024, tag.length));
}

describe('CheckpointManager', () => {
  let run: string;
  beforeEach(() => {
    run = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-ckpt-'));
  });
  afterEach(() => fs.rmSync(run, { recursive: true, force: true }));

  test('save writes model + state, latest follows, old ones are pruned', async () => {
    const m = new CheckpointManager(run, 2);
    expect(m.latest()).toBeNull();
    for (const s of [1, 2, 3]) await m.save(state(s), (d) => writeModel(d, `s${s}`));
    const latest = m.latest()!;
    expect(latest.state.step).toBe(3);
    expect(latest.state.dataCursor).toEqual({ epoch: 0, index: 12 });
    expect(JSON.parse(fs.readFileSync(path.join(latest.dir, 'model', 'config.json'), 'utf8'))).toEqual({ tag: 's3' });
    expect(fs.readdirSync(m.dir).sort()).toEqual(['latest', 'step-000002', 'step-000003']);
  });

  test('a failing model writer leaves no trace and keeps the previous checkpoint', async () => {
    const m = new CheckpointManager(run);
    await m.save(state(1), (d) => writeModel(d, 's1'));
    await expect(m.save(state(2), async () => { throw new Error('disk full'); })).rejects.toThrow('disk full');
    expect(m.latest()!.state.step).toBe(1);
    expect(fs.readdirSync(m.dir).sort()).toEqual(['latest', 'step-000001']);
  });

  test('a corrupt or dangling latest falls back to the newest complete checkpoint', async () => {
    const m = new CheckpointManager(run, 5);
    await m.save(state(1), (d) => writeModel(d, 's1'));
    await m.save(state(2), (d) => writeModel(d, 's2'));
    fs.writeFileSync(path.join(m.stepDir(2), 'trainer_state.json'), '{"version": 1, "st');
    expect(m.latest()!.state.step).toBe(1);
    fs.writeFileSync(path.join(m.dir, 'latest'), 'step-000009\n');
    expect(m.latest()!.state.step).toBe(1);
    expect(() => readTrainerState(m.stepDir(2))).toThrow(/trainer_state\.json: cannot read trainer state/);
  });

  test('a process killed while writing a checkpoint leaves the previous one loadable', async () => {
    const m = new CheckpointManager(run);
    await m.save(state(1), (d) => writeModel(d, 's1'));
    // A child that starts checkpoint 2 and hangs inside the model write; we SIGKILL it there.
    const script = `
      const { CheckpointManager } = require(${JSON.stringify(path.join(root, 'lib', 'train', 'checkpoint.ts'))});
      const fs = require('fs'); const path = require('path');
      const m = new CheckpointManager(${JSON.stringify(run)});
      m.save({ version: 1, step: 2, dataCursor: null, seed: 7, configHash: 'abc' }, async (dir) => {
        fs.mkdirSync(dir, { recursive: true });
        fs.writeFileSync(path.join(dir, 'config.json'), '{}');
        fs.writeFileSync(path.join(dir, 'model.safetensors'), Buffer.alloc(1 << 20));
        process.stdout.write('writing\\n');
        await new Promise(() => setInterval(() => {}, 1000));
      });`;
    const child = spawn(process.execPath, ['-r', require.resolve('ts-node/register/transpile-only'), '-e', script], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise<void>((resolve) => child.stdout.on('data', (b: Buffer) => b.toString().includes('writing') && resolve()));
    child.kill('SIGKILL');
    await new Promise((r) => child.on('exit', r));
    expect(fs.readdirSync(m.dir).some((n) => n.includes('.tmp-'))).toBe(true);
    expect(m.latest()!.state.step).toBe(1);
    expect(m.cleanPartial().length).toBe(1);
    expect(fs.readdirSync(m.dir).sort()).toEqual(['latest', 'step-000001']);
  });
});
