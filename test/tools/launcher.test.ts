// The sandbox launcher (lib/tools/launcher.ts): processes started by a helper
// with their stdio connected back over Unix sockets, exit statuses, group
// kills, a stranger's connection, a bad command, and a helper that dies.
import * as fs from 'fs';
import * as net from 'net';
import * as os from 'os';
import * as path from 'path';
import { SandboxLauncher, type LaunchedChild } from '../../lib/tools/launcher';
import { alive, groupOf, pids, procFile, stat } from './proc';

const PY = '/usr/bin/python3';
const ENV = { PATH: '/usr/bin:/bin', LANG: 'C.UTF-8' };

function collect(child: LaunchedChild): { out: () => string; err: () => string; exit: Promise<[number | null, string | null]>; closed: Promise<unknown> } {
  let out = '';
  let err = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr.on('data', (c: Buffer) => (err += c.toString()));
  const exit = new Promise<[number | null, string | null]>((resolve, reject) => {
    child.once('exit', (code: number | null, signal: string | null) => resolve([code, signal]));
    child.once('error', reject);
  });
  const closed = Promise.all([new Promise((r) => child.stdout.once('close', r)), new Promise((r) => child.stderr.once('close', r))]);
  return { out: () => out, err: () => err, exit, closed };
}


describe('SandboxLauncher', () => {
  const launcher = new SandboxLauncher(PY);
  afterAll(() => launcher.close());

  test('stdin, stdout and stderr reach the process; its exit status comes back; it leads its own session', async () => {
    const child = launcher.spawn(PY, ['-c', 'import os, sys\ndata = sys.stdin.read()\nprint(data.upper())\nprint("e", file=sys.stderr)\nprint(os.getsid(0) == os.getpid())\nsys.exit(5)'], { env: ENV, cwd: '/' });
    const c = collect(child);
    child.stdin.end('hello\nworld');
    expect(await c.exit).toEqual([5, null]);
    await c.closed;
    expect(c.out()).toBe('HELLO\nWORLD\nTrue\n');
    expect(c.err()).toBe('e\n');
    expect(child.pid).toBeGreaterThan(0);
  });

  test('many at once, large output in order; cwd and env are the ones given', async () => {
    const children = Array.from({ length: 8 }, (_, i) => {
      const child = launcher.spawn(PY, ['-c', `import os, sys\nsys.stdout.write(os.getcwd() + os.environ["X"] + "${i}" * 300000)`], { env: { ...ENV, X: `x${i}` }, cwd: '/tmp' });
      child.stdin.end();
      return collect(child);
    });
    for (const [i, c] of children.entries()) {
      expect(await c.exit).toEqual([0, null]);
      await c.closed;
      expect(c.out()).toBe(`/tmpx${i}${String(i).repeat(300000)}`);
    }
  });

  test('killGroup reaches the whole group (children too), also when called before the pid is known', async () => {
    const child = launcher.spawn('/bin/sh', ['-c', 'sleep 987651 & sleep 987650'], { env: ENV, cwd: '/' });
    const c = collect(child);
    child.killGroup(); // before the helper has even started it
    expect((await c.exit)[1]).toBe('SIGKILL');
    const other = launcher.spawn('/bin/sh', ['-c', 'echo up; sleep 987649 & sleep 987648'], { env: ENV, cwd: '/' });
    const o = collect(other);
    other.stdin.end();
    while (!o.out().includes('up')) await new Promise((r) => setTimeout(r, 10));
    other.killGroup();
    expect((await o.exit)[1]).toBe('SIGKILL');
    // The sleeps were SIGKILLed with it; on a busy machine they may take a moment to go.
    const sleeps = (): number[] => pids().filter((p) => procFile(p, 'cmdline')?.includes('sleep\u000098765'));
    for (let i = 0; i < 200 && sleeps().length > 0; i++) await new Promise((r) => setTimeout(r, 10));
    expect(sleeps()).toEqual([]);
  });

  // The nice value of a process (field 19 of /proc/<pid>/stat).
  const niceOf = (pid: number): number => Number(stat(pid)?.[16]);
  const ifRoot = process.getuid?.() === 0 ? test : test.skip;

  ifRoot('nice: the whole group runs at it until renice(), which returns it to the helper\'s priority; others start at that priority', async () => {
    const spawned: ReturnType<typeof launcher.spawn>[] = [];
    const spawn = (...a: Parameters<typeof launcher.spawn>): ReturnType<typeof launcher.spawn> => {
      const c = launcher.spawn(...a);
      spawned.push(c);
      return c;
    };
    try {
      const base = os.getPriority();
      const child = spawn('/bin/sh', ['-c', 'sleep 987640 & echo up; sleep 987641'], { env: ENV, cwd: '/', nice: 19 });
      const c = collect(child);
      child.stdin.end();
      while (!c.out().includes('up')) await new Promise((r) => setTimeout(r, 10));
      // The second sleep is forked after the echo: wait for it (on a busy machine that takes a while).
      let group = groupOf(child.pid!);
      for (let i = 0; i < 500 && group.length < 3; i++) {
        await new Promise((r) => setTimeout(r, 10));
        group = groupOf(child.pid!);
      }
      expect(group.length).toBe(3); // sh and its two sleeps
      expect(group.map(niceOf)).toEqual([19, 19, 19]);
      const plain = spawn('/bin/sh', ['-c', 'echo up; sleep 987642'], { env: ENV, cwd: '/' });
      const p = collect(plain);
      plain.stdin.end();
      while (!p.out().includes('up')) await new Promise((r) => setTimeout(r, 10));
      expect(niceOf(plain.pid!)).toBe(base);
      child.renice();
      const until = async (want: number): Promise<void> => {
        for (let i = 0; i < 200 && !group.every((q) => niceOf(q) === want); i++) await new Promise((r) => setTimeout(r, 10));
      };
      await until(base);
      expect(group.map(niceOf)).toEqual([base, base, base]);
      child.renice(7);
      await until(7);
      expect(group.map(niceOf)).toEqual([7, 7, 7]);
      // A renice right after the spawn, before the helper has even read its request, still lands.
      const early = spawn('/bin/sh', ['-c', 'echo up; sleep 987643'], { env: ENV, cwd: '/', nice: 19 });
      early.renice();
      const e = collect(early);
      early.stdin.end();
      while (!e.out().includes('up')) await new Promise((r) => setTimeout(r, 10));
      for (let i = 0; i < 200 && niceOf(early.pid!) !== base; i++) await new Promise((r) => setTimeout(r, 10));
      expect(niceOf(early.pid!)).toBe(base);
      child.killGroup();
      plain.killGroup();
      early.killGroup();
      await Promise.all([c.exit, p.exit, e.exit]);
      child.renice(); // after its exit: nothing to do, no error
    } finally {
      for (const c of spawned) if (!c.exited) c.killGroup(); // a failed check leaves no sleeps for close() to wait on
    }
  });

  test('a nice value outside 1..19 is refused, naming it', () => {
    for (const bad of [0, 20, -5, 2.5, Number.NaN]) {
      expect(() => launcher.spawn('/bin/true', [], { env: ENV, cwd: '/', nice: bad })).toThrow(/an integer in 1\.\.19 for nice/);
    }
  });

  test('a command that cannot start is an error naming why', async () => {
    const child = launcher.spawn('/nonexistent/binary', [], { env: ENV, cwd: '/' });
    const c = collect(child);
    await expect(c.exit).rejects.toThrow(/sandbox launcher: FileNotFoundError: .*\/nonexistent\/binary/);
    expect(child.exited).toBe(true);
  });

  test('a connection without a pending token is dropped and changes nothing', async () => {
    const child = launcher.spawn(PY, ['-c', 'import time; time.sleep(0.3); print("ok")'], { env: ENV, cwd: '/' });
    const c = collect(child);
    child.stdin.end();
    const dir = fs.readdirSync(os.tmpdir()).filter((d) => d.startsWith('arpo-launch-')).map((d) => path.join(os.tmpdir(), d, 's')).filter((p) => fs.existsSync(p));
    expect(dir.length).toBeGreaterThan(0);
    for (const sock of dir) {
      const closed = await new Promise<boolean>((resolve) => {
        const s = net.connect(sock, () => s.write('0123456789abcdef0123456789abcdef 1\nspoofed output\n'));
        s.on('close', () => resolve(true));
        s.on('error', () => resolve(true));
      });
      expect(closed).toBe(true);
    }
    expect(await c.exit).toEqual([0, null]);
    await c.closed;
    expect(c.out()).toBe('ok\n');
  });

  test('a helper that dies: its running processes are killed and reported, and the next spawn starts a new helper', async () => {
    const own = new SandboxLauncher(PY);
    const child = own.spawn('/bin/sh', ['-c', 'echo up; sleep 987647'], { env: ENV, cwd: '/' });
    const c = collect(child);
    child.stdin.end();
    while (!c.out().includes('up')) await new Promise((r) => setTimeout(r, 10));
    const helperPid = (own as unknown as { helper: { pid: number } }).helper.pid;
    process.kill(helperPid, 'SIGKILL');
    expect(await c.exit).toEqual([null, 'SIGKILL']);
    await new Promise((r) => setTimeout(r, 100));
    expect(alive(child.pid as number)).toBe(false);
    const next = own.spawn(PY, ['-c', 'print(7)'], { env: ENV, cwd: '/' });
    const n = collect(next);
    next.stdin.end();
    expect(await n.exit).toEqual([0, null]);
    await n.closed;
    expect(n.out()).toBe('7\n');
    await own.close();
    expect(alive(helperPid)).toBe(false);
  });
});
