// Where this process sits in a data-parallel run (issue 16), from the
// environment the standard launchers set: torchrun / a Kubernetes PyTorchJob
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
// or Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
// SLURM_NTASKS_PER_NODE, with MASTER_ADDR / MASTER_PORT set by the job
// script). Nothing set: one process. Half a launch (a rank without a world
// size, a rank outside the world) is an error naming the variable and value.
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
