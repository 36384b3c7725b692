// Sandboxed Python interpreter for `<python>` calls: each call runs
// `/usr/bin/python3 -I` in a fresh child process with no network, another
// user, an empty environment, resource limits and a private working directory.
import { spawnSync } from 'child_process';
import * as crypto from 'crypto';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { ArpoError, invalidArgument } from '../errors';
import { SandboxLauncher, type LaunchedChild } from './launcher';
import { PYTHON_DRIVER } from './python-driver';
import type { Tool, ToolCallContext, ToolOutput } from './tool';

/**
 * The isolation a sandbox runs with; detected once per process by {@link detectIsolation}.
 * `full` is a network namespace, a private filesystem view, a pid namespace and
 * the rlimits, plus the uid switch when arpo runs as root (a non-root caller is
 * already unprivileged inside its user namespace). Anything less is `basic`.
 */
export interface Isolation {
  /** `full`, or `basic` (the fallback: a Python-level socket guard, a temp dir, a process group, the rlimits). */
  readonly level: 'full' | 'basic';
  /** What full isolation needs and this machine did not give (empty when full). */
  readonly missing: readonly string[];
  /** `namespace`: a new, empty network namespace. `socket-blocked`: socket creation raises (a Python-level guard). */
  readonly network: 'namespace' | 'socket-blocked';
  /** `uid`: the code runs as the sandbox uid. `unchanged`: as the caller (no privilege to switch). */
  readonly user: 'uid' | 'unchanged';
  /** `private-tmpfs`: its own /tmp, /var/tmp, /dev/shm, /run/lock (tmpfs, gone with the call). `temp-dir`: a fresh directory, removed after. */
  readonly filesystem: 'private-tmpfs' | 'temp-dir';
  /** `pid-namespace`: every process dies with the call. `process-group`: the group is killed (a setsid() escapee survives). */
  readonly processes: 'pid-namespace' | 'process-group';
  /** `prlimit` (util-linux) or `ulimit` (sh builtin). */
  readonly limits: 'prlimit' | 'ulimit';
  /** The `unshare` flags that work here, when namespaces are used. */
  readonly unshareFlags: readonly string[];
  /** One line for logs: `isolation=full network=namespace user=uid:65534 …`. */
  readonly summary: string;
}

/** Options of {@link PythonSandbox}; defaults suit one short tool call. */
export interface PythonSandboxOptions {
  /** Interpreter (default `/usr/bin/python3`: Debian's, with numpy and sympy). */
  python?: string;
  /** Wall limit of one run, ms (default 10000); the whole process tree is killed. */
  timeoutMs?: number;
  /** CPU seconds (RLIMIT_CPU; default: the wall limit rounded up, plus 1). */
  cpuSeconds?: number;
  /** Address space bytes (RLIMIT_AS; default 2 GiB). */
  memoryBytes?: number;
  /** Processes and threads of the sandbox user (RLIMIT_NPROC; default 64). */
  maxProcesses?: number;
  /** Largest file the code may write (RLIMIT_FSIZE; default 16 MiB). */
  maxFileBytes?: number;
  /** Size of the private /tmp (default 64 MiB). */
  tmpBytes?: number;
  /** Bytes kept of stdout and of stderr each (default 64 KiB); the rest is drained and counted. */
  maxOutputBytes?: number;
  /**
   * First uid of the sandbox users (default 62000), used when the process may
   * switch user. Each concurrent run takes its own uid from
   * [uid, uid + uidPoolSize): RLIMIT_NPROC counts processes per uid system-wide,
   * so with one shared uid a fork bomb in one call would starve the others.
   */
  uid?: number;
  /** Number of sandbox uids (default 64; more concurrent runs than that share uids). */
  uidPoolSize?: number;
  /** Group of the sandbox processes (default 65534, `nogroup`). */
  gid?: number;
  /** Final expression: `repr` (REPL, default), `print` (the reference: print(value)), `none`. */
  lastExpression?: 'repr' | 'print' | 'none';
  /**
   * `full` (default): full isolation or an error that says what is missing and
   * how to fix it; never a silently weaker sandbox. `basic`: explicitly accept
   * the fallback (no namespaces), which every result's metadata reports.
   */
  isolation?: 'full' | 'basic';
  /**
   * Sandboxes kept started ahead of their calls (default 0: each call starts
   * its own). A warm sandbox is a fresh process, already in its namespaces
   * with its private /tmp mounted, limits and uid applied and the interpreter
   * loaded, waiting for the code on stdin; it runs exactly one call and is
   * replaced in the background. Nothing is shared between calls; the wall
   * timeout starts when the code is handed over (the CPU limit also counts
   * the interpreter's start-up, ~0.03 s). {@link PythonSandbox.close} ends them.
   */
  warm?: number;
}

/** What one run did. */
export interface PythonRun {
  readonly stdout: string;
  readonly stderr: string;
  readonly exitCode: number | null;
  /** Signal that ended the interpreter (e.g. `SIGXCPU`, `SIGKILL`), if any. */
  readonly signal: string | null;
  readonly timedOut: boolean;
  readonly cancelled: boolean;
  /** Bytes of stdout + stderr dropped beyond `maxOutputBytes`. */
  readonly droppedBytes: number;
  readonly ms: number;
  readonly isolation: Isolation;
}

const ROOT_FLAGS = ['--net', '--mount', '--pid', '--fork', '--kill-child', '--mount-proc'];
// Without root: a user namespace maps us to root inside it, which allows the rest.
const USERNS_FLAGS = ['--user', '--map-root-user', ...ROOT_FLAGS];
const SANDBOX_PATH = '/usr/local/bin:/usr/bin:/bin';
/** PythonSandbox's default uid range and group (also what fullIsolationProblem probes, so its detection is the sandbox's cached one). */
const DEFAULT_UID = 62000;
const DEFAULT_UID_POOL = 64;
const DEFAULT_GID = 65534;
/** What the driver writes to stdout once it waits for its code (ASCII ACK). */
const READY_BYTE = 0x06;
/**
 * The nice value a warm pool's sandboxes start at, where this process may
 * lower it back (root): their start-up (~90 ms of CPU each here, most of it
 * exec and interpreter start) then takes only CPU that the calls running and
 * the model's decoding leave, and a call that takes one returns its whole
 * process group to this process's priority first.
 */
const POOL_NICE = 19;
/** How long a finished run waits for its output pipes to close. */
const PIPE_GRACE_MS = 5000;
/**
 * The longest a returned call's sandbox waits to be killed while other calls
 * run. Its driver idles after the end marks (no thread of the code left, its
 * signals blocked); the kill, and with it the teardown of its processes and
 * namespaces (~4 ms of CPU each on a slow VM), waits for a moment with no
 * call in flight, so a burst's calls do not pay for each other's teardown.
 * Background processes the code started live at most this much longer.
 */
const LINGER_MS = 100;

/** Niced pool starts at a time: one per core, at most 4 (each holds a uid and ~10 MB until its call). */
function maxStarts(): number {
  return Math.max(1, Math.min(4, os.availableParallelism?.() ?? os.cpus().length));
}

function tryRun(cmd: string, args: string[], input?: string): { ok: boolean; out: string; err: string } {
  const r = spawnSync(cmd, args, { input, encoding: 'utf8', timeout: 10000, env: { PATH: SANDBOX_PATH } });
  const err = r.error ? r.error.message : (r.stderr ?? '').trim().split('\n').slice(-2).join(' ');
  return { ok: r.status === 0 && !r.error, out: (r.stdout ?? '').trim(), err };
}

const detected = new Map<string, Isolation>();
/** Sandbox uids taken by runs in flight in this process. */
const uidsInUse = new Set<number>();

/**
 * Probes what this machine allows, strongest first: an unprivileged uid
 * (`setpriv`, needs root), new namespaces (`unshare`: net + mount + pid),
 * `prlimit`. Cached per (python, uid, mode). In `full` mode the result may be
 * short of full (see `missing`); {@link PythonSandbox} refuses such a result
 * with {@link isolationError}. `basic` skips the namespaces.
 */
export function detectIsolation(python = '/usr/bin/python3', uid = DEFAULT_UID, gid = DEFAULT_GID, mode: 'full' | 'basic' = 'full', uidPoolSize = 1): Isolation {
  const key = `${python}|${uid}|${gid}|${mode}|${uidPoolSize}`;
  const hit = detected.get(key);
  if (hit) return hit;
  if (!fs.existsSync(python)) throw new ArpoError('TOOL_FAILED', `Python interpreter ${python} not found; install python3 or pass { python }`);
  const isRoot = process.getuid?.() === 0;
  const setprivArgs = [`--reuid=${uid}`, `--regid=${gid}`, '--clear-groups', '--no-new-privs', '--inh-caps=-all', '--bounding-set=-all'];
  const uidProbe = isRoot ? tryRun('setpriv', [...setprivArgs, python, '-I', '-c', 'import os; print(os.getuid())']) : null;
  const user = uidProbe?.out === String(uid) ? 'uid' : 'unchanged';
  let unshareFlags: string[] = [];
  let nsError = 'not tried (isolation: basic)';
  if (mode === 'full') {
    // The probe does what a run does: mount a tmpfs, then find no network.
    const probe = `mount -t tmpfs -o size=1m tmpfs /tmp && ${python} -I -c "import socket
try:
    socket.create_connection(('192.0.2.1', 9), timeout=1)
except OSError:
    print('isolated')"`;
    for (const flags of isRoot ? [ROOT_FLAGS, USERNS_FLAGS] : [USERNS_FLAGS]) {
      const r = tryRun('unshare', [...flags, '/bin/sh', '-c', probe]);
      if (r.out === 'isolated') {
        unshareFlags = flags;
        break;
      }
      const why = `\`unshare ${flags.join(' ')}\` failed: ${r.err || (r.out ? `printed ${JSON.stringify(r.out)}` : 'no output')}`;
      nsError = flags === ROOT_FLAGS || !isRoot ? why : `${nsError}; ${why}`;
    }
  }
  const limits = tryRun('prlimit', ['--version']).ok ? 'prlimit' : 'ulimit';
  const ns = unshareFlags.length > 0;
  const missing: string[] = [];
  if (!ns) missing.push(`network, mount and pid namespaces (${nsError})`);
  const switched = user === 'uid' && (!ns || unshareFlags === ROOT_FLAGS);
  if (isRoot && !switched) {
    missing.push(user === 'uid' ? 'the uid switch inside the namespaces (only a user namespace worked, which keeps root)' : `the switch to the sandbox uid ${uid} (\`setpriv\` failed: ${uidProbe?.err || 'no output'})`);
  }
  const iso: Isolation = {
    level: mode === 'full' && missing.length === 0 ? 'full' : 'basic',
    missing,
    network: ns ? 'namespace' : 'socket-blocked',
    // Inside a user namespace (non-root caller) the uid cannot be switched.
    user: switched ? 'uid' : 'unchanged',
    filesystem: ns ? 'private-tmpfs' : 'temp-dir',
    processes: ns ? 'pid-namespace' : 'process-group',
    limits,
    unshareFlags,
    summary: '',
  };
  const summary = `isolation=${iso.level} network=${iso.network} user=${iso.user === 'uid' ? (uidPoolSize > 1 ? `uids:${uid}-${uid + uidPoolSize - 1}` : `uid:${uid}`) : 'unchanged'} fs=${iso.filesystem} processes=${iso.processes} limits=${iso.limits}`;
  const done = Object.freeze({ ...iso, missing: Object.freeze([...missing]), summary });
  detected.set(key, done);
  return done;
}

/**
 * The error for a machine that cannot give full isolation: what is missing,
 * how to get it, and how to accept less explicitly.
 */
export function isolationError(iso: Isolation, isRoot = process.getuid?.() === 0): ArpoError {
  const fixes = isRoot
    ? 'give the process CAP_SYS_ADMIN and CAP_SETUID (in a container: docker run --cap-add SYS_ADMIN --security-opt seccomp=unconfined --security-opt apparmor=unconfined, or --privileged)'
    : 'enable unprivileged user namespaces (sysctl -w kernel.unprivileged_userns_clone=1 where that exists, user.max_user_namespaces > 0, and on Ubuntu 24.04 sysctl -w kernel.apparmor_restrict_unprivileged_userns=0), or run arpo as root';
  return new ArpoError(
    'SANDBOX_UNAVAILABLE',
    `python sandbox: full isolation is not available here: missing ${iso.missing.join('; ')}. To fix it, ${fixes}. ` +
      `Or accept weaker isolation explicitly with tools.python.isolation: basic (PythonSandbox option isolation: 'basic'): ${iso.summary.replace(/^isolation=\w+ /, '')} with isolation=basic.`,
  );
}

/** Null when this machine gives full isolation, else the message of {@link isolationError} (for callers that may opt in to basic, like the demo). */
export function fullIsolationProblem(python = '/usr/bin/python3'): string | null {
  const iso = detectIsolation(python, DEFAULT_UID, DEFAULT_GID, 'full', DEFAULT_UID_POOL);
  return iso.missing.length === 0 ? null : isolationError(iso).message;
}

function checkInt(name: string, value: number, min: number): number {
  if (!Number.isInteger(value) || value < min) throw invalidArgument(`an integer >= ${min}`, name, value);
  return value;
}

function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/**
 * Collects up to `max` bytes of a stream and counts the rest (the pipe is
 * always drained, so the child never blocks). With an end mark (the driver
 * writes `\0\x01ARPO<token><3 digits>` once the call's output is complete),
 * the bytes up to the mark are the output and `ended` resolves with the
 * digits; nothing after the mark is kept.
 */
class Capture {
  private readonly chunks: Buffer[] = [];
  private kept = 0;
  dropped = 0;
  private mark: Buffer | null = null;
  /** Bytes that may be the start of the mark, held back until the next chunk says. */
  private held: Buffer = Buffer.alloc(0);
  private done = false;
  private onEnd: (code: number) => void = () => undefined;
  /** The end mark's number (the exit code on stdout); never resolves without a mark. */
  readonly ended = new Promise<number>((r) => (this.onEnd = r));
  constructor(private readonly max: number) {}
  /** Watch for the end mark of a call with this token (32 hex digits). */
  expectMark(token: string): void {
    this.mark = Buffer.from(`\0\x01ARPO${token}`, 'latin1');
  }
  add(chunk: Buffer): void {
    if (this.done) return;
    if (!this.mark) return this.keep(chunk);
    const buf = this.held.length > 0 ? Buffer.concat([this.held, chunk]) : chunk;
    const at = buf.indexOf(this.mark);
    if (at >= 0) {
      if (buf.length < at + this.mark.length + 3) {
        this.held = buf; // the digits are still to come
        return;
      }
      this.keep(buf.subarray(0, at));
      this.done = true;
      this.held = Buffer.alloc(0);
      this.onEnd(Number(buf.subarray(at + this.mark.length, at + this.mark.length + 3).toString('latin1')));
      return;
    }
    // Keep all but a tail that could be the mark's beginning.
    const hold = Math.min(buf.length, this.mark.length + 2);
    this.keep(buf.subarray(0, buf.length - hold));
    this.held = Buffer.from(buf.subarray(buf.length - hold));
  }
  /** The stream closed: held-back bytes were output after all. */
  close(): void {
    if (this.done || this.held.length === 0) return;
    this.keep(this.held);
    this.held = Buffer.alloc(0);
  }
  private keep(chunk: Buffer): void {
    if (chunk.length === 0) return;
    const room = this.max - this.kept;
    if (room > 0) {
      const part = chunk.length <= room ? chunk : chunk.subarray(0, room);
      this.chunks.push(part);
      this.kept += part.length;
    }
    this.dropped += Math.max(0, chunk.length - Math.max(room, 0));
  }
  text(): string {
    // Invalid UTF-8 (binary output) becomes U+FFFD instead of throwing.
    return new TextDecoder('utf-8', { fatal: false }).decode(Buffer.concat(this.chunks));
  }
}

/** A sandbox process, started; its interpreter waits for the code on stdin. */
interface Started {
  readonly child: LaunchedChild;
  readonly uid: number;
  readonly releaseUid: () => void;
  readonly hostDir: string | undefined;
  readonly out: Capture;
  readonly err: Capture;
  /** Both output pipes closed (every holder gone). */
  readonly pipesClosed: Promise<unknown>;
  /** The token of its end marks (sent with the code). */
  readonly token: string;
  /** True once the interpreter says it waits for its code; false if the process ended first. */
  readonly ready: Promise<boolean>;
  /** Started at {@link POOL_NICE}: a call (or its discard) un-nices it first. */
  readonly niced: boolean;
  /** Runs under unshare in a pid namespace of its own: unshare's exit means every process of it is gone. */
  readonly pidNamespace: boolean;
  /** Exit code and signal of the sandbox's first process; [null, null] after a spawn error. */
  readonly exit: Promise<[number | null, NodeJS.Signals | null]>;
  /** The process has exited (or could not be spawned: then spawnError says why). */
  exited: boolean;
  spawnError: Error | undefined;
}

/**
 * SIGKILL to everything a started sandbox runs: its pid namespace's init (the
 * kernel then kills the rest, and unshare's exit comes once all are gone), or
 * its whole process group where it has no pid namespace.
 */
function killTree(s: Started): void {
  if (s.pidNamespace) s.child.killNamespace();
  else s.child.killGroup('SIGKILL');
}

/** Handles of a parked sandbox must not keep the process alive; a taken one's must. */
function setParked(s: Started, parked: boolean): void {
  if (parked) s.child.unref();
  else s.child.ref();
}

/** Runs Python code in a fresh sandboxed process per call. */
export class PythonSandbox {
  readonly python: string;
  readonly timeoutMs: number;
  readonly cpuSeconds: number;
  readonly memoryBytes: number;
  readonly maxProcesses: number;
  readonly maxFileBytes: number;
  readonly tmpBytes: number;
  readonly maxOutputBytes: number;
  readonly uid: number;
  readonly uidPoolSize: number;
  readonly gid: number;
  readonly lastExpression: 'repr' | 'print' | 'none';
  readonly isolation: Isolation;
  readonly warm: number;
  /** This process may lower a nice value again (root): the pool's starts run niced ({@link POOL_NICE}), up to {@link maxStarts} at a time. */
  private readonly niceable = process.getuid?.() === 0;
  /** Started sandboxes waiting for a call (at most `warm`). */
  private readonly pool: Started[] = [];
  private closed = false;
  private refillScheduled = false;
  /** Pool sandboxes starting now (see {@link PythonSandbox.refill}). */
  private starting = 0;
  /** Starts the sandbox processes outside this (possibly large) process: lib/tools/launcher.ts. */
  private readonly launcher: SandboxLauncher;
  /** Calls in flight. */
  private calls = 0;
  /** Killed sandboxes of returned calls, until they are gone. */
  private readonly reaping = new Set<Promise<void>>();
  /** Sandboxes of returned calls not killed yet (see {@link LINGER_MS}). */
  private readonly lingering: Started[] = [];
  private lingerTimer: NodeJS.Timeout | undefined;

  constructor(options: PythonSandboxOptions = {}) {
    this.python = options.python ?? '/usr/bin/python3';
    this.timeoutMs = checkInt('timeoutMs', options.timeoutMs ?? 10000, 1);
    this.cpuSeconds = checkInt('cpuSeconds', options.cpuSeconds ?? Math.ceil(this.timeoutMs / 1000) + 1, 1);
    this.memoryBytes = checkInt('memoryBytes', options.memoryBytes ?? 2 * 1024 ** 3, 64 * 1024 ** 2);
    this.maxProcesses = checkInt('maxProcesses', options.maxProcesses ?? 64, 1);
    this.maxFileBytes = checkInt('maxFileBytes', options.maxFileBytes ?? 16 * 1024 ** 2, 1);
    this.tmpBytes = checkInt('tmpBytes', options.tmpBytes ?? 64 * 1024 ** 2, 1024 ** 2);
    this.maxOutputBytes = checkInt('maxOutputBytes', options.maxOutputBytes ?? 64 * 1024, 1);
    this.uid = checkInt('uid', options.uid ?? DEFAULT_UID, 1);
    this.uidPoolSize = checkInt('uidPoolSize', options.uidPoolSize ?? DEFAULT_UID_POOL, 1);
    this.gid = checkInt('gid', options.gid ?? DEFAULT_GID, 1);
    this.lastExpression = options.lastExpression ?? 'repr';
    this.warm = checkInt('warm', options.warm ?? 0, 0);
    if (!['repr', 'print', 'none'].includes(this.lastExpression)) throw invalidArgument('"repr", "print" or "none"', 'lastExpression', this.lastExpression);
    const mode = options.isolation ?? 'full';
    if (mode !== 'full' && mode !== 'basic') throw invalidArgument('"full" or "basic"', 'isolation', mode);
    const iso = detectIsolation(this.python, this.uid, this.gid, mode, this.uidPoolSize);
    if (mode === 'full' && iso.missing.length > 0) throw isolationError(iso);
    this.isolation = iso;
    // The launcher runs on Debian's interpreter when there is one (the sandbox's may be anything).
    this.launcher = new SandboxLauncher(fs.existsSync('/usr/bin/python3') ? '/usr/bin/python3' : this.python);
  }

  /** `prlimit …` arguments (or a `ulimit` prefix for sh) for the limits. */
  private limitArgs(): string[] {
    return [
      `--as=${this.memoryBytes}`,
      // Soft < hard: the soft limit sends SIGXCPU (reported as a CPU limit); at
      // soft == hard the kernel would send a bare SIGKILL instead.
      `--cpu=${this.cpuSeconds}:${this.cpuSeconds + 1}`,
      `--nproc=${this.maxProcesses}`,
      `--fsize=${this.maxFileBytes}`,
      '--nofile=256',
      '--core=0',
    ];
  }

  private ulimitScript(): string {
    // One limit per ulimit (dash takes no more). -v counts KiB; -f 512-byte
    // blocks (dash, and bash as sh, which is POSIX mode); -t seconds. The
    // process count is -u in bash and -p in dash.
    return [
      `ulimit -t ${this.cpuSeconds + 1}`,
      `ulimit -S -t ${this.cpuSeconds}`,
      `ulimit -v ${Math.floor(this.memoryBytes / 1024)}`,
      `{ ulimit -u ${this.maxProcesses} 2>/dev/null || ulimit -p ${this.maxProcesses}; }`,
      `ulimit -f ${Math.max(1, Math.floor(this.maxFileBytes / 512))}`,
      'ulimit -n 256',
      'ulimit -c 0',
    ].join(' && ');
  }

  /** The interpreter command line, wrapped in limits and the user switch. */
  private interpreter(uid: number): string[] {
    const iso = this.isolation;
    const py = [this.python, '-I', '-c', PYTHON_DRIVER, `--last=${this.lastExpression}`];
    if (iso.network !== 'namespace') py.push('--block-net');
    const user =
      iso.user === 'uid'
        ? ['setpriv', `--reuid=${uid}`, `--regid=${this.gid}`, '--clear-groups', '--no-new-privs', '--inh-caps=-all', '--bounding-set=-all', '--']
        : [];
    if (iso.limits === 'prlimit') return ['prlimit', ...this.limitArgs(), '--', ...user, ...py];
    return ['/bin/sh', '-c', `${this.ulimitScript()} && exec "$@"`, 'sh', ...user, ...py];
  }

  /** Runs `code`; resolves with what happened (never rejects for the code's own failures). */
  async run(code: string, options: { signal?: AbortSignal } = {}): Promise<PythonRun> {
    if (typeof code !== 'string') throw invalidArgument('a string', 'code', code);
    const started = performance.now();
    const sandbox = this.take() ?? this.start(false);
    if (sandbox.niced) sandbox.child.renice();
    setParked(sandbox, false);
    this.calls++;
    this.scheduleRefill();
    try {
      return await this.finish(sandbox, code, started, options);
    } finally {
      this.calls--;
      if (this.calls === 0) {
        this.endLingering();
        this.scheduleRefill();
      }
    }
  }

  /** Sandboxes waiting in the pool now (for tests and the bench). */
  get warmCount(): number {
    return this.pool.length;
  }

  /** The first process of every sandbox waiting in the pool (each leads its own process group). */
  parkedPids(): number[] {
    return this.pool.map((s) => s.child.pid).filter((p): p is number => p !== undefined);
  }

  /** The launcher helper's pid while it runs (for process accounting). */
  launcherPid(): number | undefined {
    return this.launcher.pid;
  }

  /** Fills the warm pool now (otherwise the first call fills it). */
  prewarm(): void {
    this.refill();
  }

  /** Ends the warm sandboxes and the launcher and waits until they are gone; later calls each start their own (no pool). */
  async close(): Promise<void> {
    this.closed = true;
    this.endLingering();
    await Promise.all(this.pool.splice(0).map((s) => this.discard(s)));
    await this.settled();
    await this.launcher.close();
  }

  /** A live warm sandbox, or undefined; dead ones (killed from outside while waiting) are discarded. */
  private take(): Started | undefined {
    for (let s = this.pool.shift(); s !== undefined; s = this.pool.shift()) {
      if (!s.exited) return s;
      void this.discard(s);
    }
    return undefined;
  }

  private scheduleRefill(): void {
    if (this.warm === 0 || this.refillScheduled || this.closed) return;
    this.refillScheduled = true;
    // After this call's code is handed over: its own start comes first.
    setImmediate(() => {
      this.refillScheduled = false;
      this.refill();
    });
  }

  /**
   * Starts replacements, each next one once a previous says it is ready, and
   * while calls run only when no warm sandbox is left: a start costs about as
   * much CPU as a cold call, and a burst's refills would take that CPU from
   * the burst's own calls. Niced starts (root) go up to {@link maxStarts} at a
   * time, since they take only CPU nothing else wants; others one at a time.
   */
  private refill(): void {
    if (this.closed) return;
    const limit = this.niceable ? maxStarts() : 1;
    while (this.starting < limit && this.pool.length < this.warm) {
      // While calls run and warm sandboxes are left, a start would only take CPU from those calls.
      if (this.calls > 0 && this.pool.length > 0) return;
      this.startOne();
    }
  }

  private startOne(): void {
    const s = this.start(true);
    setParked(s, true);
    this.pool.push(s);
    this.starting++;
    void s.ready.then((up) => {
      this.starting--;
      // One that ended before it was up (a broken interpreter) stops the chain: no spawn loop.
      if (up) this.refill();
    });
    // One that dies while waiting leaves the pool at once.
    void s.exit.then(() => {
      const i = this.pool.indexOf(s);
      if (i >= 0) {
        this.pool.splice(i, 1);
        void this.discard(s);
      }
    });
  }

  /** Cleans up a sandbox that will never run a call. */
  private async discard(s: Started): Promise<void> {
    // Referenced again: the caller waits for its exit, so Node must too.
    setParked(s, false);
    // Its teardown at normal priority (a niced one could starve on a busy machine).
    if (s.niced) s.child.renice();
    killTree(s);
    await s.exit;
    s.child.stdout?.destroy();
    s.child.stderr?.destroy();
    s.child.stdin?.destroy();
    s.releaseUid();
    if (s.hostDir) fs.rmSync(s.hostDir, { recursive: true, force: true });
  }

  /** The first sandbox uid no sandbox of this process holds (shared only when all are taken). */
  private reserveUid(): { uid: number; release: () => void } {
    let uid = this.uid;
    for (let i = 0; i < this.uidPoolSize; i++) {
      if (!uidsInUse.has(this.uid + i)) {
        uid = this.uid + i;
        break;
      }
    }
    const owns = !uidsInUse.has(uid);
    uidsInUse.add(uid);
    let released = false;
    return {
      uid,
      release: () => {
        if (owns && !released) uidsInUse.delete(uid);
        released = true;
      },
    };
  }

  /** Spawns a sandbox: namespaces, private /tmp, limits, uid, then the interpreter, which waits for its code on stdin. */
  private start(forPool: boolean): Started {
    const { uid, release } = this.reserveUid();
    const iso = this.isolation;
    const env: Record<string, string> = {
      // Nothing of the caller's environment: no secrets, no PYTHONPATH.
      PATH: SANDBOX_PATH,
      LANG: 'C.UTF-8',
      LC_ALL: 'C.UTF-8',
      OPENBLAS_NUM_THREADS: '1',
      OMP_NUM_THREADS: '1',
      MKL_NUM_THREADS: '1',
      MPLBACKEND: 'Agg',
    };
    let cmd: string;
    let args: string[];
    let hostDir: string | undefined;
    const inner = this.interpreter(uid);
    if (iso.network === 'namespace') {
      // Inside the new namespaces, as (namespace) root: private tmpfs mounts,
      // then the interpreter as a child of sh, which stays PID 1 so that the
      // code is an ordinary process (PID 1 ignores default-action signals such
      // as SIGXCPU). When sh exits the kernel kills everything left in the PID
      // namespace: daemons and double forks die with the call.
      //
      // Every program started here costs a fork and an exec (~4 ms of CPU each
      // on a VM whose process creation is slow, and a warm pool's refills run
      // them while the model decodes): the other tmpfs mounts go through one
      // `mount --all` over a table the script writes (builtins only) into the
      // first tmpfs, followed by a fresh tmpfs over /tmp itself that hides the
      // table; the work folder is made by one `install`. Entries name the
      // source `arpo-sandbox`: mount --all skips an entry whose source is
      // already mounted there (the host's /dev/shm is a `tmpfs`). Where mount
      // has no --fstab (busybox), the mounts go one by one as before.
      const tmpOpts = `size=${this.tmpBytes},mode=1777,nosuid,nodev`;
      const smallOpts = 'size=16m,mode=1777,nosuid,nodev';
      const eachSmallDir = (then: string) => `for d in /var/tmp /dev/shm /run/lock; do if [ -d "$d" ]; then ${then}; fi; done`;
      const workDir = iso.user === 'uid' ? `install -d -m 700 -o ${uid} -g ${this.gid} /tmp/work` : 'mkdir -m 700 /tmp/work';
      const script = [
        'set -e',
        `mount -t tmpfs -o ${tmpOpts} tmpfs /tmp`,
        `{ ${eachSmallDir(`printf 'arpo-sandbox %s tmpfs ${smallOpts} 0 0\\n' "$d"`)}; printf 'arpo-sandbox /tmp tmpfs ${tmpOpts} 0 0\\n'; } > /tmp/.arpo-mounts`,
        `mount --all --fstab /tmp/.arpo-mounts 2>/dev/null || { ${eachSmallDir(`mount -t tmpfs -o ${smallOpts} tmpfs "$d"`)}; mount -t tmpfs -o ${tmpOpts} tmpfs /tmp; }`,
        `${workDir} && cd /tmp/work`,
        'set +e',
        // sh's own notices ("Killed", "CPU time limit exceeded") would read as the
        // code's stderr: sh's stderr goes to /dev/null, and a second sh moves the
        // real stderr (fd 3) back to fd 2 before exec'ing the interpreter (dash
        // applies a command's own redirections in the parent while it waits).
        'exec 3>&2 2>/dev/null',
        `/bin/sh -c 'exec 2>&3 3>&- && exec "$@"' sh ${inner.map(shellQuote).join(' ')}`,
        'status=$?',
        'exit $status',
      ].join('\n');
      cmd = 'unshare';
      args = [...iso.unshareFlags, '--', '/bin/sh', '-c', script];
      env.HOME = '/tmp/work';
    } else {
      hostDir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-python-'));
      if (iso.user === 'uid') fs.chownSync(hostDir, uid, this.gid);
      fs.chmodSync(hostDir, 0o700);
      env.HOME = hostDir;
      [cmd, ...args] = inner as [string, ...string[]];
    }
    // A new session (process group) led by the sandbox: killTree reaches all of it.
    // A pool's start yields to everything else, where it can be un-niced.
    const niced = forPool && this.niceable;
    const child = this.launcher.spawn(cmd, args, { cwd: hostDir ?? '/', env, ...(niced ? { nice: POOL_NICE } : {}) });
    const out = new Capture(this.maxOutputBytes);
    const err = new Capture(this.maxOutputBytes);
    const token = crypto.randomBytes(16).toString('hex');
    out.expectMark(token);
    err.expectMark(token);
    let markReady: (up: boolean) => void = () => undefined;
    const ready = new Promise<boolean>((r) => (markReady = r));
    let first = true;
    child.stdout.on('data', (c: Buffer) => {
      if (first) {
        first = false;
        // The driver's ready byte is not output (anything else before it would be).
        markReady(c[0] === READY_BYTE);
        if (c[0] === READY_BYTE) c = c.subarray(1);
      }
      out.add(c);
    });
    child.stdout.once('close', () => {
      out.close();
      markReady(false);
    });
    child.stderr.on('data', (c: Buffer) => err.add(c));
    child.stderr.once('close', () => err.close());
    // Listening from the start: 'close' may precede 'exit'.
    const pipesClosed = Promise.all([new Promise((r) => child.stdout.once('close', r)), new Promise((r) => child.stderr.once('close', r))]);
    child.stdin.on('error', () => {
      /* the code may exit without reading all of its input */
    });
    const s: Started = {
      child, uid, releaseUid: release, hostDir, out, err, pipesClosed, token, ready, niced, pidNamespace: iso.processes === 'pid-namespace', exited: false, spawnError: undefined,
      exit: new Promise((resolve) => {
        child.once('error', (e) => {
          s.spawnError = e;
          s.exited = true;
          resolve([null, null]);
        });
        child.once('exit', (c, sig) => {
          s.exited = true;
          resolve([c, sig]);
        });
      }),
    };
    return s;
  }

  /** Hands `code` to a started sandbox and collects what happened; `started` is when the call began. */
  private async finish(s: Started, code: string, started: number, options: { signal?: AbortSignal }): Promise<PythonRun> {
    const iso = this.isolation;
    const { child, out, err } = s;
    let timedOut = false;
    let cancelled = false;
    const timer = setTimeout(() => {
      timedOut = true;
      killTree(s);
    }, this.timeoutMs);
    const onAbort = () => {
      cancelled = true;
      killTree(s);
    };
    if (options.signal?.aborted) onAbort();
    else options.signal?.addEventListener('abort', onAbort, { once: true });
    // The first line is the token of the driver's end marks.
    child.stdin?.end(`${s.token}\n${code}`);
    let early = false;
    try {
      // The end marks on both streams: the output is complete, the call is
      // done. Teardown of the process and its namespaces goes on without it.
      const marked = Promise.all([out.ended, err.ended]).then(([c]) => c);
      const first = await Promise.race([s.exit.then(() => null), marked]);
      if (first !== null && !timedOut && !cancelled) {
        early = true;
        this.linger(s);
        this.reap(s);
        return { stdout: out.text(), stderr: err.text(), exitCode: first, signal: null, timedOut, cancelled, droppedBytes: out.dropped + err.dropped, ms: performance.now() - started, isolation: iso };
      }
      const [exitCode, signal] = await s.exit;
      if (s.spawnError) throw s.spawnError;
      // Whatever is left in the group (background children) dies now.
      killTree(s);
      // Pipes close once the last holder is gone (with namespaces, once the
      // kernel has torn the pid namespace down), and only then is all output
      // read: on a loaded machine that took over 500 ms (the load test lost a
      // call's whole stdout at a 500 ms grace). Wait up to 5 s; only an escapee
      // still holding the pipes (basic isolation, setsid) costs that long.
      let grace: NodeJS.Timeout | undefined;
      await Promise.race([s.pipesClosed, new Promise((r) => (grace = setTimeout(r, PIPE_GRACE_MS)))]);
      clearTimeout(grace);
      child.stdout?.destroy();
      child.stderr?.destroy();
      let exit = exitCode;
      let sig: string | null = signal;
      // sh reports a child killed by signal N as exit status 128 + N.
      if (iso.network === 'namespace' && exit !== null && exit > 128 && exit < 128 + 65) {
        sig = os.constants.signals ? (Object.entries(os.constants.signals).find(([, n]) => n === (exit as number) - 128)?.[0] ?? null) : null;
        exit = null;
      }
      return {
        stdout: out.text(),
        stderr: err.text(),
        exitCode: exit,
        signal: sig,
        timedOut,
        cancelled,
        droppedBytes: out.dropped + err.dropped,
        ms: performance.now() - started,
        isolation: iso,
      };
    } catch (e) {
      throw new ArpoError('TOOL_FAILED', `Cannot start the python sandbox (${child.spawnfile}): ${(e as Error).message}`, { cause: e });
    } finally {
      clearTimeout(timer);
      options.signal?.removeEventListener('abort', onAbort);
      if (!early) {
        killTree(s);
        s.releaseUid();
        if (s.hostDir) fs.rmSync(s.hostDir, { recursive: true, force: true });
      }
    }
  }

  /** After an early return: the sandbox is killed once no call runs, or after {@link LINGER_MS}. */
  private linger(s: Started): void {
    this.lingering.push(s);
    if (this.lingerTimer === undefined) {
      this.lingerTimer = setTimeout(() => this.endLingering(), LINGER_MS);
      this.lingerTimer.unref();
    }
  }

  /**
   * Kills every lingering sandbox. (At normal priority: a niced teardown
   * starved on a busy machine past the 5 s pipe grace, and a killed sandbox
   * holds its uid until it is gone.)
   */
  private endLingering(): void {
    clearTimeout(this.lingerTimer);
    this.lingerTimer = undefined;
    for (const s of this.lingering.splice(0)) killTree(s);
  }

  /** After an early return: waits (in the background) for the sandbox to be killed and gone, then frees its uid and folder. */
  private reap(s: Started): void {
    const done = (async () => {
      let grace: NodeJS.Timeout | undefined;
      await Promise.race([Promise.all([s.exit, s.pipesClosed]), new Promise((r) => (grace = setTimeout(r, PIPE_GRACE_MS)))]);
      clearTimeout(grace);
      s.child.stdout?.destroy();
      s.child.stderr?.destroy();
      s.releaseUid();
      if (s.hostDir) fs.rmSync(s.hostDir, { recursive: true, force: true });
    })();
    this.reaping.add(done);
    void done.finally(() => this.reaping.delete(done));
  }

  /**
   * Kills the sandboxes of returned calls now and resolves once every one is
   * gone. A call returns as soon as its output is complete; its sandbox is
   * SIGKILLed when no call runs (or {@link LINGER_MS} later), and the
   * kernel's teardown of the processes and namespaces finishes after.
   */
  async settled(): Promise<void> {
    this.endLingering();
    while (this.reaping.size > 0) await Promise.all([...this.reaping]);
  }
}

/** The text the model reads for a run: output, then the error and why the run ended. */
export function describeRun(run: PythonRun, sandbox: Pick<PythonSandbox, 'timeoutMs' | 'cpuSeconds' | 'memoryBytes' | 'maxFileBytes' | 'maxOutputBytes'>): ToolOutput {
  const parts: string[] = [];
  const stdout = run.stdout.replace(/\s+$/, '');
  const stderr = run.stderr.replace(/\s+$/, '');
  if (stdout) parts.push(stdout);
  if (stderr) parts.push(stderr);
  let ok = run.exitCode === 0 && !run.timedOut && !run.cancelled;
  if (run.timedOut) parts.push(`Error: execution timed out after ${(sandbox.timeoutMs / 1000).toFixed(1)} s; the process was killed.`);
  else if (run.cancelled) parts.push('Error: execution was cancelled.');
  else if (run.signal === 'SIGXCPU') parts.push(`Error: CPU time limit of ${sandbox.cpuSeconds} s exceeded; the process was killed.`);
  else if (run.signal === 'SIGXFSZ') parts.push(`Error: file size limit of ${sandbox.maxFileBytes} bytes exceeded.`);
  else if (run.signal) parts.push(`Error: the process was killed by ${run.signal} (memory, CPU or process limit).`);
  if (run.droppedBytes > 0) parts.push(`[output truncated: ${run.droppedBytes} more bytes; ${sandbox.maxOutputBytes} bytes kept per stream]`);
  if (run.signal) ok = false;
  const text = parts.length ? parts.join('\n') : '(no output)';
  return {
    text,
    ok,
    meta: { isolation: run.isolation.summary, exitCode: run.exitCode, signal: run.signal, timedOut: run.timedOut, sandboxMs: Math.round(run.ms) },
  };
}

/** The `<python>` tool: a {@link PythonSandbox} behind the tag protocol. */
export class PythonTool implements Tool {
  readonly name: string;
  readonly tag: string;
  readonly cacheKey: string;
  readonly sandbox: PythonSandbox;

  constructor(options: PythonSandboxOptions & { tag?: string; name?: string } = {}) {
    this.sandbox = new PythonSandbox(options);
    this.tag = options.tag ?? 'python';
    this.name = options.name ?? 'python';
    const s = this.sandbox;
    this.cacheKey = JSON.stringify([s.python, s.lastExpression, s.timeoutMs, s.memoryBytes, s.maxOutputBytes]);
  }

  async execute(content: string, ctx: ToolCallContext): Promise<ToolOutput> {
    const run = await this.sandbox.run(content, { signal: ctx.signal });
    return describeRun(run, this.sandbox);
  }

  /** Ends the sandbox's warm processes. */
  async close(): Promise<void> {
    await this.sandbox.close();
  }
}
