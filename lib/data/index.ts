// Datasets: ARPO parquet / JSONL loading, validation, prompts, seeded sampling.
export { DatasetSampler, epochPermutation, PromptDataset } from './dataset';
export type { DatasetOptions, SamplerOptions, SamplerState } from './dataset';
export { ARPO_SYSTEM_PROMPT, buildPrompt, promptMessages } from './prompt';
export type { ChatTemplate, PromptOptions } from './prompt';
export { readJsonlRows, readParquetRows } from './readers';
export type { RawRow } from './readers';
export { isIssue, parseRow, plainValue } from './rows';
export type { ChatMessage, DatasetExample, DatasetIssue } from './rows';
