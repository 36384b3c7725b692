// The launch environment of a data-parallel run: torchrun's and Slurm's
// variables, the single-process default, and every half-set launch an error
// naming the variable and its value.
import * as os from 'os';
import { modelDevice, modelThreads, readLaunchEnv, threadsPerRank } from '../../lib/train/launch';

describe('readLaunchEnv', () => {
  test('nothing set: one process', () => {
    expect(readLaunchEnv({})).toEqual({ rank: 0, world: 1, localRank: 0, localWorld: 1, masterAddr: '127.0.0.1', masterPort: 29500, source: 'single' });
  });

  test('torchrun: 2 nodes x 2 ranks, this one the second rank of the second node', () => {
    const env = { RANK: '3', WORLD_SIZE: '4', LOCAL_RANK: '1', LOCAL_WORLD_SIZE: '2', MASTER_ADDR: 'node0.cluster', MASTER_PORT: '29501' };
    expect(readLaunchEnv(env)).toEqual({ rank: 3, world: 4, localRank: 1, localWorld: 2, masterAddr: 'node0.cluster', masterPort: 29501, source: 'torchrun' });
  });

  test('srun: SLURM_* with the master exported by the job script; torchrun variables win when both are set', () => {
    const slurm = { SLURM_PROCID: '5', SLURM_NTASKS: '8', SLURM_LOCALID: '1', SLURM_NTASKS_PER_NODE: '4(x2)', MASTER_ADDR: '10.0.0.7', MASTER_PORT: '29500' };
    expect(readLaunchEnv(slurm)).toEqual({ rank: 5, world: 8, localRank: 1, localWorld: 4, masterAddr: '10.0.0.7', masterPort: 29500, source: 'slurm' });
    expect(readLaunchEnv({ ...slurm, RANK: '0', WORLD_SIZE: '2' }).source).toBe('torchrun');
    // A one-task Slurm allocation is a single process.
    expect(readLaunchEnv({ SLURM_PROCID: '0', SLURM_NTASKS: '1' }).source).toBe('single');
  });

  test('half a launch is an error naming the variable and the value', () => {
    const base = { MASTER_ADDR: '127.0.0.1', MASTER_PORT: '29500' };
    expect(() => readLaunchEnv({ ...base, RANK: '0' })).toThrow('launch: WORLD_SIZE=null: RANK is set, so WORLD_SIZE must be too');
    expect(() => readLaunchEnv({ ...base, WORLD_SIZE: '2' })).toThrow('launch: RANK=null: WORLD_SIZE is set, so RANK must be too');
    expect(() => readLaunchEnv({ ...base, RANK: '2', WORLD_SIZE: '2' })).toThrow('launch: RANK="2": expected an integer in [0, 1]');
    expect(() => readLaunchEnv({ ...base, RANK: '0', WORLD_SIZE: 'two' })).toThrow('launch: WORLD_SIZE="two": expected an integer in [1, ');
    expect(() => readLaunchEnv({ ...base, RANK: '-1', WORLD_SIZE: '2' })).toThrow('launch: RANK="-1"');
    expect(() => readLaunchEnv({ RANK: '0', WORLD_SIZE: '2', MASTER_PORT: '29500' })).toThrow('launch: MASTER_ADDR=null: a world of 2 ranks needs the address of rank 0');
    expect(() => readLaunchEnv({ RANK: '0', WORLD_SIZE: '2', MASTER_ADDR: 'h' })).toThrow('launch: MASTER_PORT=null');
    expect(() => readLaunchEnv({ ...base, MASTER_PORT: '70000', RANK: '0', WORLD_SIZE: '2' })).toThrow('launch: MASTER_PORT="70000": expected an integer in [1, 65535]');
    expect(() => readLaunchEnv({ ...base, RANK: '0', WORLD_SIZE: '2', LOCAL_WORLD_SIZE: '3' })).toThrow('launch: LOCAL_WORLD_SIZE="3": expected an integer in [1, 2]');
    expect(() => readLaunchEnv({ ...base, MASTER_ADDR: 'a b', RANK: '0', WORLD_SIZE: '2' })).toThrow('launch: MASTER_ADDR="a b": expected a host name or an IP address');
    expect(() => readLaunchEnv({ ...base, SLURM_PROCID: '0', SLURM_NTASKS: '2', SLURM_NTASKS_PER_NODE: 'x' })).toThrow('launch: SLURM_NTASKS_PER_NODE="x"');
  });

  test('local rank defaults to rank modulo the ranks per node; threads are the cores shared by them', () => {
    expect(readLaunchEnv({ RANK: '3', WORLD_SIZE: '4', LOCAL_WORLD_SIZE: '2', MASTER_ADDR: 'h', MASTER_PORT: '1' }).localRank).toBe(1);
    expect(threadsPerRank(16, 2)).toBe(8);
    expect(threadsPerRank(2, 2)).toBe(1);
    expect(threadsPerRank(3, 8)).toBe(1);
    expect(threadsPerRank(7, 2)).toBe(3);
  });

  test('model threads: model.threads when set, else a rank\'s share of the cores in a multi-rank run, else 0 (all cores)', () => {
    const two = readLaunchEnv({ RANK: '1', WORLD_SIZE: '2', LOCAL_WORLD_SIZE: '2', MASTER_ADDR: 'h', MASTER_PORT: '29500' });
    expect(modelThreads(3, two)).toBe(3);
    expect(modelThreads(0, two)).toBe(threadsPerRank(os.cpus().length, 2));
    expect(modelThreads(0, readLaunchEnv({}))).toBe(0);
  });

  test('model device: a bare cuda is each rank\'s own GPU in a multi-rank run; cpu and cuda:N stay as written', () => {
    const second = readLaunchEnv({ RANK: '3', WORLD_SIZE: '4', LOCAL_WORLD_SIZE: '2', MASTER_ADDR: 'h', MASTER_PORT: '1' });
    expect(modelDevice('cuda', second)).toBe('cuda:1');
    expect(modelDevice('cuda:0', second)).toBe('cuda:0');
    expect(modelDevice('cpu', second)).toBe('cpu');
    expect(modelDevice('cuda', readLaunchEnv({}))).toBe('cuda');
  });
});
