// The python sandbox never weakens silently: full isolation or an error that
// says what is missing (unless basic is accepted explicitly, and then it says
// so). The refusal is tested for real in two environments made here: a root
// process without capabilities or user namespaces (a container without
// privileges) and an unprivileged account created for the test.
import { spawnSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { ArpoError } from '../../lib/errors';
import { validateConfig } from '../../lib/train/config';
import { detectIsolation, fullIsolationProblem, isolationError, PythonSandbox, type Isolation } from '../../lib/tools';
import { demoIsolation } from '../../lib/envs';

const ROOT = path.resolve(__dirname, '..', '..');
const isRoot = process.getuid?.() === 0;

// What the child reports: the default (full) sandbox or its error, the explicit
// basic sandbox, the demo's choice, and a direct probe of what it may unshare.
const CHILD = `
require(${JSON.stringify(path.join(ROOT, 'node_modules', 'ts-node', 'register', 'transpile-only'))});
const { spawnSync } = require('child_process');
const { PythonSandbox } = require(${JSON.stringify(path.join(ROOT, 'lib', 'tools', 'python.ts'))});
const { demoIsolation } = require(${JSON.stringify(path.join(ROOT, 'lib', 'envs', 'demo', 'tools.ts'))});
(async () => {
  const out = { uid: process.getuid() };
  const code = 'import os\\nprint(os.getuid(), " ".join(open("/proc/self/uid_map").read().split()))';
  try {
    const s = new PythonSandbox({ timeoutMs: 5000 });
    out.full = { summary: s.isolation.summary, stdout: (await s.run(code)).stdout.trim() };
  } catch (e) {
    out.fullError = { name: e.name, code: e.code, message: e.message };
  }
  const b = new PythonSandbox({ isolation: 'basic', timeoutMs: 5000 });
  out.basic = { summary: b.isolation.summary, stdout: (await b.run(code)).stdout.trim() };
  const warnings = [];
  out.demo = { level: demoIsolation((l) => warnings.push(l)), warnings };
  const ok = (args) => spawnSync('unshare', args, { stdio: 'ignore' }).status === 0;
  out.probe = { net: ok(['--net', 'true']), userns: ok(['--user', '--map-root-user', '--net', '--mount', '--pid', '--fork', 'true']) };
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(3); });
`;

interface ChildReport {
  uid: number;
  full?: { summary: string; stdout: string };
  fullError?: { name: string; code: string; message: string };
  basic: { summary: string; stdout: string };
  demo: { level: string; warnings: string[] };
  probe: { net: boolean; userns: boolean };
}

function runChild(prefix: string[]): ChildReport {
  const r = spawnSync(prefix[0] as string, [...prefix.slice(1), process.execPath, '-e', CHILD], {
    cwd: ROOT, encoding: 'utf8', timeout: 120000, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: os.tmpdir(), TMPDIR: os.tmpdir() },
  });
  if (r.status !== 0) throw new Error(`child failed (status ${r.status}): ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop() as string) as ChildReport;
}

function ok(cmd: string, args: string[]): boolean {
  return spawnSync(cmd, args, { stdio: 'ignore', timeout: 10000 }).status === 0;
}

test('a bad isolation value is an error naming the option and the value', () => {
  expect(() => new PythonSandbox({ isolation: 'auto' as never })).toThrow('Expected "full" or "basic" for isolation but received "auto" of type string');
  expect(() => validateConfig({ tools: { python: { isolation: 'none' } } })).toThrow(/tools\.python\.isolation/);
  expect(validateConfig({}).tools.python.isolation).toBe('full');
  expect(validateConfig({ tools: { python: { isolation: 'basic' } } }).tools.python.isolation).toBe('basic');
});

test('the refusal says what is missing, how to fix it and how to accept less', () => {
  const weak: Isolation = {
    level: 'basic', missing: ['network, mount and pid namespaces (`unshare --user` failed: Operation not permitted)'], network: 'socket-blocked', user: 'unchanged',
    filesystem: 'temp-dir', processes: 'process-group', limits: 'prlimit', unshareFlags: [], summary: 'isolation=basic network=socket-blocked user=unchanged fs=temp-dir processes=process-group limits=prlimit',
  };
  const user = isolationError(weak, false);
  expect(user).toBeInstanceOf(ArpoError);
  expect(user.code).toBe('SANDBOX_UNAVAILABLE');
  expect(user.message).toContain('missing network, mount and pid namespaces (`unshare --user` failed: Operation not permitted)');
  expect(user.message).toContain('kernel.apparmor_restrict_unprivileged_userns=0');
  expect(user.message).toContain('tools.python.isolation: basic');
  expect(user.message).toContain('network=socket-blocked user=unchanged fs=temp-dir processes=process-group limits=prlimit with isolation=basic');
  expect(isolationError(weak, true).message).toContain('--cap-add SYS_ADMIN');
});

test('on this machine: the default is full isolation exactly when the namespaces work, and the demo follows', () => {
  const iso = detectIsolation();
  // Independent probe: can this process make the namespaces a run uses?
  const nsOk = ok('unshare', [...(isRoot ? [] : ['--user', '--map-root-user']), '--net', '--mount', '--pid', '--fork', '/bin/sh', '-c', 'mount -t tmpfs tmpfs /tmp']);
  expect(iso.network === 'namespace').toBe(nsOk);
  expect(iso.level === 'full').toBe(nsOk && (!isRoot || iso.user === 'uid'));
  expect(fullIsolationProblem() === null).toBe(iso.level === 'full');
  if (iso.level === 'full') {
    expect(new PythonSandbox().isolation.summary).toMatch(/^isolation=full network=namespace /);
  } else {
    expect(() => new PythonSandbox()).toThrow(/full isolation is not available here/);
  }
  expect(new PythonSandbox({ isolation: 'basic' }).isolation.summary).toMatch(/^isolation=basic network=socket-blocked /);
  const lines: string[] = [];
  expect(demoIsolation((l) => lines.push(l))).toBe(iso.level);
  expect(lines.length).toBe(iso.level === 'full' ? 0 : 1);
});

// Root without capabilities, in a user namespace whose own user-namespace limit is 0:
// what a container without privileges gives.
const noCapsReason = !isRoot ? 'needs root to build the environment' : !ok('unshare', ['--user', '--map-root-user', 'true']) ? 'user namespaces unavailable here' : '';
(noCapsReason ? test.skip : test)(`a root process without privileges refuses full and runs basic when asked${noCapsReason ? ` (skipped: ${noCapsReason})` : ''}`, () => {
  const r = runChild(['unshare', '--user', '--map-root-user', '/bin/sh', '-c', 'echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --inh-caps=-all --bounding-set=-all "$@"', 'sh']);
  expect(r.uid).toBe(0);
  expect(r.probe).toEqual({ net: false, userns: false }); // the environment really lacks the namespaces
  expect(r.full).toBeUndefined();
  expect(r.fullError?.code).toBe('SANDBOX_UNAVAILABLE');
  expect(r.fullError?.message).toContain('missing network, mount and pid namespaces');
  expect(r.fullError?.message).toContain('the switch to the sandbox uid 62000');
  expect(r.fullError?.message).toContain('--cap-add SYS_ADMIN');
  expect(r.fullError?.message).toContain('tools.python.isolation: basic');
  expect(r.basic.summary).toBe('isolation=basic network=socket-blocked user=unchanged fs=temp-dir processes=process-group limits=prlimit');
  expect(r.basic.stdout.split(' ')[0]).toBe('0');
  expect(r.demo.level).toBe('basic');
  expect(r.demo.warnings).toHaveLength(1);
  expect(r.demo.warnings[0]).toMatch(/^\[demo\] warning: the demo runs python with basic isolation \(arpo train would refuse\): python sandbox: full isolation is not available here/);
});

describe('as an unprivileged account created for the test', () => {
  const name = `arpo-sbx-${process.pid}`;
  const reason = !isRoot ? 'needs root to create the account' : !fs.existsSync('/usr/sbin/useradd') ? 'useradd not installed' : '';
  let uid = -1;
  let gid = -1;
  beforeAll(() => {
    if (reason) return;
    const r = spawnSync('useradd', ['--system', '--no-create-home', '--shell', '/usr/sbin/nologin', name], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`useradd ${name}: ${r.stderr}`);
    uid = Number(spawnSync('id', ['-u', name], { encoding: 'utf8' }).stdout.trim());
    gid = Number(spawnSync('id', ['-g', name], { encoding: 'utf8' }).stdout.trim());
  });
  afterAll(() => {
    if (!reason) spawnSync('userdel', [name]);
  });
  (reason ? test.skip : test)(`full isolation through a user namespace, or a refusal that says how to enable one${reason ? ` (skipped: ${reason})` : ''}`, () => {
    const asUser = ['setpriv', `--reuid=${uid}`, `--regid=${gid}`, '--clear-groups', '--'];
    // Independent probe: may this account make the namespaces (and mount a tmpfs in them)?
    const userNs = ok('setpriv', [...asUser, 'unshare', '--user', '--map-root-user', '--net', '--mount', '--pid', '--fork', '/bin/sh', '-c', 'mount -t tmpfs tmpfs /tmp']);
    const r = runChild(asUser);
    expect(r.uid).toBe(uid);
    expect(r.probe.userns).toBe(userNs);
    if (userNs) {
      expect(r.fullError).toBeUndefined();
      expect(r.full?.summary).toBe('isolation=full network=namespace user=unchanged fs=private-tmpfs processes=pid-namespace limits=prlimit');
      // Root inside its namespace, which maps to the unprivileged account outside.
      expect(r.full?.stdout).toBe(`0 0 ${uid} 1`);
      expect(r.demo).toEqual({ level: 'full', warnings: [] });
    } else {
      expect(r.fullError?.code).toBe('SANDBOX_UNAVAILABLE');
      expect(r.fullError?.message).toContain('enable unprivileged user namespaces');
      expect(r.demo.level).toBe('basic');
    }
    expect(r.basic.summary).toBe('isolation=basic network=socket-blocked user=unchanged fs=temp-dir processes=process-group limits=prlimit');
    expect(r.basic.stdout.split(' ')[0]).toBe(String(uid));
  });
});
