// Public API of the rollout layer: RolloutTree and its views, the ARPO
// adaptive rollout and the trajectory-level baseline (one scheduler).
export { RolloutTree, packTrees } from './tree';
export type { NodeKind, RolloutNode, RolloutLeaf, Trajectory, PackedTrees, ToolCallInfo, RolloutTreeJSON, RolloutNodeJSON } from './tree';
export { rollout } from './scheduler';
export type { RolloutDeps, RolloutOptions, RolloutResult } from './scheduler';
export { DEFAULT_ROLLOUT_SETTINGS, resolveRolloutSettings } from './settings';
export type { RolloutSettings, BranchRule, EntropyEstimate, RolloutMode } from './settings';
export { branchProbability, branchFires, decisionUniform, pathStream, topKEntropy, mix64, EntropyWindow } from './branching';
export { stopCompletedBy } from './stops';
export { FINISH_REASONS } from './types';
export type {
  TokenText,
  ToolExecutor,
  ToolExecution,
  FinishReason,
  PathOrigin,
  BranchDecision,
  RolloutMetrics,
  ToolCallCounts,
  TopLogprobsSampling,
  TopLogprobsResult,
} from './types';
export { tokenizerText, runnerExecutor } from './adapters';
export type { TokenizerLike, ToolRunnerLike } from './adapters';
