// Advantages and losses: estimator registry, ARPO tree attribution, policy-loss settings.
export {
  advantageEstimatorNames,
  computeAdvantages,
  drGrpo,
  PER_GROUP_ESTIMATORS,
  getAdvantageEstimator,
  grpo,
  registerAdvantageEstimator,
  reinforcePlusPlus,
  reinforcePlusPlusBaseline,
  rloo,
  validateOutcomeBatch,
} from './advantages';
export type { AdvantageEstimator, EstimatorOptions, GroupKey, OutcomeBatch } from './advantages';
export { AGGREGATIONS, DEFAULT_POLICY_LOSS, KL_TYPES, policyLossSettings } from './policy-loss';
export type { Aggregation, KLType, PolicyLossSettings } from './policy-loss';
export { ATTRIBUTIONS, attributeTreeAdvantages, leafGroups, leafResponseLengths, nativeTreeKernels, treeAdvantages, validatePackedTrees } from './tree';
export type { Attribution, PackedTreeArrays, TreeAdvantageOptions, TreeAttributionResult, TreeKernels } from './tree';
