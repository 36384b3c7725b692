// The public API of arpo: one explicit surface per layer (see each folder's index.ts).
// Two names exist in two layers and are exported here under layer-qualified aliases:
// the kernel sampler's options (KernelSamplingOptions) and a dataset row's message (DatasetChatMessage).
export * from './errors';
export * from './native';
export type { SamplingOptions as KernelSamplingOptions } from './native';
export * from './model';
export type { SamplingOptions } from './model';
export * from './tools';
export * from './reward';
export * from './algo';
export * from './data';
export type { ChatMessage } from './model';
export type { ChatMessage as DatasetChatMessage } from './data';
export * from './rollout';
export * from './envs';
export * from './train';
