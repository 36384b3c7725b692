// lib/train/tree-view.ts: the report's rollout-tree view against hand-built
// trees, with the per-node advantages checked against a naive computation
// (GRPO over each prompt's leaves, then the sum or mean over the leaves below).
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { attributeScores, type ScoredTrajectory } from '../../lib/train/batch';
import { readTreeViews, renderTreeSvg, rewardColour, treeRows, treeViews, writeTreeViews, type TreeView } from '../../lib/train/tree-view';
import { RolloutTree, type RolloutResult } from '../../lib/rollout';
import type { BranchDecision, TokenText } from '../../lib/rollout/types';
import type { DatasetExample } from '../../lib/data';

/** Small labels (font size 9) do not overlap: none closer than 9 px vertically whose spans meet (width estimated at 5.5 px per character). */
function expectNoOverlappingLabels(svg: string): void {
  const labels = [...svg.matchAll(/<text x="([-\d.]+)" y="([-\d.]+)"( text-anchor="end")?[^>]*font-size="9"[^>]*>([^<]*)<\/text>/g)].map((m) => {
    const x = Number(m[1]);
    const w = m[4]!.length * 5.5;
    return { y: Number(m[2]), lo: m[3] ? x - w : x, hi: m[3] ? x : x + w, text: m[4] };
  });
  expect(labels.some((l) => l.text!.startsWith('ΔH'))).toBe(true);
  for (const a of labels) for (const b of labels) if (a !== b && Math.abs(a.y - b.y) < 9) expect({ a: a.text, b: b.text, overlap: a.lo < b.hi && b.lo < a.hi }).toMatchObject({ overlap: false });
}

const text: TokenText = { encode: () => [], decode: (ids) => Array.from(ids, (t) => `t${t}`).join(' ') };
const tool = (tag: string, ok = true) => ({ tag, content: `${tag} query`, ok, cached: false, ms: 3 });
const meta = (p: number, origin: 'global' | 'branch' = 'global') => ({ path: p, origin, stream: BigInt(p), toolCalls: 1 });

function gen(tree: RolloutTree, parent: number, p: number, tokens: number[], origin?: 'global' | 'branch'): number {
  const n = tree.addGenerated(parent, p, origin);
  tokens.forEach((t, i) => tree.appendGenerated(n, t, -0.5, 0.1 * (i + 1), 0.01 * t));
  return n;
}

/** Prompt 0: path 0 searches, branches after the result (path 1), path 2 answers directly. Prompt 1: two leaves with equal rewards. */
function build(): { result: RolloutResult; rewards: number[][] } {
  const a = new RolloutTree(0, [1, 2, 3], 64);
  const g0 = gen(a, 0, 0, [4, 5], 'global');
  const r0 = a.addToolResult(g0, [6, 7, 8], tool('search'), 0);
  const g1 = gen(a, r0, 0, [9]);
  a.addLeaf(g1, 'answer', meta(0));
  const g2 = gen(a, r0, 1, [10, 11, 12], 'branch');
  const r2 = a.addToolResult(g2, [13], tool('python', false), 1);
  const g3 = gen(a, r2, 1, [14]);
  a.addLeaf(g3, 'answer', meta(1, 'branch'));
  const g4 = gen(a, 0, 2, [15, 16, 17, 18], 'global');
  a.addLeaf(g4, 'eos', meta(2));
  const b = new RolloutTree(1, [1, 2], 64);
  b.addLeaf(gen(b, 0, 0, [20, 21], 'global'), 'answer', meta(0));
  b.addLeaf(gen(b, 0, 1, [22], 'global'), 'answer', meta(1));
  const decision = (prompt: number, p: number, depth: number, fired: boolean): BranchDecision => ({
    prompt, path: p, toolCall: 1, tag: 'search', depth, entropy: 0.3, initialEntropy: 0.1, deltaEntropy: 0.2, probability: 0.54, uniform: 0.4, fired, branches: fired ? 1 : 0, branchPaths: fired ? [1] : [],
  });
  const result = { trees: [a, b], decisions: [decision(0, 0, 2, true), decision(0, 1, 4, false)], metrics: {} } as unknown as RolloutResult;
  return { result, rewards: [[1, -1, 0], [0.5, 0.5]] };
}

function items(result: RolloutResult, rewards: number[][]): ScoredTrajectory[] {
  return result.trees.flatMap((t) =>
    t.trajectories().map((traj) => {
      const score = rewards[t.prompt]![traj.leaf]!;
      return { trajectory: traj, group: t.prompt, response: '', reward: { score, formatOk: score >= 0, accuracy: Math.max(0, score), answer: '', reason: '' }, advantage: 0 };
    }),
  );
}

/** GRPO (verl: unbiased std, eps 1e-6) over each prompt's leaves, in float64. */
function naiveAdvantages(rs: number[]): number[] {
  const mean = rs.reduce((x, y) => x + y, 0) / rs.length;
  const std = rs.length > 1 ? Math.sqrt(rs.reduce((x, y) => x + (y - mean) ** 2, 0) / (rs.length - 1)) : 1;
  return rs.map((r) => (rs.length > 1 ? (r - mean) / (std + 1e-6) : 0));
}

const examples = [
  { question: 'Where is the <tower>?', groundTruth: 'Paris' },
  { question: 'Q1', groundTruth: ['a', 'b'] },
] as unknown as DatasetExample[];

describe('tree view', () => {
  for (const attribution of ['soft', 'hard'] as const) {
    test(`per-node values match the naive ${attribution} attribution; decisions sit on their tool results`, () => {
      const { result, rewards } = build();
      const it = items(result, rewards);
      const scored = attributeScores(result, it, { estimator: 'grpo', attribution, dynamicSampling: false });
      const v = treeViews(7, result, scored, examples, text, 5);
      expect(v).toMatchObject({ version: 1, step: 7, attribution });
      // The tree whose rewards differ comes first; the equal-reward one after it.
      expect(v.trees.map((t) => t.prompt)).toEqual([0, 1]);
      for (const view of v.trees) {
        const tree = result.trees[view.prompt]!;
        const adv = naiveAdvantages(rewards[view.prompt]!);
        expect(view.nodes).toHaveLength(tree.nodeCount);
        for (const n of view.nodes) {
          const below = tree.leaves.filter((l) => tree.pathTo(l.node).includes(n.id)).map((l) => l.index);
          const sum = below.reduce((x, l) => x + adv[l]!, 0);
          expect(n.leavesBelow).toBe(below.length);
          expect(n.value).toBeCloseTo(attribution === 'soft' ? sum : sum / below.length, 5);
          expect(n.advantage).toBeCloseTo(sum / below.length, 5);
          const node = tree.node(n.id);
          expect(n.start).toBe(node.start - tree.promptLength);
          expect(n.length).toBe(node.tokens.length);
          if (n.kind !== 'prompt') expect(n.text).toBe(text.decode(node.tokens));
          if (node.leaf >= 0) expect(n.leaf).toMatchObject({ index: node.leaf, reward: rewards[view.prompt]![node.leaf], advantage: expect.closeTo(adv[node.leaf]!, 5) });
        }
      }
      const a = v.trees[0]!;
      const withDecision = a.nodes.filter((n) => n.decision);
      expect(withDecision.map((n) => [n.kind, n.path, n.decision!.fired])).toEqual([['tool_result', 0, true], ['tool_result', 1, false]]);
      expect(a.nodes.find((n) => n.tool?.tag === 'python')!.tool).toEqual({ tag: 'python', ok: false, query: 'python query' });
      expect(a.nodes[1]!.meanNormEntropy).toBeCloseTo((0.04 + 0.05) / 2, 12);
      expect(v.trees[1]!.groundTruth).toBe('a | b');
      // limit: only the most informative tree.
      expect(treeViews(7, result, scored, examples, text, 1).trees.map((t) => t.prompt)).toEqual([0]);
      expect(treeViews(7, result, scored, examples, text, 0).trees).toEqual([]);
    });
  }

  test('the SVG draws one segment per node, one row and one reward-coloured dot per leaf, one diamond per decision', () => {
    const { result, rewards } = build();
    const scored = attributeScores(result, items(result, rewards), { estimator: 'grpo', attribution: 'soft', dynamicSampling: false });
    const view = treeViews(1, result, scored, examples, text, 1).trees[0]!;
    const { rowOf, rows } = treeRows(view);
    expect(rows).toBe(3);
    // Leaves on distinct rows; every node on the row of its first leaf (depth-first).
    const leafRows = view.nodes.filter((n) => n.leaf).map((n) => rowOf.get(n.id));
    expect(new Set(leafRows).size).toBe(3);
    expect(rowOf.get(0)).toBe(0);
    expect(rowOf.get(1)).toBe(0); // path 0's first segment: on its leaf's row
    const svg = renderTreeSvg(view, 'soft');
    expect((svg.match(/<rect class="node/g) ?? []).length).toBe(view.nodes.length - 1);
    expect((svg.match(/<rect class="node tool_result/g) ?? []).length).toBe(2);
    expect((svg.match(/<circle class="leaf"/g) ?? []).length).toBe(3);
    expect((svg.match(/class="branch-point"/g) ?? []).length).toBe(2);
    expect(svg).toContain(`fill="${rewardColour(1)}"`);
    expect(svg).toContain(`fill="${rewardColour(-1)}"`);
    expect(svg).toContain('ΔH +0.20 P 0.54');
    expectNoOverlappingLabels(svg);
    expect(svg).toContain('&lt;tower&gt;'); // the question is escaped
    expect(svg).not.toContain('<tower>');
    expect(rewardColour(1)).toBe('rgb(44,160,44)');
    expect(rewardColour(-1)).toBe('rgb(214,39,40)');
    expect(rewardColour(0)).toBe('rgb(150,150,150)');
    expect(rewardColour(Number.NaN)).toBe('rgb(150,150,150)');
  });

  test('labels stay apart where a branch decision meets the next segment (the demo\'s shape: a long search result, then a long answer)', () => {
    const decision = { toolCall: 1, entropy: 0.02, initialEntropy: 0.01, deltaEntropy: 0.01, probability: 0.5, fired: true, branches: 1 };
    const leaf = (index: number, reward: number) => ({ index, reward, accuracy: reward > 0 ? 1 : 0, advantage: reward - 0.5, finishReason: 'answer', toolCalls: 1 });
    const view: TreeView = {
      prompt: 0,
      question: 'How many years older is A than B?',
      groundTruth: '79',
      promptLength: 23,
      nodes: [
        { id: 0, parent: -1, kind: 'prompt', start: -23, length: 23, text: '', path: -1, value: 0, advantage: 0, leavesBelow: 2 },
        { id: 1, parent: 0, kind: 'generated', start: 0, length: 23, text: '<think>', path: 0, value: 0, advantage: 0, leavesBelow: 2 },
        { id: 2, parent: 1, kind: 'tool_result', start: 23, length: 119, text: ' <result>', path: 0, tool: { tag: 'search', ok: true, query: 'A born' }, value: 0, advantage: 0, leavesBelow: 2, decision },
        { id: 3, parent: 2, kind: 'generated', start: 142, length: 37, text: ' <think>', path: 0, value: 0.5, advantage: 0.5, leavesBelow: 1, leaf: leaf(0, 1) },
        { id: 4, parent: 2, kind: 'generated', start: 142, length: 30, text: ' <think>', path: 1, value: -0.5, advantage: -0.5, leavesBelow: 1, leaf: leaf(1, 0) },
      ],
    };
    const svg = renderTreeSvg(view, 'soft');
    expect(svg).toContain('ΔH +0.01 P 0.50');
    expect(svg).toContain('A +0.50');
    expectNoOverlappingLabels(svg);
  });

  test('the file round-trips; a damaged file is reported, not thrown', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-treeview-'));
    try {
      expect(readTreeViews(dir)).toBeNull();
      const { result, rewards } = build();
      const scored = attributeScores(result, items(result, rewards), { estimator: 'grpo', attribution: 'soft', dynamicSampling: false });
      const v = treeViews(3, result, scored, examples, text, 2);
      writeTreeViews(dir, v);
      expect(readTreeViews(dir)).toEqual(JSON.parse(JSON.stringify(v)));
      const file = path.join(dir, 'rollout-trees.json');
      fs.writeFileSync(file, '{"version": 1, "trees": [');
      expect(readTreeViews(dir)).toEqual({ error: expect.stringContaining('rollout-trees.json') });
      fs.writeFileSync(file, JSON.stringify({ version: 1, step: 1, trees: [{ nodes: [{ id: 0, parent: -1, start: 0, length: 1, value: 'x' }] }] }));
      expect(readTreeViews(dir)).toEqual({ error: expect.stringContaining('trees[0].nodes[0].value is not a number') });
      fs.writeFileSync(file, JSON.stringify({ version: 2, trees: [] }));
      expect(readTreeViews(dir)).toEqual({ error: expect.stringContaining('not a version-1 rollout-tree file') });
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
