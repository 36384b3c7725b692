// The rollout-tree view of the report: for a few prompts of a training step,
// each tree as data (treeViews: nodes with their text, tool calls, mean
// entropy, attributed advantage and leaves below; leaves with reward and
// advantage; the branch decisions with their ΔH and P, at the tool result they
// were taken after), written to <run>/rollout-trees.json after every step, and
// drawn as a static SVG (renderTreeSvg): nodes as horizontal segments along the
// response's token positions, one row per leaf, tool results marked, branch
// points labelled, leaves coloured by reward.
import * as fs from 'fs';
import * as path from 'path';
import type { DatasetExample } from '../data';
import type { RolloutResult } from '../rollout';
import type { TokenText } from '../rollout/types';
import type { ScoredBatch } from './batch';

/** The file the trainer writes each step (root rank: its own prompts). */
export const TREE_VIEW_FILE = 'rollout-trees.json';

export interface TreeViewDecision {
  /** 1-based index of the tool call of the deciding path. */
  toolCall: number;
  entropy: number;
  initialEntropy: number;
  deltaEntropy: number;
  probability: number;
  fired: boolean;
  branches: number;
}

export interface TreeViewNode {
  id: number;
  parent: number;
  kind: 'prompt' | 'generated' | 'tool_result';
  /** First token's position from the start of the response (the prompt node: -promptLength). */
  start: number;
  length: number;
  /** Decoded text, cut to TEXT_CHARS. */
  text: string;
  path: number;
  origin?: string;
  tool?: { tag: string; ok: boolean; query: string };
  meanNormEntropy?: number;
  /** The attribution's value of the node: soft Σ Â over the leaves below, hard their mean. */
  value: number;
  /** Mean advantage of the leaves below (value / leavesBelow for soft). */
  advantage: number;
  leavesBelow: number;
  /** The branch decision taken after this tool result, when one was. */
  decision?: TreeViewDecision;
  /** The trajectory ending here, when one does. */
  leaf?: { index: number; reward: number; accuracy: number | null; advantage: number; finishReason: string; toolCalls: number };
}

export interface TreeView {
  /** Index of the prompt in the step's batch (this rank's block). */
  prompt: number;
  question: string;
  groundTruth: string;
  promptLength: number;
  nodes: TreeViewNode[];
}

export interface TreeViewsFile {
  version: 1;
  step: number;
  attribution: 'soft' | 'hard';
  trees: TreeView[];
}

const TEXT_CHARS = 240;

function cut(s: string, n = TEXT_CHARS): string {
  return s.length > n ? `${s.slice(0, n - 1)}…` : s;
}

function spread(values: readonly number[]): number {
  return values.length === 0 ? 0 : Math.max(...values) - Math.min(...values);
}

/**
 * The views of at most `limit` trees of one step: those with the widest spread
 * of leaf rewards first (where the advantages say something), then the most
 * nodes, then batch order.
 */
export function treeViews(step: number, result: RolloutResult, scored: Pick<ScoredBatch, 'items' | 'nodeValues' | 'nodeLeafCounts' | 'attribution'>, examples: readonly DatasetExample[], text: TokenText, limit: number): TreeViewsFile {
  const nodeBase: number[] = [];
  let base = 0;
  for (const t of result.trees) {
    nodeBase.push(base);
    base += t.nodeCount;
  }
  const items = new Map(scored.items.map((i) => [`${i.trajectory.prompt}:${i.trajectory.leaf}`, i]));
  const order = result.trees.map((t, i) => ({
    i,
    spread: spread(t.leaves.map((l) => items.get(`${t.prompt}:${l.index}`)?.reward.score ?? 0)),
    nodes: t.nodeCount,
  }));
  order.sort((a, b) => b.spread - a.spread || b.nodes - a.nodes || a.i - b.i);
  const trees = order.slice(0, Math.max(0, limit)).map(({ i }) => {
    const tree = result.trees[i]!;
    const example = examples[tree.prompt];
    const decisions = result.decisions.filter((d) => d.prompt === tree.prompt);
    const nodes = tree.nodes.map((n): TreeViewNode => {
      const g = nodeBase[i]! + n.id;
      const value = scored.nodeValues[g] ?? 0;
      const below = scored.nodeLeafCounts[g] ?? 0;
      const out: TreeViewNode = {
        id: n.id,
        parent: n.parent,
        kind: n.kind,
        start: n.start - tree.promptLength,
        length: n.tokens.length,
        text: n.kind === 'prompt' ? '' : cut(text.decode(n.tokens)),
        path: n.path,
        value,
        advantage: scored.attribution === 'soft' && below > 0 ? value / below : value,
        leavesBelow: below,
      };
      if (n.origin) out.origin = n.origin;
      if (n.tool) out.tool = { tag: n.tool.tag, ok: n.tool.ok, query: cut(n.tool.content, 120) };
      if (n.kind === 'generated' && n.normEntropies.length > 0) out.meanNormEntropy = n.normEntropies.reduce((a, b) => a + b, 0) / n.normEntropies.length;
      if (n.kind === 'tool_result') {
        // The decision after a tool result: taken by the path that wrote the result, at the result node's depth.
        const d = decisions.find((x) => x.path === n.path && x.depth === n.depth);
        if (d) out.decision = { toolCall: d.toolCall, entropy: d.entropy, initialEntropy: d.initialEntropy, deltaEntropy: d.deltaEntropy, probability: d.probability, fired: d.fired, branches: d.branches };
      }
      if (n.leaf >= 0) {
        const l = tree.leaves[n.leaf]!;
        const item = items.get(`${tree.prompt}:${n.leaf}`);
        out.leaf = {
          index: n.leaf,
          reward: item?.reward.score ?? 0,
          accuracy: item?.reward.accuracy ?? null,
          advantage: item?.advantage ?? 0,
          finishReason: l.finishReason,
          toolCalls: l.toolCalls,
        };
      }
      return out;
    });
    const truth = example ? (typeof example.groundTruth === 'string' ? example.groundTruth : example.groundTruth.join(' | ')) : '';
    return { prompt: tree.prompt, question: cut(example?.question ?? ''), groundTruth: cut(truth, 120), promptLength: tree.promptLength, nodes };
  });
  return { version: 1, step, attribution: scored.attribution, trees };
}

/** Writes the views atomically to <runDir>/rollout-trees.json. */
export function writeTreeViews(runDir: string, views: TreeViewsFile): void {
  const file = path.join(runDir, TREE_VIEW_FILE);
  const tmp = `${file}.tmp-${process.pid}`;
  fs.writeFileSync(tmp, `${JSON.stringify(views)}\n`);
  fs.renameSync(tmp, file);
}

/**
 * Reads <runDir>/rollout-trees.json: null when absent; a file that is not a
 * tree-view file gives `{ error }` (the report says so and goes on).
 */
export function readTreeViews(runDir: string): TreeViewsFile | { error: string } | null {
  const file = path.join(runDir, TREE_VIEW_FILE);
  if (!fs.existsSync(file)) return null;
  try {
    const v = JSON.parse(fs.readFileSync(file, 'utf8')) as TreeViewsFile;
    if (v === null || typeof v !== 'object' || v.version !== 1 || !Array.isArray(v.trees)) return { error: `${file}: not a version-1 rollout-tree file` };
    for (const [ti, t] of v.trees.entries()) {
      if (t === null || typeof t !== 'object' || !Array.isArray(t.nodes)) return { error: `${file}: trees[${ti}].nodes is not an array` };
      for (const [ni, n] of t.nodes.entries()) {
        const bad = ['id', 'parent', 'start', 'length', 'value', 'advantage', 'leavesBelow'].find((k) => typeof (n as unknown as Record<string, unknown>)?.[k] !== 'number');
        if (bad) return { error: `${file}: trees[${ti}].nodes[${ni}].${bad} is not a number` };
        if (!(n.parent < n.id && n.id === ni)) return { error: `${file}: trees[${ti}].nodes[${ni}]: ids must be 0, 1, ... with parents before children` };
      }
    }
    return v;
  } catch (e) {
    return { error: `${file}: ${(e as Error).message}` };
  }
}

/** XML/HTML text escaping. */
export function escapeXml(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

/** Reward in [-1, 1] (clamped) to a colour: red (-1, bad format), grey (0, wrong), green (1 and above, right). */
export function rewardColour(r: number): string {
  const x = Math.max(-1, Math.min(1, Number.isFinite(r) ? r : 0));
  const mix = (a: number[], b: number[], t: number): string => `rgb(${a.map((v, i) => Math.round(v + (b[i]! - v) * t)).join(',')})`;
  const grey = [150, 150, 150];
  return x < 0 ? mix(grey, [214, 39, 40], -x) : mix(grey, [44, 160, 44], x);
}

const fmt = (x: number, d = 2): string => (x >= 0 ? '+' : '') + x.toFixed(d);

/** Rows of the drawing: leaves in depth-first order; a node sits on the row of its first leaf. */
export function treeRows(view: TreeView): { rowOf: Map<number, number>; rows: number } {
  const children = new Map<number, number[]>();
  for (const n of view.nodes) if (n.parent >= 0) children.set(n.parent, [...(children.get(n.parent) ?? []), n.id]);
  const rowOf = new Map<number, number>();
  let rows = 0;
  const visit = (id: number): number => {
    const kids = children.get(id) ?? [];
    let first = -1;
    for (const k of kids) {
      const r = visit(k);
      if (first < 0) first = r;
    }
    if (first < 0) first = rows++; // a leaf (or a node without children) opens a row
    rowOf.set(id, first);
    return first;
  };
  if (view.nodes.length > 0) visit(0);
  return { rowOf, rows };
}

/** One tree as a static SVG; per-node details in <title> (hover) and leaf outcomes as text. */
export function renderTreeSvg(view: TreeView, attribution: 'soft' | 'hard' = 'soft'): string {
  const { rowOf, rows } = treeRows(view);
  const width = 980;
  const left = 20;
  const right = 230; // leaf labels
  const top = 46;
  const rowH = 26;
  const height = top + Math.max(1, rows) * rowH + 12;
  const end = Math.max(1, ...view.nodes.filter((n) => n.kind !== 'prompt').map((n) => n.start + n.length));
  const x = (pos: number): number => left + (Math.max(0, pos) / end) * (width - left - right);
  const y = (row: number): number => top + row * rowH + rowH / 2;
  const byId = new Map(view.nodes.map((n) => [n.id, n]));
  const parts: string[] = [];
  parts.push(`<svg xmlns="http://www.w3.org/2000/svg" class="rollout-tree" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui,sans-serif" font-size="11">`);
  parts.push(`<title>${escapeXml(`prompt ${view.prompt}: ${view.question}`)}</title>`);
  parts.push(`<text x="${left}" y="14" font-weight="bold">${escapeXml(cut(`prompt ${view.prompt}: ${view.question}`, 150))}</text>`);
  parts.push(`<text x="${left}" y="30" fill="#555">${escapeXml(cut(`ground truth: ${view.groundTruth} | ${view.nodes.filter((n) => n.leaf).length} leaves, ${end} response tokens | segment: generated (blue), tool result (orange; red: tool error) | ◆ branch decision (filled: fired)`, 175))}</text>`);
  for (const n of view.nodes) {
    if (n.kind === 'prompt') continue;
    const row = rowOf.get(n.id) ?? 0;
    const parent = byId.get(n.parent);
    const prow = parent ? (rowOf.get(parent.id) ?? row) : row;
    // The elbow from the parent's row down to this node's.
    if (prow !== row) parts.push(`<path d="M${x(n.start).toFixed(1)},${y(prow).toFixed(1)} V${y(row).toFixed(1)}" stroke="#999" fill="none"/>`);
    const fill = n.kind === 'tool_result' ? (n.tool?.ok === false ? '#e45756' : '#f58518') : '#4c78a8';
    const details = [
      `node ${n.id} (${n.kind}${n.origin ? `, ${n.origin} path` : ''}, path ${n.path}) tokens ${n.start}..${n.start + n.length}`,
      n.tool ? `${n.tool.tag}${n.tool.ok ? '' : ' (error)'}: ${n.tool.query}` : '',
      n.meanNormEntropy !== undefined ? `mean normalised entropy ${n.meanNormEntropy.toFixed(3)}` : '',
      `advantage ${fmt(n.advantage, 3)} (${attribution}: value ${fmt(n.value, 3)} over ${n.leavesBelow} leaves)`,
      n.text,
    ].filter((s) => s !== '');
    const x0 = x(n.start);
    const w = Math.max(1.5, x(n.start + n.length) - x0);
    parts.push(`<rect class="node ${n.kind}" x="${x0.toFixed(1)}" y="${(y(row) - 5).toFixed(1)}" width="${w.toFixed(1)}" height="10" fill="${fill}" stroke="#fff" stroke-width="0.5"><title>${escapeXml(details.join('\n'))}</title></rect>`);
    if (n.kind === 'generated' && w > 40) parts.push(`<text x="${(x0 + 2).toFixed(1)}" y="${(y(row) - 7).toFixed(1)}" fill="#4c78a8" font-size="9">A ${fmt(n.advantage)}</text>`);
    if (n.kind === 'tool_result' && n.tool) parts.push(`<text x="${x0.toFixed(1)}" y="${(y(row) + 15).toFixed(1)}" fill="#b35900" font-size="9">${escapeXml(n.tool.tag)}</text>`);
    if (n.decision) {
      const d = n.decision;
      const cx = x(n.start + n.length);
      const cy = y(row);
      parts.push(
        `<path class="branch-point" d="M${cx.toFixed(1)},${(cy - 6).toFixed(1)} l6,6 l-6,6 l-6,-6 z" fill="${d.fired ? '#222' : '#fff'}" stroke="#222"><title>${escapeXml(`branch decision after tool call ${d.toolCall}: H ${d.entropy.toFixed(3)} - H_initial ${d.initialEntropy.toFixed(3)} = ΔH ${fmt(d.deltaEntropy, 3)}; P ${d.probability.toFixed(3)}; ${d.fired ? `fired, ${d.branches} branch${d.branches === 1 ? '' : 'es'}` : 'did not fire'}`)}</title></path>`,
      );
      // Left of the diamond, over the tool result's end: right of it the next segment has its advantage label.
      parts.push(`<text x="${(cx - 7).toFixed(1)}" y="${(cy - 7).toFixed(1)}" text-anchor="end" font-size="9" fill="${d.fired ? '#000' : '#777'}">ΔH ${fmt(d.deltaEntropy)} P ${d.probability.toFixed(2)}</text>`);
    }
    if (n.leaf) {
      const l = n.leaf;
      const ex = x(n.start + n.length);
      parts.push(`<circle class="leaf" cx="${ex.toFixed(1)}" cy="${y(row).toFixed(1)}" r="5" fill="${rewardColour(l.reward)}" stroke="#333"><title>${escapeXml(`leaf ${l.index}: reward ${l.reward.toFixed(3)}, advantage ${fmt(l.advantage, 3)}, ${l.finishReason}, ${l.toolCalls} tool calls`)}</title></circle>`);
      parts.push(`<text x="${width - right + 10}" y="${(y(row) + 4).toFixed(1)}" fill="${rewardColour(l.reward)}">${escapeXml(`r ${l.reward.toFixed(2)}  A ${fmt(l.advantage)}  ${l.finishReason}, ${l.toolCalls} calls`)}</text>`);
    }
  }
  parts.push('</svg>');
  return parts.join('\n');
}
