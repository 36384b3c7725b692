// Training: run configuration, the RL trainer, SFT, evaluation, checkpoints, metrics and the report.
export { OPTIONS, ALGORITHM_PRESETS, defaultConfig, validateConfig, loadConfig, parseOverride, describeOptions } from './config';
export type { RunConfig, OptionPath } from './config';
export { train, validate, configHash, stepSeed } from './trainer';
export type { TrainOptions, TrainSummary } from './trainer';
export { runSft, readSftData, encodeConversation, splitToolResults } from './sft';
export type { SftSegment, SftSummary } from './sft';
export { evaluate } from './evaluate';
export type { EvalResult } from './evaluate';
export { scoreAndAttribute, microBatches, rolloutStepMetrics, responseText } from './batch';
export type { ScoredBatch, ScoredTrajectory } from './batch';
export { CheckpointManager, readTrainerState } from './checkpoint';
export type { TrainerState } from './checkpoint';
export { MetricsLog, Progress, readMetrics, formatStepLine } from './metrics';
export type { MetricsRecord, StepMetrics } from './metrics';
export { writeReport, renderReport, readRun, REPORT_CHARTS } from './report';
export type { RunData } from './report';
export { buildTools, buildReward, loadPolicy, eosTokenIds, promptIds, rolloutSettings } from './setup';
