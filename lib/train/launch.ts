// Where this process sits in a data-parallel run (issue 16), from the
// environment the standard launchers set: torchrun / a Kubernetes PyTorchJob
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
// or Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
// SLURM_NTASKS_PER_NODE, with MASTER_ADDR / MASTER_PORT set by the job
// script). Nothing set: one process. Half a launch (a rank without a world
// size, a rank outside the world) is an error naming the variable and value.
import { spawn, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as net from 'net';
import * as os from 'os';
import * as path from 'path';
import { ArpoError } from '../errors';

export interface LaunchEnv {
  rank: number;
  world: number;
  localRank: number;
  localWorld: number;
  masterAddr: string;
  masterPort: number;
  /** Which launcher's variables were read. */
  source: 'single' | 'torchrun' | 'slurm';
}

type Env = Readonly<Record<string, string | undefined>>;

function bad(name: string, value: string | undefined, what: string): ArpoError {
  return new ArpoError('BAD_CONFIG', `launch: ${name}=${JSON.stringify(value ?? null)}: ${what}`);
}

function intVar(env: Env, name: string, min: number, max = Number.MAX_SAFE_INTEGER): number {
  const v = env[name];
  if (v === undefined || !/^\s*\d+\s*$/.test(v)) throw bad(name, v, `expected an integer in [${min}, ${max}]`);
  const n = Number(v);
  if (n < min || n > max) throw bad(name, v, `expected an integer in [${min}, ${max}]`);
  return n;
}

/** Slurm's SLURM_NTASKS_PER_NODE may read "4" or "4(x2)"; the first count is this node's. */
function slurmPerNode(env: Env, world: number): number {
  const v = env.SLURM_NTASKS_PER_NODE;
  if (v === undefined) return world;
  const m = /^\s*(\d+)/.exec(v);
  if (!m || Number(m[1]) < 1) throw bad('SLURM_NTASKS_PER_NODE', v, 'expected a task count such as 4 or 4(x2)');
  return Number(m[1]);
}

export function readLaunchEnv(env: Env = process.env): LaunchEnv {
  const torchrun = ['RANK', 'WORLD_SIZE'].some((k) => env[k] !== undefined);
  const slurm = !torchrun && env.SLURM_PROCID !== undefined && env.SLURM_NTASKS !== undefined && Number(env.SLURM_NTASKS) > 1;
  if (!torchrun && !slurm) {
    return { rank: 0, world: 1, localRank: 0, localWorld: 1, masterAddr: env.MASTER_ADDR ?? '127.0.0.1', masterPort: env.MASTER_PORT ? intVar(env, 'MASTER_PORT', 1, 65535) : 29500, source: 'single' };
  }
  const [rankVar, worldVar, localVar] = torchrun ? ['RANK', 'WORLD_SIZE', 'LOCAL_RANK'] : ['SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_LOCALID'];
  if (env[worldVar!] === undefined) throw bad(worldVar!, undefined, `${rankVar} is set, so ${worldVar} must be too`);
  if (env[rankVar!] === undefined) throw bad(rankVar!, undefined, `${worldVar} is set, so ${rankVar} must be too`);
  const world = intVar(env, worldVar!, 1);
  const rank = intVar(env, rankVar!, 0, world - 1);
  const localWorld = torchrun ? (env.LOCAL_WORLD_SIZE !== undefined ? intVar(env, 'LOCAL_WORLD_SIZE', 1, world) : world) : slurmPerNode(env, world);
  const localRank = env[localVar!] !== undefined ? intVar(env, localVar!, 0, localWorld - 1) : rank % localWorld;
  if (world > 1 && env.MASTER_ADDR === undefined) throw bad('MASTER_ADDR', undefined, `a world of ${world} ranks needs the address of rank 0 (torchrun sets it; under Slurm, export it in the job script)`);
  if (world > 1 && env.MASTER_PORT === undefined) throw bad('MASTER_PORT', undefined, `a world of ${world} ranks needs rank 0's port (for example 29500)`);
  const masterAddr = env.MASTER_ADDR ?? '127.0.0.1';
  if (!/^[A-Za-z0-9.:\-[\]]+$/.test(masterAddr)) throw bad('MASTER_ADDR', masterAddr, 'expected a host name or an IP address');
  return { rank, world, localRank, localWorld, masterAddr, masterPort: env.MASTER_PORT !== undefined ? intVar(env, 'MASTER_PORT', 1, 65535) : 29500, source: torchrun ? 'torchrun' : 'slurm' };
}

/** Compute threads for one rank: the machine's cores shared by the ranks on this node (at least 1). */
export function threadsPerRank(cores: number, localWorld: number): number {
  return Math.max(1, Math.floor(cores / Math.max(1, localWorld)));
}

/** The model's threads in this process: model.threads when set (not 0), else, in a multi-rank run, this rank's share of the node's cores (0 = all cores otherwise). */
export function modelThreads(configured: number, launch: LaunchEnv): number {
  return configured === 0 && launch.world > 1 ? threadsPerRank(os.cpus().length, launch.localWorld) : configured;
}

/**
 * The model's device in this process: model.device, except that a bare
 * "cuda" in a multi-rank run means this rank's GPU on its node
 * (cuda:LOCAL_RANK), as torchrun users expect; "cuda:N" is kept as written.
 */
export function modelDevice(configured: string, launch: LaunchEnv): string {
  return configured === 'cuda' && launch.world > 1 ? `cuda:${launch.localRank}` : configured;
}

/** `--nproc N` taken out of a command line (both `--nproc N` and `--nproc=N`). */
export function withoutNproc(args: readonly string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--nproc') i++;
    else if (!args[i]!.startsWith('--nproc=')) out.push(args[i]!);
  }
  return out;
}

/** A TCP port that was free a moment ago on 127.0.0.1 (rank 0's store binds it next). */
async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as { port: number }).port;
      srv.close(() => resolve(port));
    });
  });
}

export interface LocalLaunchOptions {
  /** Where the ranks' lines go (default: this process's stdout / stderr). */
  stdout?: { write(s: string): boolean };
  stderr?: { write(s: string): boolean };
  /** After one rank fails, how long the others get between SIGTERM and SIGKILL (ms). */
  graceMs?: number;
}

/** Children of `node bin/arpo.js <args>` as ranks `ranks` of a world of `world` met at 127.0.0.1:`port` (torchrun's variables), their lines forwarded with a `[rank r] ` prefix (rank 0's stdout unprefixed). */
function spawnRanks(ranks: readonly number[], world: number, port: number, args: readonly string[], out: { write(s: string): boolean }, err: { write(s: string): boolean }): ChildProcess[] {
  const bin = path.resolve(__dirname, '..', '..', 'bin', 'arpo.js');
  const script = fs.existsSync(bin) ? bin : path.resolve(__dirname, '..', '..', '..', 'bin', 'arpo.js');
  const forward = (stream: NodeJS.ReadableStream, sink: { write(s: string): boolean }, prefix: string): void => {
    let pending = '';
    stream.setEncoding('utf8');
    stream.on('data', (d: string) => {
      pending += d;
      const lines = pending.split(/\r?\n|\r/);
      pending = lines.pop() ?? '';
      for (const line of lines) sink.write(`${prefix}${line}\n`);
    });
    stream.on('end', () => {
      if (pending) sink.write(`${prefix}${pending}\n`);
    });
  };
  return ranks.map((r) => {
    const c = spawn(process.execPath, [script, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, RANK: String(r), WORLD_SIZE: String(world), LOCAL_RANK: String(r), LOCAL_WORLD_SIZE: String(world), MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(port) },
    });
    forward(c.stdout!, out, r === 0 ? '' : `[rank ${r}] `);
    forward(c.stderr!, err, `[rank ${r}] `);
    return c;
  });
}

/**
 * Waits for every child; the first to fail (or `stop(reason)` from outside)
 * stops the others (SIGTERM, then SIGKILL after graceMs). Resolves to the
 * first failure, or null when all exited cleanly.
 */
function superviseRanks(children: readonly ChildProcess[], ranks: readonly number[], graceMs: number): { done: Promise<string | null>; stop(reason: string): void } {
  let failure: string | null = null;
  let stopping = false;
  const stopOthers = (): void => {
    if (stopping) return;
    stopping = true;
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGTERM');
    setTimeout(() => {
      for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    }, graceMs).unref();
  };
  const done = Promise.all(
    children.map(
      (c, i) =>
        new Promise<void>((resolve) => {
          const r = ranks[i];
          c.on('error', (e) => {
            failure ??= `rank ${r} could not start: ${e.message}`;
            stopOthers();
            resolve();
          });
          c.on('close', (code, signal) => {
            if (!stopping && (code !== 0 || signal !== null)) {
              failure ??= `rank ${r} ${signal ? `was killed by ${signal}` : `exited with code ${code}`}`;
              stopOthers();
            }
            resolve();
          });
        }),
    ),
  ).then(() => failure);
  return {
    done,
    stop: (reason: string) => {
      failure ??= reason;
      stopOthers();
    },
  };
}

/**
 * `arpo <command> --nproc N`: starts N ranks of this command on this machine
 * (`node bin/arpo.js <args>` with RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, as torchrun
 * would) and forwards their output line by line with a `[rank r] ` prefix
 * (rank 0's stdout unprefixed: the command's result). When a rank fails the
 * others are stopped and the error names it; resolves to the exit code.
 */
export async function launchLocalRanks(nproc: number, args: readonly string[], options: LocalLaunchOptions = {}): Promise<number> {
  if (!Number.isInteger(nproc) || nproc < 1 || nproc > 1024) throw bad('--nproc', String(nproc), 'expected a number of ranks in [1, 1024]');
  if (process.env.RANK !== undefined || process.env.WORLD_SIZE !== undefined) {
    throw bad('--nproc', String(nproc), 'this process is already a rank of a launched run (RANK / WORLD_SIZE are set); drop --nproc or the launcher');
  }
  const err = options.stderr ?? process.stderr;
  const port = await freePort();
  const ranks = Array.from({ length: nproc }, (_, r) => r);
  const children = spawnRanks(ranks, nproc, port, args, options.stdout ?? process.stdout, err);
  const supervised = superviseRanks(children, ranks, options.graceMs ?? 5000);
  const onSignal = (sig: NodeJS.Signals): void => supervised.stop(`stopped by ${sig}`);
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  let failure: string | null;
  try {
    failure = await supervised.done;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
  if (failure) {
    err.write(`arpo: ${failure}; the other ranks were stopped (a resumed run continues from the last checkpoint)\n`);
    return 1;
  }
  return 0;
}

export interface HelperRanks {
  /** This process's place: rank 0 of the world, at the helpers' MASTER_PORT. */
  launch: LaunchEnv;
  /** Resolves when every helper has exited: null, or the first failure ("rank 1 exited with code 1"). */
  done: Promise<string | null>;
  /** Stops the helpers that still run (this process failed). */
  stop(): void;
}

/**
 * Ranks 1..world-1 of a data-parallel stage whose rank 0 is this process
 * (the demo's model stages): `node bin/arpo.js <args>` children with
 * torchrun's variables, their output forwarded with a `[rank r] ` prefix.
 * This process joins the same group with `launch` (Dist.open).
 */
export async function startHelperRanks(world: number, args: readonly string[], options: LocalLaunchOptions = {}): Promise<HelperRanks> {
  if (!Number.isInteger(world) || world < 2 || world > 1024) throw bad('nproc', String(world), 'expected a number of ranks in [2, 1024]');
  const port = await freePort();
  const ranks = Array.from({ length: world - 1 }, (_, i) => i + 1);
  const children = spawnRanks(ranks, world, port, args, options.stdout ?? process.stdout, options.stderr ?? process.stderr);
  const supervised = superviseRanks(children, ranks, options.graceMs ?? 5000);
  return {
    launch: { rank: 0, world, localRank: 0, localWorld: world, masterAddr: '127.0.0.1', masterPort: port, source: 'single' },
    done: supervised.done,
    stop: () => supervised.stop('rank 0 stopped'),
  };
}

/**
 * `fn` as rank 0 of `nproc` local ranks whose others are `arpo <args>`
 * children (startHelperRanks); with nproc 1, `fn` on a one-process launch.
 * A failed helper, or a failure of `fn`, stops the rest; the error names the
 * rank that failed first.
 */
export async function withHelperRanks<T>(nproc: number, args: readonly string[], fn: (launch: LaunchEnv) => Promise<T>, options: LocalLaunchOptions = {}): Promise<T> {
  if (nproc <= 1) return fn(readLaunchEnv({}));
  const helpers = await startHelperRanks(nproc, args, options);
  let result: T;
  try {
    result = await fn(helpers.launch);
  } catch (e) {
    helpers.stop();
    const failure = await helpers.done;
    throw failure ? new ArpoError('DIST_FAILED', `${failure}; rank 0: ${(e as Error).message}`) : e;
  }
  const failure = await helpers.done;
  if (failure) throw new ArpoError('DIST_FAILED', `${failure} after rank 0 finished`);
  return result;
}
