// RolloutTree: structure, the three views (trajectories, packed tree, JSON)
// checked against a naive walk, canonical numbering, and argument errors.
import { packTrees, RolloutTree, type Trajectory } from '../../lib/rollout/tree';

const V = 50;
const info = (tag: string) => ({ tag, content: `q-${tag}`, ok: true, cached: false, ms: 3 });

/**
 * prompt [1,2,3]
 *  ├─ g1 (path 0) [10,11] ─ r1 [40,41,42] ─┬─ g2 (path 0) [12,13,14]  leaf (answer)
 *  │                                        └─ g3 (path 2, branch) [15] leaf (eos)
 *  └─ g4 (path 1) [20,21,22,23] leaf (length)
 */
function sample(): { tree: RolloutTree; ids: Record<string, number> } {
  const tree = new RolloutTree(3, [1, 2, 3], V);
  const g1 = tree.addGenerated(0, 0, 'global');
  tree.appendGenerated(g1, 10, -0.5, 1.0, 0.25);
  tree.appendGenerated(g1, 11, -0.25, 0.5, 0.125);
  const g4 = tree.addGenerated(0, 1, 'global');
  for (const t of [20, 21, 22, 23]) tree.appendGenerated(g4, t, -t / 100, t / 10, t / 100);
  const r1 = tree.addToolResult(g1, [40, 41, 42], info('search'), 0);
  const g2 = tree.addGenerated(r1, 0);
  for (const t of [12, 13, 14]) tree.appendGenerated(g2, t, -1, 2, 0.5);
  const g3 = tree.addGenerated(r1, 2, 'branch');
  tree.appendGenerated(g3, 15, -2, 3, 0.75);
  tree.addLeaf(g4, 'length', { path: 1, origin: 'global', stream: 1n, toolCalls: 0 });
  tree.addLeaf(g3, 'eos', { path: 2, origin: 'branch', stream: 2n, toolCalls: 1 });
  tree.addLeaf(g2, 'answer', { path: 0, origin: 'global', stream: 0n, toolCalls: 1 });
  return { tree, ids: { g1, g2, g3, g4, r1 } };
}

describe('RolloutTree structure', () => {
  test('nodes know parent, depth, span, children and the leaves below them', () => {
    const { tree, ids } = sample();
    const r1 = tree.node(ids.r1 as number);
    expect(r1.kind).toBe('tool_result');
    expect(r1.parent).toBe(ids.g1);
    expect(r1.depth).toBe(2);
    expect(r1.start).toBe(5); // 3 prompt + 2 generated
    expect(tree.node(ids.g2 as number).start).toBe(8);
    expect(tree.node(ids.g3 as number).start).toBe(8); // the branch starts exactly at the result's end
    expect(tree.leavesBelow(0).sort()).toEqual([0, 1, 2]);
    expect(tree.leavesBelow(ids.r1 as number).sort()).toEqual([1, 2]);
    expect(tree.leavesBelow(ids.g4 as number)).toEqual([0]);
    expect(tree.totalResponseTokens()).toBe(4 + (2 + 3 + 1) + (2 + 3 + 3));
    expect(tree.uniqueResponseTokens()).toBe(2 + 4 + 3 + 3 + 1);
  });

  test('trajectories equal a naive concatenation along the path, with masks 1 only on sampled tokens', () => {
    const { tree } = sample();
    const byPath = new Map(tree.trajectories().map((t) => [t.path, t]));
    const t0 = byPath.get(0) as Trajectory;
    expect(Array.from(t0.tokens)).toEqual([1, 2, 3, 10, 11, 40, 41, 42, 12, 13, 14]);
    expect(Array.from(t0.lossMask)).toEqual([0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]);
    expect(Array.from(t0.logprobs)).toEqual([0, 0, 0, -0.5, -0.25, 0, 0, 0, -1, -1, -1]);
    expect(t0.finishReason).toBe('answer');
    expect(t0.toolTags).toEqual(['search']);
    const t2 = byPath.get(2) as Trajectory;
    expect(Array.from(t2.tokens)).toEqual([1, 2, 3, 10, 11, 40, 41, 42, 15]);
    expect(Array.from(t2.normEntropies)).toEqual([0, 0, 0, 0.25, 0.125, 0, 0, 0, 0.75]);
    expect(t2.origin).toBe('branch');
    // views share no memory: mutating one leaves the tree and the other views intact
    t0.tokens[3] = 49;
    t0.lossMask[3] = 0;
    const again = tree.trajectories().find((t) => t.path === 0) as Trajectory;
    expect(again.tokens[3]).toBe(10);
    expect(again.lossMask[3]).toBe(1);
    expect((byPath.get(2) as Trajectory).tokens[3]).toBe(10);
    expect(t0.tokens.buffer).not.toBe(t2.tokens.buffer);
  });

  test('packed trees: every node once, parents before children, and unpacking reproduces every trajectory', () => {
    const a = sample().tree;
    const b = new RolloutTree(4, [7, 8], V);
    const g = b.addGenerated(0, 0, 'global');
    b.appendGenerated(g, 9, -0.1, 0.2, 0.3);
    b.addLeaf(g, 'eos', { path: 0, origin: 'global', stream: 5n, toolCalls: 0 });
    const p = packTrees([a, b]);
    expect(p.parent.length).toBe(a.nodeCount + b.nodeCount);
    expect(p.tokens.length).toBe(3 + 13 + 2 + 1);
    for (let n = 0; n < p.parent.length; n++) expect(p.parent[n] as number).toBeLessThan(n);
    expect(Array.from(p.treeNodeOffset)).toEqual([0, a.nodeCount, a.nodeCount + b.nodeCount]);
    expect(Array.from(p.leafTree)).toEqual([0, 0, 0, 1]);
    // Rebuild each leaf's sequence by walking parent links (naive reference) and compare with trajectories().
    const all = [...a.trajectories(), ...b.trajectories()];
    for (let l = 0; l < p.leafNode.length; l++) {
      const chain: number[] = [];
      for (let n = p.leafNode[l] as number; n >= 0; n = p.parent[n] as number) chain.unshift(n);
      const toks: number[] = [];
      const mask: number[] = [];
      const pos: number[] = [];
      for (const n of chain) {
        const off = p.tokenOffset[n] as number;
        for (let i = 0; i < (p.tokenCount[n] as number); i++) {
          toks.push(p.tokens[off + i] as number);
          mask.push(p.lossMask[off + i] as number);
          pos.push(p.positions[off + i] as number);
        }
      }
      const t = all[l] as Trajectory;
      expect(toks).toEqual(Array.from(t.tokens));
      expect(mask).toEqual(Array.from(t.lossMask));
      expect(pos).toEqual(toks.map((_, i) => i));
    }
    expect(Array.from(p.nodeKind.subarray(0, a.nodeCount))).toEqual(a.nodes.map((n) => ({ prompt: 0, generated: 1, tool_result: 2 })[n.kind]));
  });

  test('canonicalize renumbers in preorder by path order and keeps every relation', () => {
    const { tree } = sample();
    const before = tree.trajectories().map((t) => [t.path, Array.from(t.tokens)] as const);
    tree.canonicalize();
    const kinds = tree.nodes.map((n) => `${n.kind}:${n.path}`);
    expect(kinds).toEqual(['prompt:-1', 'generated:0', 'tool_result:0', 'generated:0', 'generated:2', 'generated:1']);
    tree.nodes.forEach((n, i) => {
      expect(n.id).toBe(i);
      if (n.parent >= 0) expect(tree.node(n.parent).children).toContain(i);
    });
    expect(tree.leaves.map((l) => l.path)).toEqual([0, 1, 2]);
    tree.leaves.forEach((l) => expect(tree.node(l.node).leaf).toBe(l.index));
    const after = tree.trajectories().map((t) => [t.path, Array.from(t.tokens)] as const);
    expect(after).toEqual([...before].sort((x, y) => x[0] - y[0]));
  });

  test('JSON dump carries structure, text and no timing unless asked', () => {
    const { tree } = sample();
    tree.canonicalize();
    const text = { encode: () => [], decode: (t: ArrayLike<number>) => Array.from(t).join(',') };
    const j = tree.toJSON({ text });
    const parsed = JSON.parse(JSON.stringify(j)) as typeof j;
    expect(parsed.nodes[2]?.tool).toEqual({ tag: 'search', content: 'q-search', ok: true, cached: false });
    expect(parsed.nodes[2]?.text).toBe('40,41,42');
    expect(parsed.nodes[0]?.leavesBelow).toBe(3);
    expect(parsed.leaves[2]?.stream).toBe('2');
    expect(tree.toJSON({ timing: true }).nodes[2]?.tool?.ms).toBe(3);
  });
});

describe('RolloutTree errors', () => {
  test('bad inputs name the field and the value', () => {
    expect(() => new RolloutTree(0, [], V)).toThrow('Expected a non-empty array of token ids for promptTokens but received Array(0) of type array');
    expect(() => new RolloutTree(0, [1, 99], V)).toThrow('Expected token ids in [0, 50) for promptTokens[1] but received 99 of type number');
    const t = new RolloutTree(0, [1], V);
    expect(() => t.addGenerated(5, 0)).toThrow('Expected a node id in [0, 1) for node but received 5 of type number');
    const g = t.addGenerated(0, 0);
    expect(() => t.addGenerated(g, 0)).toThrow('Expected a prompt or tool-result node for parent but received 1 of type number');
    expect(() => t.appendGenerated(g, 1.5, 0, 0, 0)).toThrow('Expected a token id in [0, 50) for token but received 1.5 of type number');
    expect(() => t.addToolResult(g, [1], info('search'), 0)).toThrow('Expected a non-empty generated node for parent');
    t.appendGenerated(g, 2, 0, 0, 0);
    expect(() => t.addToolResult(g, [], info('search'), 0)).toThrow('Expected a non-empty token array for tool result tokens');
    t.addLeaf(g, 'eos', { path: 0, origin: 'global', stream: 0n, toolCalls: 0 });
    expect(() => t.appendGenerated(g, 3, 0, 0, 0)).toThrow('Generated node 1 is closed');
    expect(() => t.addLeaf(g, 'eos', { path: 0, origin: 'global', stream: 0n, toolCalls: 0 })).toThrow('already ends trajectory 0');
    expect(() => t.trajectory(4)).toThrow('Expected a leaf index in [0, 1) for leaf but received 4');
  });
});
