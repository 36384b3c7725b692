// Per-step rollout metrics: counters the scheduler bumps while it runs, and
// the totals read off the finished trees (leaf tokens, inherited tool calls).
import { emptySlotTime } from './trace';
import type { RolloutTree } from './tree';
import type { FinishReason, RolloutMetrics, ToolCallCounts } from './types';

/**
 * Entropy values per tool tag, kept until the end: their means are summed in
 * sorted order, so a metric does not depend on the order in which concurrent
 * paths reached their tool calls (train.deterministic promises identical metrics).
 */
type EntropyMeans = Map<string, number[]>;

/** Sum of `xs` that does not depend on their order (ascending, then left to right). */
function orderFreeSum(xs: readonly number[]): number {
  return [...xs].sort((a, b) => a - b).reduce((a, b) => a + b, 0);
}

export interface MetricsAccumulator extends RolloutMetrics {
  entropyBefore: EntropyMeans;
  entropyAfter: EntropyMeans;
  tool(tag: string): ToolCallCounts;
  addEntropy(into: EntropyMeans, tag: string, value: number): void;
  /** Records one branch event (its ΔH is averaged at the end). */
  addBranchEvent(tag: string, depth: number, deltaEntropy: number): void;
  /** The ΔH of every branch event so far. */
  branchDeltas: number[];
}

export function emptyMetrics(mode: 'arpo' | 'trajectory'): MetricsAccumulator {
  const toolCalls: Record<string, ToolCallCounts> = {};
  const finishReasons: Record<FinishReason, number> = { answer: 0, eos: 0, length: 0, tool_limit: 0 };
  return {
    mode,
    prompts: 0,
    trajectories: 0,
    tokensGenerated: 0,
    tokensComputed: 0,
    leafTokensTotal: 0,
    leafTokensUnique: 0,
    finishReasons,
    paths: { global: 0, branch: 0, refill: 0 },
    decisions: 0,
    decisionsFired: 0,
    branchEvents: 0,
    branches: 0,
    branchEventsByTool: {},
    branchEventsByDepth: {},
    branchDeltaEntropy: 0,
    toolCalls,
    entropyBeforeTool: {},
    entropyAfterTool: {},
    entropyBeforeToolCount: {},
    entropyAfterToolCount: {},
    toolResultsDropped: 0,
    engineCalls: 0,
    modelMs: 0,
    toolMs: 0,
    wallMs: 0,
    maxBatchPaths: 0,
    engineRows: 0,
    slotMs: emptySlotTime(),
    toolWaitMs: 0,
    speculation: { started: 0, kept: 0, tokensDropped: 0 },
    branchDeltas: [],
    entropyBefore: new Map(),
    entropyAfter: new Map(),
    tool(tag: string): ToolCallCounts {
      return (toolCalls[tag] ??= { executed: 0, cached: 0, failed: 0, inherited: 0, overLimit: 0 });
    },
    addBranchEvent(tag: string, depth: number, deltaEntropy: number): void {
      this.branchEvents++;
      this.branchEventsByTool[tag] = (this.branchEventsByTool[tag] ?? 0) + 1;
      this.branchEventsByDepth[depth] = (this.branchEventsByDepth[depth] ?? 0) + 1;
      this.branchDeltas.push(deltaEntropy); // averaged in finalizeMetrics
    },
    addEntropy(into: EntropyMeans, tag: string, value: number): void {
      const e = into.get(tag);
      if (e) e.push(value);
      else into.set(tag, [value]);
    },
  };
}

function counts(m: EntropyMeans): Record<string, number> {
  const out: Record<string, number> = {};
  for (const tag of [...m.keys()].sort()) out[tag] = m.get(tag)!.length;
  return out;
}

function means(m: EntropyMeans): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [tag, e] of [...m.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) out[tag] = e.length ? orderFreeSum(e) / e.length : 0;
  return out;
}

/** Plain metrics object: counters plus what the trees say. */
export function finalizeMetrics(acc: MetricsAccumulator, trees: readonly RolloutTree[]): RolloutMetrics {
  let generated = 0;
  let total = 0;
  let unique = 0;
  let leaves = 0;
  const callsInLeaves = new Map<string, number>();
  const resultNodes = new Map<string, number>();
  for (const t of trees) {
    leaves += t.leafCount;
    total += t.totalResponseTokens();
    unique += t.uniqueResponseTokens();
    for (const n of t.nodes) {
      if (n.kind === 'generated') generated += n.tokens.length;
      if (n.tool) resultNodes.set(n.tool.tag, (resultNodes.get(n.tool.tag) ?? 0) + 1);
    }
    for (const leaf of t.leaves) {
      for (const id of t.pathTo(leaf.node)) {
        const tool = t.node(id).tool;
        if (tool) callsInLeaves.set(tool.tag, (callsInLeaves.get(tool.tag) ?? 0) + 1);
      }
    }
  }
  // Each result node is one executed call; every other occurrence on a leaf's path came with a shared prefix.
  for (const [tag, n] of callsInLeaves) acc.tool(tag).inherited = n - (resultNodes.get(tag) ?? 0);
  const toolCalls: Record<string, ToolCallCounts> = {};
  for (const tag of Object.keys(acc.toolCalls).sort()) toolCalls[tag] = { ...(acc.toolCalls[tag] as ToolCallCounts) };
  return {
    mode: acc.mode,
    prompts: trees.length,
    trajectories: leaves,
    tokensGenerated: generated,
    tokensComputed: acc.tokensComputed,
    leafTokensTotal: total,
    leafTokensUnique: unique,
    finishReasons: { ...acc.finishReasons },
    paths: { ...acc.paths },
    decisions: acc.decisions,
    decisionsFired: acc.decisionsFired,
    branchEvents: acc.branchEvents,
    branches: acc.branches,
    branchEventsByTool: { ...acc.branchEventsByTool },
    branchEventsByDepth: { ...acc.branchEventsByDepth },
    branchDeltaEntropy: acc.branchDeltas.length > 0 ? orderFreeSum(acc.branchDeltas) / acc.branchDeltas.length : 0,
    toolCalls,
    entropyBeforeTool: means(acc.entropyBefore),
    entropyAfterTool: means(acc.entropyAfter),
    entropyBeforeToolCount: counts(acc.entropyBefore),
    entropyAfterToolCount: counts(acc.entropyAfter),
    toolResultsDropped: acc.toolResultsDropped,
    engineCalls: acc.engineCalls,
    modelMs: acc.modelMs,
    toolMs: acc.toolMs,
    wallMs: acc.wallMs,
    maxBatchPaths: acc.maxBatchPaths,
    engineRows: acc.engineRows,
    slotMs: { ...acc.slotMs },
    toolWaitMs: acc.toolWaitMs,
    speculation: { ...acc.speculation },
  };
}

/**
 * The metrics of several rollouts of one step taken together (the ranks of a
 * data-parallel run, in rank order): counts add up, means are re-weighted by
 * what they average (branch ΔH by branch events, entropy windows by their
 * counts), the wall time is the slowest rank's and the widest call the widest.
 * One part is returned as it is.
 */
export function mergeRolloutMetrics(parts: readonly RolloutMetrics[]): RolloutMetrics {
  if (parts.length === 0) throw new Error('mergeRolloutMetrics: no parts');
  if (parts.length === 1) return parts[0]!;
  const sum = (f: (m: RolloutMetrics) => number): number => parts.reduce((a, m) => a + f(m), 0);
  const addRecords = (f: (m: RolloutMetrics) => Record<string, number>): Record<string, number> => {
    const out: Record<string, number> = {};
    for (const m of parts) for (const [k, v] of Object.entries(f(m))) out[k] = (out[k] ?? 0) + v;
    return out;
  };
  const weighted = (mean: (m: RolloutMetrics) => Record<string, number>, count: (m: RolloutMetrics) => Record<string, number>): Record<string, number> => {
    const n = addRecords(count);
    const out: Record<string, number> = {};
    for (const tag of Object.keys(n).sort()) {
      if (n[tag]! === 0) continue;
      out[tag] = parts.reduce((a, m) => a + (mean(m)[tag] ?? 0) * (count(m)[tag] ?? 0), 0) / n[tag]!;
    }
    return out;
  };
  const toolCalls: Record<string, ToolCallCounts> = {};
  for (const m of parts) {
    for (const [tag, c] of Object.entries(m.toolCalls)) {
      const t = (toolCalls[tag] ??= { executed: 0, cached: 0, failed: 0, inherited: 0, overLimit: 0 });
      for (const k of Object.keys(t) as (keyof ToolCallCounts)[]) t[k] += c[k];
    }
  }
  const slotMs = emptySlotTime();
  for (const m of parts) for (const k of Object.keys(slotMs) as (keyof typeof slotMs)[]) slotMs[k] += m.slotMs[k];
  const branchEvents = sum((m) => m.branchEvents);
  return {
    mode: parts[0]!.mode,
    prompts: sum((m) => m.prompts),
    trajectories: sum((m) => m.trajectories),
    tokensGenerated: sum((m) => m.tokensGenerated),
    tokensComputed: sum((m) => m.tokensComputed),
    leafTokensTotal: sum((m) => m.leafTokensTotal),
    leafTokensUnique: sum((m) => m.leafTokensUnique),
    finishReasons: addRecords((m) => m.finishReasons) as Record<FinishReason, number>,
    paths: addRecords((m) => m.paths) as RolloutMetrics['paths'],
    decisions: sum((m) => m.decisions),
    decisionsFired: sum((m) => m.decisionsFired),
    branchEvents,
    branches: sum((m) => m.branches),
    branchEventsByTool: addRecords((m) => m.branchEventsByTool),
    branchEventsByDepth: addRecords((m) => m.branchEventsByDepth),
    branchDeltaEntropy: branchEvents > 0 ? sum((m) => m.branchDeltaEntropy * m.branchEvents) / branchEvents : 0,
    toolCalls: Object.fromEntries(Object.keys(toolCalls).sort().map((k) => [k, toolCalls[k]!])),
    entropyBeforeTool: weighted((m) => m.entropyBeforeTool, (m) => m.entropyBeforeToolCount),
    entropyAfterTool: weighted((m) => m.entropyAfterTool, (m) => m.entropyAfterToolCount),
    entropyBeforeToolCount: addRecords((m) => m.entropyBeforeToolCount),
    entropyAfterToolCount: addRecords((m) => m.entropyAfterToolCount),
    toolResultsDropped: sum((m) => m.toolResultsDropped),
    engineCalls: sum((m) => m.engineCalls),
    modelMs: sum((m) => m.modelMs),
    toolMs: sum((m) => m.toolMs),
    wallMs: Math.max(...parts.map((m) => m.wallMs)),
    maxBatchPaths: Math.max(...parts.map((m) => m.maxBatchPaths)),
    engineRows: sum((m) => m.engineRows),
    slotMs,
    toolWaitMs: sum((m) => m.toolWaitMs),
    speculation: addRecords((m) => m.speculation) as RolloutMetrics['speculation'],
  };
}
