// Rewards: the registry and the built-ins (`arpo-deep-research`, `math`, `hierarchical`).
export { mathReward } from './math-reward';
export { BoxError, extractBoxedAnswer, lastBoxedOnlyString, removeBoxed } from './boxed';
export { deepResearchReward, extractAnswerTag, usedSearchAndPython, validateDeepResearchFormat } from './deep-research';
export type { DeepResearchOptions } from './deep-research';
export { defaultAccuracy, extractBoxedFromAnswerTag, hierarchicalReward } from './hierarchical';
export type { HierarchicalRewardOptions } from './hierarchical';
export { parseLatexExpression } from './latex-expr';
export { mathEquivalent, normalizeMathAnswer } from './math';
export { computeReward, getReward, loadRewardModule, registerReward, rewardNames, toRewardResult, type BuiltinRewardOptions } from './registry';
export { normalizeAnswer, tokenF1 } from './squad';
export type { FormatVerdict, RewardFn, RewardInput, RewardResult } from './types';
