// Every python sandbox test again, with a warm pool of 2 sandboxes per tool:
// a warm sandbox is as isolated as a cold one and runs exactly one call.
process.env.ARPO_TEST_PYTHON_WARM = '2';
// eslint-disable-next-line @typescript-eslint/no-require-imports
require('./python.test');

import * as fs from 'fs';
import * as os from 'os';
import { PythonSandbox } from '../../lib/tools';
import { alive, groupOf, ofUid, stat } from './proc';

describe('the warm pool', () => {
  const UID = 64300; // a range of its own, apart from python.test.ts's
  const mode = ((): 'full' | 'basic' => {
    try {
      return new PythonSandbox({ uid: UID, gid: UID }).isolation.level;
    } catch {
      return 'basic'; // full isolation is not available here (python.test.ts covers the refusal)
    }
  })();

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

  const statField = (pid: number, i: number): number => Number(stat(pid)?.[i]);
  const ifRoot = process.getuid?.() === 0 && mode === 'full' ? test : test.skip;

  ifRoot('a waiting sandbox is niced (19) as a whole; the call that takes it runs at the caller\'s priority, as a cold one does', async () => {
    const sb = new PythonSandbox({ uid: UID, gid: UID, isolation: mode, warm: 1 });
    const cold = new PythonSandbox({ uid: UID, gid: UID, isolation: mode });
    try {
      sb.prewarm();
      for (let i = 0; i < 300 && sb.parkedPids().length === 0; i++) await new Promise((r) => setTimeout(r, 10));
      await new Promise((r) => setTimeout(r, 1500));
      const [leader] = sb.parkedPids();
      const group = groupOf(leader!);
      expect(group.length).toBeGreaterThanOrEqual(3); // unshare, sh, the interpreter
      expect(group.map((p) => statField(p, 16))).toEqual(group.map(() => 19));
      // (The renice goes through the launcher alongside the code: read it a moment later.)
      const code = 'import os, time\ntime.sleep(0.3)\nos.getpriority(os.PRIO_PROCESS, 0)';
      expect((await sb.run(code)).stdout).toBe(`${os.getPriority()}\n`);
      expect((await cold.run(code)).stdout).toBe(`${os.getPriority()}\n`);
      // A call right after prewarm() takes a sandbox whose start the launcher has not even read yet.
      const fresh = new PythonSandbox({ uid: UID, gid: UID, isolation: mode, warm: 1 });
      fresh.prewarm();
      expect((await fresh.run(code)).stdout).toBe(`${os.getPriority()}\n`);
      await fresh.close();
    } finally {
      await Promise.all([sb.close(), cold.close()]);
    }
  });

  ifRoot('a returned call\'s sandbox is killed once no call runs, or 100 ms later while one does; settled() kills at once', async () => {
    const sb = new PythonSandbox({ uid: UID, gid: UID, isolation: mode });
    try {
      const long = sb.run('import time\ntime.sleep(1.5)\nprint("long")');
      await new Promise((r) => setTimeout(r, 300));
      // The quick call leaves a background process: it lives only as long as its sandbox.
      const quick = await sb.run('import os, subprocess\nsubprocess.Popen(["sleep", "987630"])\nprint(os.getuid())');
      const uid = Number(quick.stdout.trim());
      expect(quick.exitCode).toBe(0);
      // Right after the return the sandbox waits (interpreter and sleep), while the long call runs...
      expect(ofUid(uid).length).toBeGreaterThanOrEqual(2);
      await new Promise((r) => setTimeout(r, 700));
      // ...and is gone within the linger bound, the long call still running.
      expect(ofUid(uid)).toEqual([]);
      expect((await long).stdout).toBe('long\n');
      // With no other call in flight, a sandbox is killed as its call returns.
      const alone = await sb.run('import os, subprocess\nsubprocess.Popen(["sleep", "987631"])\nprint(os.getuid())');
      await sb.settled();
      expect(ofUid(Number(alone.stdout.trim()))).toEqual([]);
      // A call whose code leaves a thread running does not wait: its output is whole, its sandbox goes.
      const threaded = await sb.run('import os, threading, time\nthreading.Thread(target=time.sleep, args=(100,), daemon=True).start()\nprint(os.getuid())');
      expect(threaded.exitCode).toBe(0);
      await sb.settled();
      expect(ofUid(Number(threaded.stdout.trim()))).toEqual([]);
    } finally {
      await sb.close();
    }
  });

  test('a broken interpreter does not make the pool spawn in a loop', async () => {
    const dir = fs.mkdtempSync('/tmp/arpo-broken-py-');
    fs.chmodSync(dir, 0o755);
    const fake = `${dir}/python3`;
    const runs = `${dir}/runs`;
    fs.writeFileSync(runs, '', { mode: 0o666 });
    fs.chmodSync(runs, 0o666);
    fs.writeFileSync(fake, `#!/bin/sh\necho x >> ${runs}\nexit 3\n`, { mode: 0o755 });
    const started = (): number => fs.readFileSync(runs, 'utf8').length / 2;
    try {
      const sb = new PythonSandbox({ python: fake, uid: UID, gid: UID, isolation: 'basic', warm: 4 });
      sb.prewarm();
      // The first starts (up to 4 at a time when niced) fail, and no more follow them.
      for (let i = 0; i < 500 && (sb.warmCount > 0 || started() === 0); i++) await new Promise((r) => setTimeout(r, 10));
      const first = started();
      expect(first).toBeGreaterThanOrEqual(1);
      expect(first).toBeLessThanOrEqual(4);
      await new Promise((r) => setTimeout(r, 500));
      expect(started()).toBe(first);
      expect(sb.warmCount).toBe(0);
      const r = await sb.run('1');
      expect(r.exitCode).toBe(3);
      await sb.close();
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
