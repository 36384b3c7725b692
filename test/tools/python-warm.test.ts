// Every python sandbox test again, with a warm pool of 2 sandboxes per tool:
// a warm sandbox is as isolated as a cold one and runs exactly one call.
process.env.ARPO_TEST_PYTHON_WARM = '2';
// eslint-disable-next-line @typescript-eslint/no-require-imports
require('./python.test');

import * as fs from 'fs';
import { PythonSandbox } from '../../lib/tools';

describe('the warm pool', () => {
  const UID = 64300; // a range of its own, apart from python.test.ts's
  const mode = ((): 'full' | 'basic' => {
    try {
      return new PythonSandbox({ uid: UID, gid: UID }).isolation.level;
    } catch {
      return 'basic'; // full isolation is not available here (python.test.ts covers the refusal)
    }
  })();
  const alive = (pid: number): boolean => fs.existsSync(`/proc/${pid}`) && !/^State:\s+Z/m.test(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));

  test('every call gets a fresh process: no file, variable or module state survives, and the pool refills', async () => {
    const sb = new PythonSandbox({ uid: UID, gid: UID, isolation: mode, warm: 2 });
    try {
      sb.prewarm();
      await new Promise((r) => setTimeout(r, 1500));
      expect(sb.warmCount).toBe(2);
      const first = await sb.run('import os, sys\nopen("/tmp/mark" if os.path.isdir("/tmp/work") else "mark", "w").write("x")\nsys.modules["json"] = "patched"\nsecret = 7\nprint(os.getpid(), os.getppid())');
      const second = await sb.run('import os, sys\nprint(os.path.exists("/tmp/mark") or os.path.exists("mark"), "secret" in globals(), sys.modules.get("json") == "patched", os.getpid(), os.getppid())');
      expect(first.exitCode).toBe(0);
      const [exists, hasSecret, patched] = second.stdout.trim().split(' ');
      expect([exists, hasSecret, patched]).toEqual(['False', 'False', 'False']);
      await new Promise((r) => setTimeout(r, 1500));
      expect(sb.warmCount).toBe(2);
    } finally {
      await sb.close();
    }
  });

  test('the wall timeout counts from the call, not from the start of the waiting sandbox', async () => {
    const sb = new PythonSandbox({ uid: UID, gid: UID, isolation: mode, warm: 1, timeoutMs: 1500 });
    try {
      sb.prewarm();
      await new Promise((r) => setTimeout(r, 2500)); // waited longer than the timeout
      const r = await sb.run('import time\ntime.sleep(0.5)\nprint("done")');
      expect(r).toMatchObject({ stdout: 'done\n', timedOut: false, exitCode: 0 });
      const slow = await sb.run('import time\ntime.sleep(5)');
      expect(slow.timedOut).toBe(true);
    } finally {
      await sb.close();
    }
  });

  test('a waiting sandbox killed from outside leaves the pool; the call is still served; close() leaves nothing', async () => {
    const sb = new PythonSandbox({ uid: UID, gid: UID, isolation: mode, warm: 2 });
    sb.prewarm();
    await new Promise((r) => setTimeout(r, 1500));
    const [victim] = sb.parkedPids();
    process.kill(-victim!, 'SIGKILL');
    await new Promise((r) => setTimeout(r, 300));
    expect(sb.parkedPids()).not.toContain(victim);
    expect((await sb.run('6 * 7')).stdout).toBe('42\n');
    await new Promise((r) => setTimeout(r, 1500));
    const parked = sb.parkedPids();
    expect(parked.length).toBe(2);
    await sb.close();
    expect(sb.warmCount).toBe(0);
    for (const pid of parked) expect(alive(pid)).toBe(false);
    // After close a call still works, on a sandbox of its own.
    expect((await sb.run('1 + 1')).stdout).toBe('2\n');
    expect(sb.warmCount).toBe(0);
  });

  test('a broken interpreter does not make the pool spawn in a loop', async () => {
    const dir = fs.mkdtempSync('/tmp/arpo-broken-py-');
    const fake = `${dir}/python3`;
    fs.writeFileSync(fake, '#!/bin/sh\nexit 3\n', { mode: 0o755 });
    try {
      const sb = new PythonSandbox({ python: fake, uid: UID, gid: UID, isolation: 'basic', warm: 4 });
      sb.prewarm();
      await new Promise((r) => setTimeout(r, 800));
      expect(sb.warmCount).toBeLessThanOrEqual(1);
      const r = await sb.run('1');
      expect(r.exitCode).toBe(3);
      await sb.close();
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
