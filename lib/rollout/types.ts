// Contracts of the rollout layer with its neighbours (tokenizer, tools, model)
// and the shapes it hands to the trainer: finish reasons, decisions, metrics.
import type { DecodeResult, SamplingOptions } from '../model/types';
import type { RolloutTrace, SlotTime } from './trace';

/**
 * Token <-> text, as the rollout needs it: detokenise a generated tail to find
 * stop strings and tool calls, and encode a tool result once (no special
 * tokens added). The tokenizer in lib/model satisfies it.
 */
export interface TokenText {
  encode(text: string): ArrayLike<number>;
  decode(tokens: ArrayLike<number>): string;
}

/** What a tool call returns to the rollout: the output text (not yet wrapped in `<result>`). */
export interface ToolExecution {
  text: string;
  ok: boolean;
  /** Served from a replay cache (not counted as executed work). */
  cached?: boolean;
  /** The tool's own time, ms, without queueing (ToolRunner reports it). */
  ms?: number;
}

/**
 * Runs one tool call: the tag (`search`), the content between the tags and an
 * abort signal (the rollout aborts on failure). It may reject; the rollout then
 * feeds the error text back to the model as the result, like a failed tool.
 */
export type ToolExecutor = (tag: string, content: string, signal: AbortSignal) => Promise<string | ToolExecution>;

/**
 * Why a trajectory ended: `answer` (closing answer tag), `eos` (an EOS token),
 * `length` (max response tokens, or a tool result that no longer fits),
 * `tool_limit` (a call over the per-path limit: the call is not run and no
 * forced token is appended or trained).
 */
export type FinishReason = 'answer' | 'eos' | 'length' | 'tool_limit';
export const FINISH_REASONS: readonly FinishReason[] = ['answer', 'eos', 'length', 'tool_limit'];

/** How a path came to exist: the first N samples, a branch, or a budget refill. */
export type PathOrigin = 'global' | 'branch' | 'refill';

/**
 * Optional engine extension for the reference-compatible entropy estimate:
 * `extend` is asked for the `topLogprobs` largest log-probabilities of every
 * sampled row and returns them row-major, (paths, topLogprobs), descending.
 * The exact full-vocabulary entropy needs none of this.
 */
export interface TopLogprobsSampling extends SamplingOptions {
  topLogprobs?: number;
}
export interface TopLogprobsResult extends DecodeResult {
  topLogprobs?: Float32Array;
}

/** One entropy-driven branch decision (ARPO.md section 1, steps 3-5). */
export interface BranchDecision {
  prompt: number;
  /** Creation order of the deciding path within its prompt. */
  path: number;
  /** 1-based index of the tool call whose result precedes the window. */
  toolCall: number;
  tag: string;
  /** Depth of the tool-result node the branches would hang from. */
  depth: number;
  /** Mean normalised entropy of the window after the result (H_t) and of the path's initial window. */
  entropy: number;
  initialEntropy: number;
  /** ΔH_t = H_t − H_initial. */
  deltaEntropy: number;
  /** P_t = clamp(α + β·ΔH_t, 0, 1). */
  probability: number;
  /** The uniform draw of the bernoulli rule (NaN under the threshold rule). */
  uniform: number;
  /** The rule fired. */
  fired: boolean;
  /** Branches actually created (0 when the rule did not fire or the budget was spent). */
  branches: number;
  /** Creation orders of the branches. */
  branchPaths: number[];
}

/** Per-tool call counts. */
export interface ToolCallCounts {
  /** Calls run by the executor (a cached replay still counts here; see `cached`). */
  executed: number;
  /** Of those, served from a replay cache. */
  cached: number;
  /** Calls that failed (the error text went back to the model). */
  failed: number;
  /** Calls present in leaves only through a shared prefix (sum over leaves of calls on their path, minus executed). */
  inherited: number;
  /** Calls refused because the path was over its tool-call limit. */
  overLimit: number;
}

/** Metrics of one rollout step (one batch of prompts). */
export interface RolloutMetrics {
  mode: 'arpo' | 'trajectory';
  prompts: number;
  trajectories: number;
  /** Tokens sampled by the policy (all generated nodes). */
  tokensGenerated: number;
  /** Tokens the engine ran through the model (prompt prefill + fed samples + tool results). */
  tokensComputed: number;
  /** Response tokens summed over leaves (each shared token counted once per leaf). */
  leafTokensTotal: number;
  /** Response tokens in the trees, each node counted once. */
  leafTokensUnique: number;
  finishReasons: Record<FinishReason, number>;
  paths: Record<PathOrigin, number>;
  decisions: number;
  decisionsFired: number;
  branchEvents: number;
  branches: number;
  /** Where the branch events happened: per tool tag, per depth of the tool-result node, and their mean ΔH. */
  branchEventsByTool: Record<string, number>;
  branchEventsByDepth: Record<string, number>;
  branchDeltaEntropy: number;
  toolCalls: Record<string, ToolCallCounts>;
  /** Mean normalised entropy of the k tokens before each tool call and after each result, per tag. */
  entropyBeforeTool: Record<string, number>;
  entropyAfterTool: Record<string, number>;
  /** How many windows each of those means averages (so that ranks' means combine exactly). */
  entropyBeforeToolCount: Record<string, number>;
  entropyAfterToolCount: Record<string, number>;
  /** Results that did not fit into the response budget (path ended with `length`). */
  toolResultsDropped: number;
  /** Engine calls and their wall time; summed tool-call time (overlapping calls add up) and the step's wall time. */
  engineCalls: number;
  modelMs: number;
  toolMs: number;
  wallMs: number;
  /** Largest number of paths in one engine call. */
  maxBatchPaths: number;
  /** Paths summed over engine calls (rows per call = engineRows / engineCalls). */
  engineRows: number;
  /** Where the unfinished budget's slots spent the rollout, slot-ms (lib/rollout/trace.ts). */
  slotMs: SlotTime;
  /** Wall time with no engine call running because every ready path waited for a tool, ms. */
  toolWaitMs: number;
  /**
   * Speculative refills (setting speculativeRefills): started with the first
   * paths, kept as refills, and the tokens of the dropped ones (computed, then
   * thrown away; included in tokensComputed).
   */
  speculation: { started: number; kept: number; tokensDropped: number };
}
