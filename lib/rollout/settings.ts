// Rollout settings: every field documented, defaults from the ARPO reference
// scripts, validated once and frozen (a bad field throws naming it and its value).
import { invalidArgument, unknownName } from '../errors';

/** `threshold`: branch when P_t > τ (the paper). `bernoulli`: branch with probability P_t (the reference code). */
export type BranchRule = 'threshold' | 'bernoulli';
/** `exact`: full-vocabulary entropy from the sampler. `top-k`: the reference's estimate from the top-k log-probabilities. */
export type EntropyEstimate = 'exact' | 'top-k';
/** `arpo`: entropy-driven tree rollout. `trajectory`: M independent samples (GRPO / DAPO / REINFORCE++). */
export type RolloutMode = 'arpo' | 'trajectory';

export interface RolloutSettings {
  readonly mode: RolloutMode;
  /** M: trajectories (leaves) per prompt (reference `rollout.n` 16). */
  readonly budget: number;
  /** N: initial global samples per prompt, N <= M (reference `initial_rollouts` 8; trajectory mode uses M). */
  readonly initialSamples: number;
  /** k: tokens in an entropy window (reference: first 20 tokens of a segment). */
  readonly entropyWindow: number;
  /** α: base branch probability (reference `branch_probability` 0.5). */
  readonly branchProbability: number;
  /** β: weight of the entropy change (reference `entropy_weight` 0.2). */
  readonly entropyWeight: number;
  /** τ: threshold of the `threshold` rule. */
  readonly branchThreshold: number;
  /** Z: paths forked per firing decision (reference `beam_size` 2, i.e. 1 extra). */
  readonly branchesPerDecision: number;
  readonly branchRule: BranchRule;
  /** Tool calls per path (reference `call_limit` 5); the next call ends the path with `tool_limit`. */
  readonly toolCallLimit: number;
  /** Response tokens per trajectory, generated plus tool results (reference scripts 4096). */
  readonly maxResponseTokens: number;
  /** Sampling (reference: temperature 1, no top-p / top-k). */
  readonly temperature: number;
  readonly topP: number;
  readonly topK: number;
  readonly entropyEstimate: EntropyEstimate;
  /** k of the top-k estimate (reference `logprobs` 10). */
  readonly entropyTopK: number;
  /** Most paths in one engine call (continuous batching width). */
  readonly maxBatchPaths: number;
  /** Most input tokens in one engine call (prefills of prompts and tool results add up); one entry always goes. */
  readonly maxBatchTokens: number;
  /** Record every engine call and tool call with its time in the result's `trace` (lib/rollout/trace.ts). */
  readonly trace: boolean;
  /**
   * Start the prompt's possible refills (M - N fresh global samples) together
   * with its first N paths, each up to the end of its first segment (its first
   * tool call is not run), instead of only once every path has finished. When
   * the prompt ends under budget, the first `remaining` of them become its
   * refills, exactly the paths the unspeculative rollout would start then (a
   * refill's stream is keyed by its refill index, not by when it starts); the
   * others are dropped. Trees, decisions and executed tool calls are the same
   * either way; speculation trades engine rows that are cheap in a wide batch
   * for a shorter second wave. Off by default: on the demo model on 2 CPU
   * cores it cut engine calls 8% but left rollout wall time unchanged (the
   * calls there cost per token, not per call; README, Benchmarks).
   */
  readonly speculativeRefills: boolean;
}

export const DEFAULT_ROLLOUT_SETTINGS: RolloutSettings = Object.freeze({
  mode: 'arpo',
  budget: 16,
  initialSamples: 8,
  entropyWindow: 20,
  branchProbability: 0.5,
  entropyWeight: 0.2,
  branchThreshold: 0.5,
  branchesPerDecision: 1,
  branchRule: 'bernoulli',
  toolCallLimit: 5,
  maxResponseTokens: 4096,
  temperature: 1,
  topP: 1,
  topK: 0,
  entropyEstimate: 'exact',
  entropyTopK: 10,
  maxBatchPaths: 256,
  maxBatchTokens: 16384,
  trace: false,
  speculativeRefills: false,
} as const);

/** Most paths per prompt (path orders and refill indices must stay below 2^31). */
export const MAX_BUDGET = 2 ** 31 - 1;

const KEYS = Object.keys(DEFAULT_ROLLOUT_SETTINGS) as (keyof RolloutSettings)[];

function int(name: string, v: unknown, min: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min) throw invalidArgument(`an integer >= ${min}`, name, v);
  return v;
}

function real(name: string, v: unknown, lo: number, hi: number, what = `a number in [${lo}, ${hi}]`): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < lo || v > hi) throw invalidArgument(what, name, v);
  return v;
}

function bool(name: string, v: unknown): boolean {
  if (typeof v !== 'boolean') throw invalidArgument('true or false', name, v);
  return v;
}

function oneOf<T extends string>(name: string, v: unknown, known: readonly T[]): T {
  if (typeof v !== 'string') throw invalidArgument(`one of ${known.join(', ')}`, name, v);
  if (!(known as readonly string[]).includes(v)) throw unknownName(name, v, known);
  return v as T;
}

/** Defaults overridden by `overrides`, validated and frozen. Unknown fields are an error (typos do not pass silently). */
export function resolveRolloutSettings(overrides: Partial<RolloutSettings> = {}): RolloutSettings {
  if (overrides === null || typeof overrides !== 'object' || Array.isArray(overrides)) {
    throw invalidArgument('a settings object', 'settings', overrides);
  }
  for (const key of Object.keys(overrides)) {
    if (!(KEYS as string[]).includes(key)) throw unknownName('rollout setting', key, KEYS);
  }
  const s = { ...DEFAULT_ROLLOUT_SETTINGS, ...overrides };
  const mode = oneOf('mode', s.mode, ['arpo', 'trajectory'] as const);
  const budget = int('budget', s.budget, 1);
  // Refill streams are keyed 2^31 + refill index (lib/rollout/branching.ts).
  if (budget > MAX_BUDGET) throw invalidArgument(`an integer in [1, ${MAX_BUDGET}]`, 'budget', budget);
  const initialSamples = int('initialSamples', s.initialSamples, 1);
  if (mode === 'arpo' && initialSamples > budget) {
    throw invalidArgument(`an integer in [1, budget = ${budget}]`, 'initialSamples', initialSamples);
  }
  return Object.freeze({
    mode,
    budget,
    initialSamples: mode === 'trajectory' ? budget : initialSamples,
    entropyWindow: int('entropyWindow', s.entropyWindow, 1),
    branchProbability: real('branchProbability', s.branchProbability, 0, 1),
    entropyWeight: real('entropyWeight', s.entropyWeight, -1e6, 1e6, 'a finite number'),
    branchThreshold: real('branchThreshold', s.branchThreshold, 0, 1),
    branchesPerDecision: int('branchesPerDecision', s.branchesPerDecision, 1),
    branchRule: oneOf('branchRule', s.branchRule, ['threshold', 'bernoulli'] as const),
    toolCallLimit: int('toolCallLimit', s.toolCallLimit, 0),
    maxResponseTokens: int('maxResponseTokens', s.maxResponseTokens, 1),
    temperature: real('temperature', s.temperature, 0, 1e6, 'a finite number >= 0'),
    topP: (() => {
      const p = real('topP', s.topP, 0, 1, 'a number in (0, 1]');
      if (p === 0) throw invalidArgument('a number in (0, 1]', 'topP', p);
      return p;
    })(),
    topK: int('topK', s.topK, 0),
    entropyEstimate: oneOf('entropyEstimate', s.entropyEstimate, ['exact', 'top-k'] as const),
    entropyTopK: int('entropyTopK', s.entropyTopK, 1),
    maxBatchPaths: int('maxBatchPaths', s.maxBatchPaths, 1),
    maxBatchTokens: int('maxBatchTokens', s.maxBatchTokens, 1),
    trace: bool('trace', s.trace),
    speculativeRefills: bool('speculativeRefills', s.speculativeRefills),
  });
}
