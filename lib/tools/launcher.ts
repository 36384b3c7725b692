// Starts sandbox processes from a small helper process instead of from this
// one. Node forks the whole calling process to spawn a child: the fork copies
// its page tables, so a spawn blocks the event loop for ~4 ms in a bare Node
// process and ~30 ms in a trainer holding 2 GB (it grows with resident
// memory: a 7B model on CPU would stall every python call for hundreds of
// ms). The helper is a ~10 MB Python process: it receives a command line over
// its stdin, connects three Unix-socket streams back to this process (each
// introduced by a one-time token), starts the command with them as its
// stdin, stdout and stderr in a new session, and reports its pid and, later,
// its exit status. Nothing of the sandboxes' isolation changes: the command
// line (unshare, prlimit, setpriv, the interpreter) is the same as a direct
// spawn's, the socket's folder is private to this user and hidden from the
// sandboxes (their /tmp is their own), and a connection without a pending
// token is dropped.
//
// A request may ask for a lower priority (a nice value): a warm pool's
// sandboxes start niced, so their start-up (~90 ms of CPU each on a slow VM)
// yields to the calls running and to the model's decoding, and a `renice`
// message returns a sandbox's whole process group to the helper's own
// priority when a call takes it. Lowering a nice value back needs root
// (CAP_SYS_NICE); the sandbox asks for it only when it runs as root.
import { spawn, type ChildProcess } from 'child_process';
import * as crypto from 'crypto';
import { EventEmitter } from 'events';
import * as fs from 'fs';
import * as net from 'net';
import * as os from 'os';
import * as path from 'path';
import { PassThrough } from 'stream';
import { ArpoError, invalidArgument } from '../errors';

/** The helper: one request per line on stdin, one JSON event per line on stdout. */
export const LAUNCHER_PY = String.raw`
import json, os, selectors, signal, socket, subprocess, sys

def main():
    path = sys.argv[1]
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    live = {}
    out = sys.stdout
    base_nice = os.getpriority(os.PRIO_PROCESS, 0)

    def send(obj):
        out.write(json.dumps(obj) + '\n')
        out.flush()

    # leader pid -> pidfds of the processes it started that a kill waits for
    watched = {}

    def reap():
        for i, p in list(live.items()):
            if p.pid in watched:
                continue
            rc = p.poll()
            if rc is not None:
                del live[i]
                if rc < 0:
                    try:
                        name = signal.Signals(-rc).name
                    except ValueError:
                        name = 'SIG%d' % -rc
                    send({'id': i, 'exit': None, 'signal': name})
                else:
                    send({'id': i, 'exit': rc, 'signal': None})

    def launch(req):
        socks = []
        try:
            for k in range(3):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                socks.append(s)
                s.connect(path)
                s.sendall(('%s %d\n' % (req['token'], k)).encode())
            p = subprocess.Popen(req['argv'], stdin=socks[0].fileno(), stdout=socks[1].fileno(), stderr=socks[2].fileno(),
                                 env=req['env'], cwd=req['cwd'], start_new_session=True, close_fds=True)
            live[req['id']] = p
            # Niced as a group right after its exec (this helper never runs
            # niced itself, so a starved start cannot hold up the messages of
            # others): what it has forked by now is in the group, and what it
            # forks later inherits the value.
            if req.get('nice') is not None:
                try:
                    os.setpriority(os.PRIO_PGRP, p.pid, req['nice'])
                except OSError:
                    pass
            send({'id': req['id'], 'pid': p.pid})
        except Exception as e:
            send({'id': req['id'], 'error': '%s: %s' % (type(e).__name__, e)})
        finally:
            for s in socks:
                s.close()

    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    buf = b''
    while True:
        for key, _ in sel.select():
            if key.data is not None:
                # A watched init exited.
                sel.unregister(key.fd)
                os.close(key.fd)
                watched[key.data].discard(key.fd)
                if not watched[key.data]:
                    del watched[key.data]
                continue
            if key.fd == wake_r:
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                continue
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return
            buf += chunk
            while b'\n' in buf:
                line, buf = buf.split(b'\n', 1)
                req = json.loads(line)
                if 'kill' in req:
                    # With 'children': the processes the leader started (a pid
                    # namespace's init) are watched through pidfds, opened before
                    # the kill (unreaped children of a live leader: their pids
                    # name them), and the leader's exit is reported once they
                    # have exited too: init exits only after the kernel has
                    # killed and reaped every other process of its namespace.
                    if req.get('children') and hasattr(os, 'pidfd_open'):
                        try:
                            with open('/proc/%d/task/%d/children' % (req['kill'], req['kill'])) as f:
                                kids = [int(x) for x in f.read().split()]
                        except (OSError, ValueError):
                            kids = []
                        for c in kids:
                            try:
                                fd = os.pidfd_open(c)
                            except OSError:
                                continue
                            watched.setdefault(req['kill'], set()).add(fd)
                            sel.register(fd, selectors.EVENT_READ, req['kill'])
                    try:
                        os.killpg(req['kill'], getattr(signal, req['signal']))
                    except (OSError, AttributeError):
                        pass
                elif 'renice' in req:
                    # Only a process not yet reaped: its group id cannot have been reused.
                    p = live.get(req['renice'])
                    if p is not None and p.poll() is None:
                        try:
                            os.setpriority(os.PRIO_PGRP, p.pid, req.get('nice', base_nice))
                        except OSError:
                            pass
                else:
                    launch(req)
        reap()

main()
`;

/** A nice value the launcher may set: 1..19 (lower ones need privileges the sandbox does not count on). */
function checkNice(nice: number): void {
  if (!(Number.isInteger(nice) && nice >= 1 && nice <= 19)) throw invalidArgument('an integer in 1..19', 'nice', nice);
}

/** A process started by the launcher: the part of ChildProcess the sandbox uses. */
export class LaunchedChild extends EventEmitter {
  pid: number | undefined = undefined;
  readonly stdin = new PassThrough();
  readonly stdout = new PassThrough();
  readonly stderr = new PassThrough();
  /** Set once the process has exited (or failed to start). */
  exited = false;
  private refd = true;
  private readonly sockets: (net.Socket | undefined)[] = [undefined, undefined, undefined];
  private killWhenStarted: { signal: NodeJS.Signals; children: boolean } | null = null;

  constructor(
    readonly spawnfile: string,
    private readonly onRefChange: () => void,
    private readonly sendKill: (pid: number, signal: NodeJS.Signals, children: boolean) => void,
    private readonly sendRenice: (nice: number | undefined) => void,
  ) {
    super();
    // A reader that stops early (destroy) closes the stream's socket too.
    for (const [k, pt] of [[1, this.stdout], [2, this.stderr]] as const) pt.once('close', () => this.sockets[k]?.destroy());
  }

  /** Keeps the event loop alive while referenced (as ChildProcess.ref). */
  ref(): void {
    this.refd = true;
    for (const s of this.sockets) s?.ref();
    this.onRefChange();
  }
  unref(): void {
    this.refd = false;
    for (const s of this.sockets) s?.unref();
    this.onRefChange();
  }
  get referenced(): boolean {
    return this.refd && !this.exited;
  }

  /**
   * SIGKILL (or `signal`) to the process group it leads, sent by the helper
   * (kill(2) on a group that holds a pid namespace took 4-11 ms here while
   * others were being torn down: not on this event loop); deferred until its
   * pid is known.
   */
  killGroup(signal: NodeJS.Signals = 'SIGKILL'): void {
    this.kill(signal, false);
  }

  /**
   * For a leader that holds a pid namespace (`unshare --pid --fork`): SIGKILL
   * to its group, as killGroup, and its exit is reported only once the
   * processes it had started (the namespace's init) have exited too. Init
   * exits after the kernel has killed and reaped every other process of the
   * namespace, those that left the group (setsid) included, so the exit
   * means they are all gone. (The leader itself dies at once, while the
   * namespace's teardown goes on.)
   */
  killNamespace(): void {
    this.kill('SIGKILL', true);
  }

  private kill(signal: NodeJS.Signals, children: boolean): void {
    if (this.pid === undefined) {
      if (!this.exited) this.killWhenStarted = { signal, children };
      return;
    }
    this.sendKill(this.pid, signal, children);
  }

  /**
   * Sets every process of its group to `nice`, or back to the helper's own
   * priority without one (after a niced start); a no-op once it has exited.
   */
  renice(nice?: number): void {
    if (nice !== undefined) checkNice(nice);
    if (!this.exited) this.sendRenice(nice);
  }

  /** @internal One of its three streams connected (0 stdin, 1 stdout, 2 stderr). */
  attach(k: number, socket: net.Socket): void {
    this.sockets[k] = socket;
    if (!this.refd) socket.unref();
    socket.on('error', () => {
      /* the peer may close early (e.g. code that exits without reading its input) */
    });
    if (k === 0) {
      this.stdin.pipe(socket);
      return;
    }
    const pt = k === 1 ? this.stdout : this.stderr;
    socket.on('data', (c: Buffer) => pt.write(c));
    socket.once('close', () => pt.end());
  }

  /** @internal The helper started it. */
  started(pid: number): void {
    this.pid = pid;
    if (this.killWhenStarted) this.kill(this.killWhenStarted.signal, this.killWhenStarted.children);
  }

  /** @internal It ended (exit status from the helper) or never started (error). */
  ended(code: number | null, signal: NodeJS.Signals | null, error?: Error): void {
    if (this.exited) return;
    this.exited = true;
    if (error) {
      for (const s of this.sockets) s?.destroy();
      this.stdout.end();
      this.stderr.end();
      this.emit('error', error);
    } else {
      this.emit('exit', code, signal);
    }
    this.onRefChange();
  }
}

interface Pending {
  child: LaunchedChild;
  /** Streams still to connect. */
  waiting: number;
}

/**
 * One helper process (started on first use) and its socket. `close()` ends
 * the helper; a later `spawn` starts a new one.
 */
export class SandboxLauncher {
  private helper: ChildProcess | null = null;
  private server: net.Server | null = null;
  private dir: string | null = null;
  private ready: Promise<void> | null = null;
  private nextId = 1;
  private readonly byId = new Map<number, LaunchedChild>();
  private readonly byToken = new Map<string, Pending>();
  private readonly tokenOf = new Map<LaunchedChild, string>();
  private lines = '';
  private idleWaiters: (() => void)[] = [];
  /** close() calls in progress (they keep the event loop alive). */
  private closing = 0;

  constructor(private readonly python: string) {}

  /** The helper's pid while it runs. */
  get pid(): number | undefined {
    return this.helper?.pid;
  }

  /**
   * Starts `cmd args` in a new session with its stdio connected to this
   * process; with `nice`, at that nice value (an integer in 1..19) until
   * `renice()` on the child (the caller must be able to lower it back: root).
   */
  spawn(cmd: string, args: readonly string[], options: { env: Record<string, string>; cwd: string; nice?: number }): LaunchedChild {
    const nice = options.nice;
    if (nice !== undefined) checkNice(nice);
    const id = this.nextId++;
    // A renice goes out after this process's own request (the helper may not
    // be up yet, and the request is written a microtask later even when it is).
    let requested: Promise<void> = Promise.resolve();
    const renice = (n: number | undefined): void => void requested.then(() => this.send(n === undefined ? { renice: id } : { renice: id, nice: n }));
    const child = new LaunchedChild(cmd, () => this.updateRefs(), (pid, signal, children) => this.kill(pid, signal, children), renice);
    const token = crypto.randomBytes(16).toString('hex');
    this.byId.set(id, child);
    this.byToken.set(token, { child, waiting: 3 });
    this.tokenOf.set(child, token);
    const request = `${JSON.stringify({ id, token, argv: [cmd, ...args], env: options.env, cwd: options.cwd, ...(nice !== undefined ? { nice } : {}) })}\n`;
    requested = this.start()
      .then(() => {
        if (!this.helper?.stdin?.writable) throw new Error('the launcher is not running');
        this.helper.stdin.write(request);
      })
      .catch((e: unknown) => this.fail(id, e instanceof Error ? e : new Error(String(e))));
    this.updateRefs();
    return child;
  }

  /** A control message to the running helper (dropped when none runs: its processes are gone with it). */
  private send(message: object): void {
    if (this.helper?.stdin?.writable) this.helper.stdin.write(`${JSON.stringify(message)}\n`);
  }

  /**
   * Signals a process group through the helper, or directly when no helper
   * runs; with `children`, the helper reports the leader's exit once the
   * processes it had started have exited too (LaunchedChild.killNamespace).
   */
  kill(pid: number, signal: NodeJS.Signals, children = false): void {
    if (this.helper?.stdin?.writable) {
      this.helper.stdin.write(`${JSON.stringify({ kill: pid, signal, ...(children ? { children } : {}) })}\n`);
      return;
    }
    try {
      process.kill(-pid, signal);
    } catch {
      /* already gone */
    }
  }

  /** Waits until every process it started has exited, then ends the helper. */
  async close(): Promise<void> {
    // Whoever awaits this keeps the event loop alive until the helper is gone.
    this.closing++;
    this.updateRefs();
    try {
      while (this.byId.size > 0) await new Promise<void>((r) => this.idleWaiters.push(r));
      await this.stop();
    } finally {
      this.closing--;
      this.updateRefs();
    }
  }

  private async stop(): Promise<void> {
    const helper = this.helper;
    const server = this.server;
    const dir = this.dir;
    this.helper = null;
    this.server = null;
    this.dir = null;
    this.ready = null;
    if (helper && helper.exitCode === null && helper.signalCode === null) {
      const gone = new Promise((r) => helper.once('exit', r));
      helper.stdin?.end();
      await gone;
    }
    if (server) await new Promise((r) => server.close(r));
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  }

  private start(): Promise<void> {
    if (this.ready) return this.ready;
    this.ready = new Promise<void>((resolve, reject) => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-launch-'));
      fs.chmodSync(dir, 0o700);
      const sock = path.join(dir, 's');
      const server = net.createServer((socket) => this.connection(socket));
      server.on('error', reject);
      server.listen(sock, () => {
        const helper = spawn(this.python, ['-I', '-c', LAUNCHER_PY, sock], { stdio: ['pipe', 'pipe', 'pipe'], env: { PATH: '/usr/local/bin:/usr/bin:/bin', LANG: 'C.UTF-8' } });
        this.helper = helper;
        let stderr = '';
        helper.stderr?.on('data', (c: Buffer) => (stderr = (stderr + c.toString()).slice(-2000)));
        helper.stdout?.on('data', (c: Buffer) => this.events(c));
        helper.stdin?.on('error', () => {
          /* reported by 'exit' */
        });
        helper.once('error', (e) => reject(e));
        helper.once('exit', (code, signal) => this.helperExited(helper, `the sandbox launcher (${this.python}) exited (${signal ?? `code ${code}`})${stderr ? `: ${stderr.trim()}` : ''}`));
        resolve();
      });
      this.server = server;
      this.dir = dir;
    });
    this.updateRefs();
    return this.ready;
  }

  /** A stream connection from the helper: `<token> <k>\n`, then the process's bytes. */
  private connection(socket: net.Socket): void {
    let head = Buffer.alloc(0);
    const onData = (c: Buffer): void => {
      head = Buffer.concat([head, c]);
      const nl = head.indexOf(0x0a);
      if (nl < 0) {
        if (head.length > 64) socket.destroy();
        return;
      }
      socket.off('data', onData);
      socket.pause();
      const [token, k] = head.subarray(0, nl).toString('latin1').split(' ');
      const p = token === undefined ? undefined : this.byToken.get(token);
      const stream = Number(k);
      if (!p || !(stream === 0 || stream === 1 || stream === 2)) {
        socket.destroy();
        return;
      }
      const rest = head.subarray(nl + 1);
      if (rest.length > 0) socket.unshift(rest);
      p.child.attach(stream, socket);
      if (--p.waiting === 0) {
        this.byToken.delete(token as string);
        this.tokenOf.delete(p.child);
      }
      socket.resume();
    };
    socket.on('data', onData);
    socket.on('error', () => socket.destroy());
  }

  private events(chunk: Buffer): void {
    this.lines += chunk.toString('utf8');
    let nl: number;
    while ((nl = this.lines.indexOf('\n')) >= 0) {
      const line = this.lines.slice(0, nl);
      this.lines = this.lines.slice(nl + 1);
      let e: { id: number; pid?: number; exit?: number | null; signal?: NodeJS.Signals | null; error?: string };
      try {
        e = JSON.parse(line) as typeof e;
      } catch {
        continue;
      }
      const child = this.byId.get(e.id);
      if (!child) continue;
      if (typeof e.pid === 'number') child.started(e.pid);
      else if (typeof e.error === 'string') this.fail(e.id, new Error(e.error));
      else if ('exit' in e) {
        this.byId.delete(e.id);
        child.ended(e.exit ?? null, e.signal ?? null);
      }
    }
  }

  private fail(id: number, error: Error): void {
    const child = this.byId.get(id);
    if (!child) return;
    this.byId.delete(id);
    const token = this.tokenOf.get(child);
    if (token) this.byToken.delete(token);
    this.tokenOf.delete(child);
    child.ended(null, null, new ArpoError('TOOL_FAILED', `sandbox launcher: ${error.message}`));
  }

  /** The helper died: its processes' exit can no longer be observed, so they are killed and reported so. */
  private helperExited(helper: ChildProcess, why: string): void {
    if (this.helper === helper) {
      this.helper = null;
      this.ready = null;
      const server = this.server;
      const dir = this.dir;
      this.server = null;
      this.dir = null;
      server?.close();
      if (dir) fs.rmSync(dir, { recursive: true, force: true });
    }
    for (const [id, child] of [...this.byId]) {
      if (child.pid === undefined) this.fail(id, new Error(why));
      else {
        this.byId.delete(id);
        child.killGroup();
        child.ended(null, 'SIGKILL');
      }
    }
  }

  /** The helper and the socket keep the event loop alive only while a referenced process is pending or running. */
  private updateRefs(): void {
    if (this.byId.size === 0 && this.idleWaiters.length > 0) for (const w of this.idleWaiters.splice(0)) w();
    let any = this.closing > 0;
    for (const c of this.byId.values()) if (c.referenced) any = true;
    const handles = [this.helper, this.helper?.stdout, this.helper?.stderr, this.helper?.stdin, this.server] as ({ ref?: () => void; unref?: () => void } | null | undefined)[];
    for (const h of handles) {
      if (any) h?.ref?.();
      else h?.unref?.();
    }
  }
}
