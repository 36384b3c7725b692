// The model layer's public surface: checkpoints, safetensors, tokenizer, chat
// template, stop matching (and the policy model). Additive export lines only.
export * from './types';
export { parseModelConfig, readModelConfig, writeCheckpointDir, recoverCheckpointDir, tinyConfig, expectedTensorShapes, MODEL_TYPES, TOKENIZER_FILES } from './checkpoint';
export type { ModelConfig, ModelType, RopeScaling, TorchDType, LoadedModelConfig, WriteCheckpointOptions } from './checkpoint';
export { SafetensorsFile, writeSafetensors, openCheckpointTensors, parseSafetensorsHeader, float32ToBf16Bits, bf16BitsToFloat32 } from './safetensors';
export type { SafetensorsDType, TensorInfo, TensorToWrite } from './safetensors';
export { Tokenizer, IncrementalDetokenizer, buildTinyBpeTokenizer, writeTokenizerFiles } from './tokenizer';
export { applyChatTemplate, renderChatTemplate } from './chat';
export type { ChatMessage, ChatTool, ChatTemplateOptions, ChatPrompt } from './chat';
export { StopMatcher } from './stop';
export type { StopMatch, StopMatcherOptions } from './stop';
export { PolicyModel, optimizerConfig } from './policy-model';
export type {
  ComputeDType, PolicyModelOptions, SaveOptions, TrainSequence, Schedule, OptimizerSettings, TrainStepOptions, TrainMetrics,
  SequenceScores, GenerateOptions, Generation, CacheStats, PackedForest, TrainTreeBatch, TrainTreeStepOptions,
} from './policy-model';
