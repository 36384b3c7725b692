// Adapters from the project's concrete pieces to the rollout's small
// interfaces: a Tokenizer (lib/model) as TokenText, a ToolRunner (lib/tools)
// as ToolExecutor. Structural types only, so this layer loads neither.
import { invalidArgument } from '../errors';
import type { TokenText, ToolExecution, ToolExecutor } from './types';

/** What the rollout uses of lib/model's Tokenizer. */
export interface TokenizerLike {
  /** Plain-text encoding of untrusted tool output (special-token strings stay text). */
  encodeToolResult(text: string): ArrayLike<number>;
  decode(ids: ArrayLike<number>): string;
}

/** Tool results are encoded once with `encodeToolResult`, so a page quoting `<|im_end|>` cannot end a turn. */
export function tokenizerText(tokenizer: TokenizerLike): TokenText {
  if (!tokenizer || typeof tokenizer.encodeToolResult !== 'function' || typeof tokenizer.decode !== 'function') {
    throw invalidArgument('a tokenizer with encodeToolResult and decode', 'tokenizer', tokenizer);
  }
  return { encode: (text) => tokenizer.encodeToolResult(text), decode: (ids) => tokenizer.decode(ids) };
}

/** What the rollout uses of lib/tools' ToolRunner: `run` never throws for a failed tool. */
export interface ToolRunnerLike {
  run(tag: string, content: string, options?: { signal?: AbortSignal }): Promise<ToolExecution>;
}

export function runnerExecutor(runner: ToolRunnerLike): ToolExecutor {
  if (!runner || typeof runner.run !== 'function') throw invalidArgument('a ToolRunner', 'runner', runner);
  return (tag, content, signal) => runner.run(tag, content, { signal });
}
