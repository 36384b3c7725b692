// ARPO attribution on packed rollout trees: soft attribution equals GRPO's
// per-token gradient weights on the flattened trajectories, hard gives shared
// tokens the mean advantage of their leaves; checked against float64 loops.
import { attributeTreeAdvantages, computeAdvantages, nativeTreeKernels, treeAdvantages, type PackedTreeArrays, type TreeKernels } from '../../lib/algo';
import type { PackedTrees } from '../../lib/rollout/tree';
import { mulberry32 as rng } from '../../lib/random';

// What lib/rollout's packTrees produces must be accepted as is (checked by `tsc --noEmit`).
export const rolloutPackingFits = (packed: PackedTrees): PackedTreeArrays => packed;


/** The kernel contract (kernels.h section 5) as a plain float64 loop: walk each leaf up to its root. */
const loopKernels: TreeKernels = {
  treeReduce(parent, leafNode, leafAdv) {
    const sum = new Float64Array(parent.length);
    const count = new Int32Array(parent.length);
    leafNode.forEach((node, l) => {
      for (let n = node; n >= 0; n = parent[n] as number) {
        sum[n] = (sum[n] as number) + (leafAdv[l] as number);
        count[n] = (count[n] as number) + 1;
      }
    });
    return { nodeSum: Float32Array.from(sum), nodeMean: Float32Array.from(sum, (s, n) => ((count[n] as number) > 0 ? s / (count[n] as number) : 0)), nodeCount: count };
  },
  treeExpand(tokenValue, nodeValue, tokenOffset, tokenCount) {
    for (let n = 0; n < nodeValue.length; n++) {
      for (let i = 0; i < (tokenCount[n] as number); i++) tokenValue[(tokenOffset[n] as number) + i] = nodeValue[n] as number;
    }
  },
};

/** The native kernels when the addon loads and has them, else null (the loop then stands in, and the agreement test is skipped). */
function tryNative(): TreeKernels | null {
  try {
    const k = nativeTreeKernels();
    k.treeReduce(Int32Array.of(-1), Int32Array.of(0), Float32Array.of(1));
    return k;
  } catch {
    return null;
  }
}
const native = tryNative();
const kernels = native ?? loopKernels;
const nativeTest = native ? test : test.skip;

interface RandomForest {
  trees: PackedTreeArrays;
  P: number;
  /** Packed token indices of each leaf's trajectory, root to leaf. */
  trajectories: number[][];
  tree: number[];
}

/** Several prompt trees: a root, then segments forking from random earlier non-leaf segments (like ARPO branching). */
function randomForest(seed: number): RandomForest {
  const r = rng(seed);
  const parent: number[] = [];
  const offset: number[] = [];
  const count: number[] = [];
  const nodeTree: number[] = [];
  let P = 0;
  const nTrees = 1 + Math.floor(r() * 4);
  for (let t = 0; t < nTrees; t++) {
    const base = parent.length;
    const nNodes = 1 + Math.floor(r() * 12);
    for (let k = 0; k < nNodes; k++) {
      parent.push(k === 0 ? -1 : base + Math.floor(r() * k));
      if (r() < 0.2) P += 1; // a gap token no node owns
      const c = k === 0 ? 3 : Math.floor(r() * 5); // some segments are empty
      offset.push(P);
      count.push(c);
      nodeTree.push(t);
      P += c;
    }
  }
  const hasChild = new Set(parent.filter((p) => p >= 0));
  const leafNode = parent.map((_, n) => n).filter((n) => !hasChild.has(n));
  const trajectories = leafNode.map((node) => {
    const path: number[] = [];
    for (let n = node; n >= 0; n = parent[n] as number) path.unshift(n);
    return path.flatMap((n) => Array.from({ length: count[n] as number }, (_, i) => (offset[n] as number) + i));
  });
  return {
    trees: { parent: Int32Array.from(parent), tokenOffset: Int32Array.from(offset), tokenCount: Int32Array.from(count), leafNode: Int32Array.from(leafNode), tokens: { length: P } },
    P,
    trajectories,
    tree: leafNode.map((n) => nodeTree[n] as number),
  };
}

/** GRPO per trajectory (verl loop: unbiased std, ε = 1e-6, a group of one: mean 0, std 1). */
function grpoLoop(rewards: number[], groups: number[]): number[] {
  return rewards.map((x, i) => {
    const g = rewards.filter((_, j) => groups[j] === groups[i]);
    if (g.length === 1) return x / (1 + 1e-6);
    const m = g.reduce((s, y) => s + y, 0) / g.length;
    const sd = Math.sqrt(g.reduce((s, y) => s + (y - m) ** 2, 0) / (g.length - 1));
    return (x - m) / (sd + 1e-6);
  });
}

function expectClose(got: Float32Array, want: number[], what: string): void {
  const bad: string[] = [];
  want.forEach((w, i) => {
    const g = got[i] as number;
    if (!(Math.abs(g - w) <= 1e-5 + 1e-5 * Math.abs(w))) bad.push(`${what}[${i}] got ${g} want ${w}`);
  });
  expect(bad.slice(0, 5)).toEqual([]);
}

describe('ARPO tree attribution', () => {
  const seeds = Array.from({ length: 30 }, (_, i) => 77 + i);

  test.each(seeds)('seed %i: soft = GRPO gradient weights on the flattened trajectories; hard = their mean', (seed) => {
    const f = randomForest(seed);
    const r = rng(seed * 31);
    const rewards = f.trajectories.map(() => (r() < 0.3 ? -1 : Math.round(r() * 10) / 10));
    const adv = grpoLoop(rewards, f.tree);
    // Flattened GRPO: trajectory i contributes Â_i to each of its tokens; sum per packed token.
    const weight = new Array<number>(f.P).fill(0);
    const sharers = new Array<number>(f.P).fill(0);
    f.trajectories.forEach((tokens, i) =>
      tokens.forEach((p) => {
        weight[p] = (weight[p] as number) + (adv[i] as number);
        sharers[p] = (sharers[p] as number) + 1;
      }),
    );
    const soft = treeAdvantages(f.trees, rewards, { kernels, attribution: 'soft' });
    expectClose(Float32Array.from(soft.leafAdvantages), adv, 'leafAdvantage');
    expectClose(soft.tokenAdvantages, weight, 'soft');
    const hard = treeAdvantages(f.trees, rewards, { kernels, attribution: 'hard' });
    expectClose(hard.tokenAdvantages, weight.map((w, p) => ((sharers[p] as number) > 0 ? w / (sharers[p] as number) : 0)), 'hard');
    // Each node's leaf count is the number of trajectories through it.
    f.trees.parent.forEach((_, n) => {
      const off = f.trees.tokenOffset[n] as number;
      if ((f.trees.tokenCount[n] as number) > 0) expect(hard.nodeLeafCounts[n]).toBe(sharers[off]);
    });
  });

  test('a two-branch tree by hand', () => {
    // prompt(0: 2 tokens) -> shared segment(1: 3 tokens) -> branches 2 (2 tokens), 3 (1 token); rewards 1 and 0.
    const trees: PackedTreeArrays = { parent: Int32Array.of(-1, 0, 1, 1), tokenOffset: Int32Array.of(0, 2, 5, 7), tokenCount: Int32Array.of(2, 3, 2, 1), leafNode: Int32Array.of(2, 3) };
    const a = 0.5 / (Math.SQRT1_2 + 1e-6); // GRPO: mean 0.5, unbiased std sqrt(1/2)
    const soft = treeAdvantages(trees, [1, 0], { kernels });
    expectClose(soft.tokenAdvantages, [0, 0, 0, 0, 0, a, a, -a], 'soft'); // shared tokens: a + (-a) = 0
    const hard = attributeTreeAdvantages(trees, [2, -1], 'hard', kernels);
    expectClose(hard.tokenAdvantages, [0.5, 0.5, 0.5, 0.5, 0.5, 2, 2, -1], 'hard');
    expect(Array.from(hard.nodeLeafCounts)).toEqual([2, 2, 1, 1]);
  });

  test('bad trees and names are reported before any kernel runs', () => {
    const good = { parent: Int32Array.of(-1, 0), tokenOffset: Int32Array.of(0, 1), tokenCount: Int32Array.of(1, 1), leafNode: Int32Array.of(1) };
    expect(() => attributeTreeAdvantages({ ...good, parent: Int32Array.of(-1, 1) }, [1], 'soft', loopKernels)).toThrow('Expected -1 or a node index below 1 for parent[1] but received 1 of type number');
    expect(() => attributeTreeAdvantages({ ...good, leafNode: Int32Array.of(2) }, [1], 'soft', loopKernels)).toThrow(/for leafNode\[0\] but received 2/);
    expect(() => attributeTreeAdvantages({ ...good, tokens: { length: 1 } }, [1], 'soft', loopKernels)).toThrow(/token span inside \[0, 1\) for tokenOffset\[1\]\/tokenCount\[1\]/);
    expect(() => attributeTreeAdvantages(good, [1, 2], 'soft', loopKernels)).toThrow(/an array of 1 leaf advantages/);
    expect(() => attributeTreeAdvantages(good, [1], 'mean' as never, loopKernels)).toThrow('Unknown advantage attribution "mean"; known: hard, soft');
    expect(() => treeAdvantages(good, [1], { estimator: 'ppo', kernels: loopKernels })).toThrow(/Unknown advantage estimator "ppo"/);
  });

  nativeTest('the native kernels agree with the float64 loop', () => {
    for (const seed of [5, 6, 7]) {
      const f = randomForest(seed);
      const adv = f.trajectories.map((_, i) => Math.sin(i + seed));
      for (const mode of ['soft', 'hard'] as const) {
        expectClose(attributeTreeAdvantages(f.trees, adv, mode, native as TreeKernels).tokenAdvantages, Array.from(attributeTreeAdvantages(f.trees, adv, mode, loopKernels).tokenAdvantages), mode);
      }
    }
  });

  test('other estimators flow through: RLOO per tree', () => {
    const f = randomForest(3);
    const rewards = f.trajectories.map((_, i) => (i % 3) / 2);
    const out = treeAdvantages(f.trees, rewards, { estimator: 'rloo', kernels });
    expect(Array.from(out.leafAdvantages)).toEqual(Array.from(computeAdvantages('rloo', { rewards, groups: f.tree.map((t) => t) })));
  });
});
