// treeReduce / treeExpand against a naive per-leaf ancestor walk on random
// forests, entropyDelta against direct window means, and argument errors.
import { entropyDelta, treeExpand, treeReduce } from '../../lib/native';
import { expectClose, makeRandom } from './reference';

describe('tree kernels', () => {
  const rng = makeRandom(8);

  test('treeReduce and treeExpand match an ancestor walk on random forests', () => {
    for (let rep = 0; rep < 25; rep++) {
      const N = rng.int(1, 50);
      const parent = Int32Array.from({ length: N }, (_, n) => (n === 0 || rng.uniform() < 0.1 ? -1 : rng.int(0, n - 1)));
      const L = rng.int(0, 30);
      const leafNode = Array.from({ length: L }, () => rng.int(0, N - 1));
      const adv = Array.from({ length: L }, () => rng.normal());
      const sum = new Float64Array(N);
      const count = new Int32Array(N);
      leafNode.forEach((leaf, l) => {
        for (let n = leaf; n >= 0; n = parent[n] as number) {
          sum[n] = (sum[n] as number) + (adv[l] as number);
          count[n] = (count[n] as number) + 1;
        }
      });
      const out = treeReduce(parent, leafNode, adv);
      expectClose('nodeSum', out.nodeSum, sum, 1e-5, 1e-6);
      expectClose('nodeMean', out.nodeMean, Array.from(sum, (s, n) => (count[n] ? s / (count[n] as number) : 0)), 1e-5, 1e-6);
      expect(Array.from(out.nodeCount)).toEqual(Array.from(count));

      const offset: number[] = [];
      const tokenCount: number[] = [];
      let P = 0;
      for (let n = 0; n < N; n++) {
        P += rng.int(0, 2);
        offset.push(P);
        tokenCount.push(rng.int(0, 4));
        P += tokenCount[n] as number;
      }
      const tokens = new Float32Array(P).fill(-7);
      const want = new Float32Array(P).fill(-7);
      for (let n = 0; n < N; n++) want.fill(out.nodeMean[n] as number, offset[n], (offset[n] as number) + (tokenCount[n] as number));
      treeExpand(tokens, out.nodeMean, offset, tokenCount);
      expect(Array.from(tokens)).toEqual(Array.from(want));
    }
  });

  test('entropyDelta: window means over the first k tokens and the change from the baseline segment', () => {
    const ent = Float32Array.from({ length: 50 }, () => rng.uniform());
    const starts = [0, 10, 12, 30, 31, 40];
    const ends = [10, 12, 30, 31, 50, 40];
    const baseline = [0, 0, 0, -1, 3, 3];
    for (const k of [1, 5, 20]) {
      const out = entropyDelta(ent, { starts, ends, baseline }, k);
      const mean = starts.map((s, i) => {
        const n = Math.min(k, (ends[i] as number) - s);
        let sum = 0;
        for (let t = s; t < s + n; t++) sum += ent[t] as number;
        return n > 0 ? sum / n : 0;
      });
      expectClose(`windowMean k=${k}`, out.windowMean, mean, 1e-6, 1e-6);
      expect(Array.from(out.windowCount)).toEqual(starts.map((s, i) => Math.min(k, (ends[i] as number) - s)));
      const b = baseline;
      expectClose('delta', out.delta, mean.map((m, i) => ((b[i] as number) < 0 || b[i] === i ? 0 : m - (mean[b[i] as number] as number))), 1e-6, 1e-6);
    }
    const noBase = entropyDelta(ent, { starts, ends }, 3);
    expect(Array.from(noBase.delta)).toEqual([0, 0, 0, 0, 0, 0]);
  });

  test('argument errors', () => {
    expect(() => treeReduce([-1, 0, 2], [1], [1])).toThrow('Expected -1 or a node index below 2 for parent[2] but received 2 of type number');
    expect(() => treeReduce([-1, 0], [2], [1])).toThrow('Expected an integer in [0, 1] for leafNode[0] but received 2 of type number');
    expect(() => treeReduce([-1, 0], [1], [NaN])).toThrow('Expected a finite number for leafAdvantage[0] but received NaN');
    expect(() => treeExpand(new Float32Array(4), [1, 2], [0, 2], [2, 3])).toThrow('Expected a count <= 2 (the span must end inside the 4 tokens) for tokenCount[1] but received 3 of type number');
    expect(() => treeExpand(new Float32Array(4), [1], [-1], [1])).toThrow('Expected an integer >= 0 for tokenOffset[0] but received -1 of type number');
    const ent = new Float32Array(5);
    expect(() => entropyDelta(ent, { starts: [0], ends: [6] }, 2)).toThrow('Expected an end in [starts[0] = 0, 5] for ends[0] but received 6 of type number');
    expect(() => entropyDelta(ent, { starts: [0], ends: [3] }, 0)).toThrow('Expected an integer in [1, 2147483647] for k but received 0');
    expect(() => entropyDelta(ent, { starts: [0], ends: [3], baseline: [1] }, 2)).toThrow('Expected an integer in [-2147483648, 0] for baseline[0] but received 1');
    expect(treeReduce([], [], []).nodeSum.length).toBe(0);
  });
});
