// From rollout trees to training data: decode and score every trajectory,
// turn rewards into advantages (estimator per prompt group, then soft or hard
// attribution over each tree), and lay them out as training sequences in
// micro-batches. Also the step metrics that describe a rollout.
import type { DatasetExample } from '../data';
import { treeAdvantages, type Attribution } from '../algo';
import type { TrainSequence } from '../model/policy-model';
import type { Tokenizer } from '../model/tokenizer';
import { packTrees, type RolloutResult, type Trajectory } from '../rollout';
import type { RolloutMetrics } from '../rollout/types';
import type { RewardFn, RewardResult } from '../reward';
import type { StepMetrics } from './metrics';
import { scoreResponse } from './setup';

export interface ScoredTrajectory {
  trajectory: Trajectory;
  /** Index of its prompt in the batch. */
  group: number;
  response: string;
  reward: RewardResult;
  advantage: number;
}

export interface ScoredBatch {
  items: ScoredTrajectory[];
  /** Training sequences, one per kept trajectory (tool-result tokens masked out). */
  sequences: TrainSequence[];
  /** Group (prompt) of each sequence. */
  sequenceGroups: number[];
  /** Prompts dropped by dynamic sampling (all rewards equal). */
  droppedGroups: number;
  /** The groups (prompts) dropped. */
  dropped: ReadonlySet<number>;
  /** Per node of packTrees(rollout.trees): the attributed value (soft Σ Â, hard mean Â) and its leaf count. */
  nodeValues: Float32Array;
  nodeLeafCounts: Int32Array;
  attribution: Attribution;
}

/** Decodes the response part (the reference decodes with skip_special_tokens). */
export function responseText(tokenizer: Tokenizer, t: Trajectory): string {
  return tokenizer.decode(t.tokens.subarray(t.promptLength), { skipSpecialTokens: true });
}

/**
 * Scores every leaf and computes advantages. Soft attribution trains every
 * trajectory as a full sequence with its own advantage (shared tokens then add
 * up the advantages of the trajectories that share them); hard attribution
 * gives a shared token the mean advantage of its d trajectories with a loss
 * weight of 1/d in each, so it counts once (ARPO.md section 2).
 */
export async function scoreAndAttribute(
  rollout: RolloutResult,
  examples: readonly DatasetExample[],
  tokenizer: Tokenizer,
  reward: RewardFn,
  options: AttributionOptions,
): Promise<ScoredBatch> {
  return attributeScores(rollout, await scoreItems(rollout, examples, tokenizer, reward), options);
}

/** The first half of scoreAndAttribute: every leaf decoded and scored, tree by tree (advantages still 0). */
export async function scoreItems(rollout: RolloutResult, examples: readonly DatasetExample[], tokenizer: Tokenizer, reward: RewardFn): Promise<ScoredTrajectory[]> {
  const items: ScoredTrajectory[] = [];
  for (const t of rollout.trees.flatMap((tree) => tree.trajectories())) {
    const example = examples[t.prompt]!;
    const response = responseText(tokenizer, t);
    items.push({ trajectory: t, group: t.prompt, response, reward: await scoreResponse(reward, example, response), advantage: 0 });
  }
  return items;
}

export interface AttributionOptions {
  estimator: string;
  attribution: Attribution;
  dynamicSampling: boolean;
  /** The leaves' advantages computed over a larger batch (data parallel, batch-level estimators); the estimator is then not run here. */
  leafAdvantages?: Float64Array;
}

/**
 * The second half of scoreAndAttribute: `items` are the scored trajectories of
 * every tree in order (tree by tree, leaf by leaf); sets their advantages and
 * lays out the training sequences.
 */
export function attributeScores(rollout: RolloutResult, items: ScoredTrajectory[], options: AttributionOptions): ScoredBatch {
  const packed = packTrees(rollout.trees);
  const adv = treeAdvantages(
    packed,
    items.map((i) => i.reward.score),
    { estimator: options.estimator, attribution: options.attribution, leafAdvantages: options.leafAdvantages },
  );
  items.forEach((item, l) => (item.advantage = adv.leafAdvantages[l]!));

  // Dynamic sampling (DAPO): a group whose rewards all agree carries no signal.
  const dropped = new Set<number>();
  if (options.dynamicSampling) {
    const byGroup = new Map<number, number[]>();
    for (const i of items) byGroup.set(i.group, [...(byGroup.get(i.group) ?? []), i.reward.score]);
    for (const [g, rs] of byGroup) if (rs.every((r) => r === rs[0])) dropped.add(g);
  }

  const sequences: TrainSequence[] = [];
  const sequenceGroups: number[] = [];
  for (const item of items) {
    if (dropped.has(item.group)) continue;
    const t = item.trajectory;
    const n = t.tokens.length;
    const advantages = new Float32Array(n);
    const mask = new Float32Array(n);
    if (options.attribution === 'soft') {
      for (let i = 0; i < n; i++) {
        mask[i] = t.lossMask[i]!; // tool-result and prompt tokens: mask 0 (context, not actions)
        advantages[i] = item.advantage;
      }
    } else {
      const treeNodeBase = packed.treeNodeOffset[t.prompt]!;
      let pos = 0;
      for (const local of t.nodes) {
        const g = treeNodeBase + local;
        const count = packed.tokenCount[g]!;
        const d = Math.max(1, adv.nodeLeafCounts[g]!);
        const value = adv.nodeValues[g]!;
        for (let i = pos; i < pos + count && i < n; i++) {
          mask[i] = t.lossMask[i]! / d; // shared by d trajectories: counted once in total
          advantages[i] = value;
        }
        pos += count;
      }
    }
    sequences.push({ tokens: t.tokens, mask, oldLogprobs: t.logprobs, advantages });
    sequenceGroups.push(item.group);
  }
  return {
    items, sequences, sequenceGroups, droppedGroups: dropped.size, dropped,
    nodeValues: adv.nodeValues, nodeLeafCounts: adv.nodeLeafCounts, attribution: options.attribution,
  };
}

/** Splits sequences into micro-batches of at most `maxTokens` tokens (a longer sequence goes alone). */
export function microBatches(sequences: readonly TrainSequence[], maxTokens: number): TrainSequence[][] {
  const out: TrainSequence[][] = [];
  let cur: TrainSequence[] = [];
  let tokens = 0;
  for (const s of sequences) {
    const n = s.tokens.length;
    if (cur.length > 0 && tokens + n > maxTokens) {
      out.push(cur);
      cur = [];
      tokens = 0;
    }
    cur.push(s);
    tokens += n;
  }
  if (cur.length > 0) out.push(cur);
  return out;
}

function mean(xs: readonly number[]): number {
  return xs.length === 0 ? NaN : xs.reduce((a, b) => a + b, 0) / xs.length;
}

function meanOfRecord(r: Record<string, number>): number {
  const v = Object.values(r).filter((x) => Number.isFinite(x));
  return mean(v);
}

/** What the step metrics read of a scored trajectory (small enough to gather from every rank). */
export interface ItemSummary {
  score: number;
  accuracy: number;
  formatOk: boolean;
  /** Loss-mask tokens of its response. */
  responseTokens: number;
  toolTags: string[];
}

export function summarizeItems(items: readonly ScoredTrajectory[]): ItemSummary[] {
  return items.map((i) => ({
    score: i.reward.score,
    accuracy: i.reward.accuracy,
    formatOk: i.reward.formatOk,
    responseTokens: i.trajectory.lossMask.reduce((a, b) => a + b, 0),
    toolTags: [...i.trajectory.toolTags],
  }));
}

/** Metrics of one scored rollout (reward, accuracy, length, tools, entropy, branching, cost). */
export function rolloutStepMetrics(rollout: RolloutResult, items: readonly ScoredTrajectory[]): StepMetrics {
  return stepMetrics(rollout.metrics, summarizeItems(items));
}

/** rolloutStepMetrics from the rollout's metrics and its items' summaries (data parallel: every rank's, merged). */
export function stepMetrics(m: RolloutMetrics, items: readonly ItemSummary[]): StepMetrics {
  const out: StepMetrics = {
    'reward/mean': mean(items.map((i) => i.score)),
    'acc/mean': mean(items.map((i) => i.accuracy)),
    'acc/exact': mean(items.map((i) => (i.accuracy >= 1 ? 1 : 0))),
    'format/ok': mean(items.map((i) => (i.formatOk ? 1 : 0))),
    'response/length_mean': mean(items.map((i) => i.responseTokens)),
    'tools/calls_per_traj': mean(items.map((i) => i.toolTags.length)),
    'rollout/trajectories': m.trajectories,
    'rollout/tokens_generated': m.tokensGenerated,
    // The tree's own compute (prefills, fed samples, tool results); dropped speculative refills are time/speculative_tokens_dropped.
    'rollout/tokens_computed': m.tokensComputed - m.speculation.tokensDropped,
    'rollout/unique_token_ratio': m.leafTokensTotal > 0 ? m.leafTokensUnique / m.leafTokensTotal : 1,
    'rollout/branch_events': m.branchEvents,
    'rollout/decisions': m.decisions,
    'time/model_s': m.modelMs / 1000,
    'time/tools_s': m.toolMs / 1000,
    'time/rollout_s': m.wallMs / 1000,
    // Where the rollout's time went (time/*: these follow tool timing and batch composition).
    'time/engine_calls': m.engineCalls,
    'time/rows_per_call': m.engineCalls > 0 ? m.engineRows / m.engineCalls : 0,
    'time/model_ms_per_token': m.tokensComputed > 0 ? m.modelMs / m.tokensComputed : 0,
    'time/tool_wait_s': m.toolWaitMs / 1000,
    // How far the dropped speculative refills got follows timing (time/*), like the slot shares.
    'time/speculative_tokens_dropped': m.speculation.tokensDropped,
  };
  const slots = Object.values(m.slotMs).reduce((a, b) => a + b, 0);
  if (slots > 0) for (const [k, v] of Object.entries(m.slotMs)) out[`time/slots_${k}`] = v / slots;
  let executed = 0;
  for (const [tag, c] of Object.entries(m.toolCalls)) {
    executed += c.executed;
    out[`tools/executed/${tag}`] = c.executed;
  }
  out['tools/executed_per_prompt'] = m.prompts > 0 ? executed / m.prompts : 0;
  const tags = new Set(items.flatMap((i) => i.toolTags));
  for (const tag of tags) out[`tools/calls/${tag}`] = mean(items.map((i) => i.toolTags.filter((x) => x === tag).length));
  const before = meanOfRecord(m.entropyBeforeTool);
  const after = meanOfRecord(m.entropyAfterTool);
  if (Number.isFinite(before)) out['entropy/before_tool'] = before;
  if (Number.isFinite(after)) out['entropy/after_tool'] = after;
  for (const [k, v] of Object.entries(out)) if (!Number.isFinite(v)) delete out[k];
  return out;
}
