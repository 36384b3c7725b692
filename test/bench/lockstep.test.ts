// bench/lockstep.ts: runs of one seed take turns one step at a time, start
// only when all are ready, go on alone when the others are done, and stop
// with an error when another fails. The runs here are async loops in one
// process sharing the directory (the bench's are processes); each records
// the steps it holds, so any overlap or wrong order shows in the log.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { Lockstep } from '../../bench/lockstep';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function run(dir: string, index: number, count: number, steps: number, log: string[], held: { now: number }, startDelay = 0, failAt = -1): Promise<void> {
  await sleep(startDelay);
  const ls = new Lockstep({ dir, index, count });
  try {
    for (let s = 1; s <= steps; s++) {
      await ls.begin();
      if (s === failAt) throw new Error(`run ${index} failed at step ${s}`);
      held.now++;
      log.push(`${index}:${s}:${held.now}`);
      await sleep(3);
      held.now--;
      ls.end();
    }
    await ls.finish();
  } catch (e) {
    ls.fail();
    throw e;
  }
}

describe('Lockstep', () => {
  let dir: string;
  beforeEach(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-lockstep-'));
  });
  afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

  it('alternates steps in index order, one at a time, after every run is ready; a run with more steps goes on alone', async () => {
    const log: string[] = [];
    const held = { now: 0 };
    // Run 0 is ready late: run 1 must not start before it, and run 0 takes the first turn.
    await Promise.all([run(dir, 0, 2, 3, log, held, 60), run(dir, 1, 2, 5, log, held)]);
    expect(log).toEqual(['0:1:1', '1:1:1', '0:2:1', '1:2:1', '0:3:1', '1:3:1', '1:4:1', '1:5:1']);
  });

  it('takes three runs in turn', async () => {
    const log: string[] = [];
    const held = { now: 0 };
    await Promise.all([0, 1, 2].map((i) => run(dir, i, 3, 2, log, held)));
    expect(log.map((l) => l.split(':').slice(0, 2).join(':'))).toEqual(['0:1', '1:1', '2:1', '0:2', '1:2', '2:2']);
    expect(log.every((l) => l.endsWith(':1'))).toBe(true);
  });

  it('stops a waiting run with an error when another fails', async () => {
    const log: string[] = [];
    const held = { now: 0 };
    const results = await Promise.allSettled([run(dir, 0, 2, 4, log, held, 0, 2), run(dir, 1, 2, 4, log, held)]);
    expect(results[0]).toMatchObject({ status: 'rejected', reason: expect.objectContaining({ message: 'run 0 failed at step 2' }) });
    expect(results[1]).toMatchObject({ status: 'rejected', reason: expect.objectContaining({ message: expect.stringMatching(/^lockstep: run 0 of .* failed while run 1 waited/) }) });
    expect(log).toEqual(['0:1:1', '1:1:1']);
  });

  it('rejects a bad index', () => {
    expect(() => new Lockstep({ dir, index: 2, count: 2 })).toThrow('lockstep: index 2 of count 2');
  });
});
