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

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-fork-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

// The scenario runs in a child process: a deadlocked fork() blocks the whole
// event loop, so the parent (whose loop is free) enforces the time limit.
const CHILD = `
const { spawn } = require('child_process');
const { PolicyModel } = require('./lib/model/policy-model');
const spawnExit3 = () => new Promise((resolve, reject) => {
  const c = spawn('/bin/sh', ['-c', 'exit 3'], { stdio: 'ignore' });
  c.on('error', reject);
  c.on('exit', (code) => resolve(code));
});
(async () => {
  const model = await PolicyModel.load(process.argv[1], { threads: 0 });
  const tokens = Int32Array.from({ length: 256 }, (_, i) => (i * 37) % 512);
  let stop = false, calls = 0;
  const computing = (async () => { while (!stop) { await model.logprobs([tokens]); calls++; } })();
  const codes = [];
  for (let i = 0; i < 150; i++) codes.push(await spawnExit3());
  stop = true;
  await computing;
  model.dispose();
  console.log(JSON.stringify({ calls, allExit3: codes.every((c) => c === 3) }));
})().catch((e) => { console.error(e); process.exit(1); });
`;

test('model calls and child processes interleave without deadlock', async () => {
  // Wide enough that every matrix product goes through OpenBLAS's threaded path.
  const config = { model_type: 'qwen3', vocab_size: 512, hidden_size: 256, intermediate_size: 768, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, max_position_embeddings: 512, tie_word_embeddings: true };
  await initModel({ config, out: path.join(dir, 'm'), seed: 1 });
  const root = path.resolve(__dirname, '..', '..');
  const child = spawn(process.execPath, ['-r', 'ts-node/register/transpile-only', '-e', CHILD, path.join(dir, 'm')], {
    cwd: root,
    env: { ...process.env, TS_NODE_COMPILER_OPTIONS: JSON.stringify({ module: 'commonjs', moduleResolution: 'node' }) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  const result = await new Promise<{ code: number | null; timedOut: boolean }>((resolve) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      resolve({ code: null, timedOut: true });
    }, 90_000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, timedOut: false });
    });
  });
  expect({ ...result, stderr: stderr.slice(-500) }).toEqual({ code: 0, timedOut: false, stderr: '' });
  const r = JSON.parse(stdout.trim().split('\n').pop() as string) as { calls: number; allExit3: boolean };
  expect(r.allExit3).toBe(true);
  expect(r.calls).toBeGreaterThan(0);
}, 120_000);
