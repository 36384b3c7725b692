// Spawning child processes (what every python tool call does) while the model
// computes on the libuv pool must not hang the process: OpenBLAS's fork
// handler deadlocks when a matrix product runs during fork(), and the addon's
// fork guard (native/torch/fork_guard.h) makes fork() wait for the running
// call. Without the guard this test hangs (and fails on the timeout) within
// a few dozen spawns on Debian's OpenBLAS; the C++ twin is native/test/torch/fork_test.cc.
import { spawn } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { initModel } from '../../lib/cli/init-model';
import { PolicyModel } from '../../lib/model/policy-model';

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-fork-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

function spawnTrue(): Promise<number> {
  return new Promise((resolve, reject) => {
    const child = spawn('/bin/sh', ['-c', 'exit 3'], { stdio: 'ignore' });
    child.on('error', reject);
    child.on('exit', (code) => resolve(code ?? -1));
  });
}

test('model calls and child processes interleave without deadlock', async () => {
  // Wide enough that every matrix product goes through OpenBLAS's threaded path.
  const config = { model_type: 'qwen3', vocab_size: 512, hidden_size: 256, intermediate_size: 768, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, max_position_embeddings: 512, tie_word_embeddings: true };
  await initModel({ config, out: path.join(dir, 'm'), seed: 1 });
  const model = await PolicyModel.load(path.join(dir, 'm'), { threads: 0 });
  try {
    const tokens = Int32Array.from({ length: 256 }, (_, i) => (i * 37) % 512);
    let stop = false;
    let calls = 0;
    const computing = (async () => {
      while (!stop) {
        await model.logprobs([tokens]);
        calls++;
      }
    })();
    const codes: number[] = [];
    for (let i = 0; i < 150; i++) codes.push(await spawnTrue());
    stop = true;
    await computing;
    expect(codes.every((c) => c === 3)).toBe(true);
    expect(calls).toBeGreaterThan(0);
  } finally {
    model.dispose();
  }
}, 120_000);
