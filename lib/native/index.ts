// The native layer's public surface: the loader, the typed raw addon and the
// validated kernel wrappers.
export { loadNative, hasTorch, packageRoot, NativeLoadError } from './loader';
export type { NativeAddon, NativeKernels, LogitsArray, PolicyLossResult, RawPolicyLossConfig } from './types';
export {
  logitsStats, logitsStatsAsync, sampleTokens, sampleTokensAsync, entropyDelta, policyLoss, policyLossAsync,
  policyLossConfig, treeReduce, treeReduceSigned, treeExpand, benchSum, KERNEL_KL_TYPES, KERNEL_AGGREGATIONS,
} from './kernels';
export type {
  LogitsStatsOptions, LogitsStats, SamplingOptions, SampledTokens, EntropySegments, EntropyDelta, KernelKLType,
  KernelAggregation, PolicyLossKernelSettings, PolicyLossBatch, PolicyLossOptions, PolicyLossOutput, TreeReduction, SignedTreeReduction,
} from './kernels';
