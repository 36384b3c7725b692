// Data-parallel training over PyTorch's c10d (issue 16): the one seam between
// the trainers and the process group. A `Dist` is this process's place in the
// run: one process (no group; every collective is the identity) or one rank
// of a Gloo group met at MASTER_ADDR:MASTER_PORT (lib/train/launch.ts reads
// the launcher's environment). The trainers ask it for their shard of each
// batch, for sums and gathers over ranks, and run rank-0-only work through
// it; the model's train steps sum their gradients through the same group
// (PolicyModel.setProcessGroup).
//
// Every collective is issued one at a time, in the same order on every rank.
// A rank that dies or hangs makes the others fail within the timeout with an
// error that names it (native/torch/dist.cc numbers the collectives in the
// store); rank 0 hosts the store, so its death is named as such.
import { ArpoError } from '../errors';
import { loadNative } from '../native/loader';
import type { NativeGroupInstance } from '../native/types';
import type { PolicyModel } from '../model/policy-model';
import type { LaunchEnv } from './launch';

export class Dist {
  private tail: Promise<unknown> = Promise.resolve();
  /** Wall time spent in this object's collectives so far (waiting for the slowest rank included), ms. */
  commMs = 0;

  private constructor(
    readonly rank: number,
    readonly world: number,
    readonly localWorld: number,
    private native: NativeGroupInstance | null,
  ) {}

  /** One process: no group. */
  static single(): Dist {
    return new Dist(0, 1, 1, null);
  }

  /** Joins the group the launch describes (a world of 1: no group). Blocks until every rank has joined, or fails after `timeoutMs`. */
  static async open(env: LaunchEnv, timeoutMs: number): Promise<Dist> {
    if (env.world <= 1) return new Dist(0, 1, 1, null);
    const addon = loadNative();
    if (!addon.NativeGroup) throw new ArpoError('NATIVE_NOT_BUILT', `rank ${env.rank}: a world of ${env.world} ranks needs the addon built with libtorch (npm run build:native)`);
    if (!addon.hasGloo) {
      throw new ArpoError('NATIVE_NOT_BUILT', `rank ${env.rank}: a world of ${env.world} ranks needs c10d's Gloo backend, which this build lacks: apt-get install libgloo-dev (scripts/install-deps.sh does) and rebuild (npm run build:native)`);
    }
    const g = new addon.NativeGroup();
    try {
      await g.init({ rank: env.rank, world: env.world, masterAddr: env.masterAddr, masterPort: env.masterPort, timeoutMs });
    } catch (e) {
      throw distError(e);
    }
    return new Dist(env.rank, env.world, env.localWorld, g);
  }

  /** Runs `fn` as this launch's rank (joining the group first) and leaves the group after it, whatever happens. */
  static async run<T>(env: LaunchEnv, timeoutMs: number, fn: (dist: Dist) => Promise<T>): Promise<T> {
    const dist = await Dist.open(env, timeoutMs);
    try {
      return await fn(dist);
    } finally {
      dist.close();
    }
  }

  get isRoot(): boolean {
    return this.rank === 0;
  }

  get distributed(): boolean {
    return this.native !== null;
  }

  /** This rank's prompts of a batch of n: a contiguous block, the first n mod world ranks one longer. */
  shard(n: number): { lo: number; hi: number } {
    return shardRange(n, this.rank, this.world);
  }

  /** Elementwise sums over ranks. */
  allreduceSum(values: Float64Array): Promise<Float64Array> {
    const g = this.native;
    if (!g) return Promise.resolve(Float64Array.from(values));
    return this.serial(() => g.allreduceSum(values));
  }

  /** Rank `root`'s values on every rank. */
  broadcast(values: Float64Array, root = 0): Promise<Float64Array> {
    const g = this.native;
    if (!g) return Promise.resolve(Float64Array.from(values));
    return this.serial(() => g.broadcast(values, root));
  }

  barrier(): Promise<void> {
    const g = this.native;
    if (!g) return Promise.resolve();
    return this.serial(() => g.barrier());
  }

  /** Every rank's JSON value, in rank order (two allreduces: the byte lengths, then the bytes). */
  async allgather<T>(value: T): Promise<T[]> {
    if (!this.native) return [value];
    const bytes = Buffer.from(JSON.stringify(value) ?? 'null', 'utf8');
    const lengths = new Float64Array(this.world);
    lengths[this.rank] = bytes.length;
    const all = await this.allreduceSum(lengths);
    let offset = 0;
    for (let r = 0; r < this.rank; r++) offset += all[r]!;
    const total = all.reduce((a, b) => a + b, 0);
    const buf = new Float64Array(total);
    for (let i = 0; i < bytes.length; i++) buf[offset + i] = bytes[i]!;
    const got = await this.allreduceSum(buf);
    const out: T[] = [];
    let at = 0;
    for (let r = 0; r < this.world; r++) {
      const n = all[r]!;
      out.push(JSON.parse(Buffer.from(Array.from(got.subarray(at, at + n))).toString('utf8')) as T);
      at += n;
    }
    return out;
  }

  /**
   * Rank 0 runs `fn` first (it writes what the others then read: the run
   * directory, the search index), then the others; a failure on rank 0 stops
   * every rank at once (the others with an error pointing at rank 0's output)
   * instead of leaving them to time out.
   */
  async rootFirst<T>(fn: () => Promise<T> | T): Promise<T> {
    if (!this.native) return fn();
    let result: T | undefined;
    let error: unknown = null;
    if (this.isRoot) {
      try {
        result = await fn();
      } catch (e) {
        error = e;
      }
    }
    const failed = await this.allreduceSum(Float64Array.of(error === null ? 0 : 1));
    if (error !== null) throw error;
    if (failed[0]! > 0) throw new ArpoError('DIST_FAILED', `rank ${this.rank}: rank 0 failed while setting up the run (its own error is in its output)`);
    if (this.isRoot) return result as T;
    return fn();
  }

  /** Train steps of `model` become data-parallel over this group, from rank 0's weights. */
  async attach(model: PolicyModel): Promise<void> {
    if (!this.native) return;
    model.setProcessGroup({ world: this.world, native: this.native });
    await model.broadcastParameters(0);
  }

  close(): void {
    this.native?.close();
    this.native = null;
  }

  private serial<R>(fn: () => Promise<R>): Promise<R> {
    const run = this.tail.then(async () => {
      const t0 = performance.now();
      try {
        return await fn();
      } catch (e) {
        throw distError(e);
      } finally {
        this.commMs += performance.now() - t0;
      }
    });
    this.tail = run.catch(() => undefined);
    return run;
  }
}

/** Rank `rank`'s block [lo, hi) of n items: contiguous, sizes differing by at most one. */
export function shardRange(n: number, rank: number, world: number): { lo: number; hi: number } {
  const base = Math.floor(n / world);
  const extra = n % world;
  const lo = rank * base + Math.min(rank, extra);
  return { lo, hi: lo + base + (rank < extra ? 1 : 0) };
}

function distError(e: unknown): ArpoError {
  if (e instanceof ArpoError) return e;
  return new ArpoError('DIST_FAILED', e instanceof Error ? e.message : String(e));
}
