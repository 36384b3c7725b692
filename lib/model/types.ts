// The contract between the policy model (lib/model, native/torch) and its
// users (rollout engine, trainer). Tokens are the source of truth: every call
// takes and returns token ids, never text.

/** Sampling settings for one decode call (temperature 0 = greedy). */
export interface SamplingOptions {
  temperature: number;
  topK?: number; // 0 or undefined: no top-k
  topP?: number; // 1 or undefined: no top-p
  seed: bigint | number; // run seed; the per-row key is (seed, path stream, position)
}

/** Result of one batched extend-and-sample call, one entry per path, in call order. */
export interface DecodeResult {
  tokens: Int32Array; // sampled next token per path
  logprobs: Float32Array; // its log-probability under softmax(logits / temperature), full vocabulary
  entropies: Float32Array; // exact full-vocabulary entropy (nats) of that distribution
  normEntropies: Float32Array; // entropy / ln V
}

/**
 * The generation engine: paths over a paged KV cache.
 * - A path holds the tokens already in its KV cache (`pathLength`).
 * - `extend(paths, inputs, sampling)` appends inputs[i] (1 token when
 *   decoding, many for a prompt or a tool result: batched prefill and decode
 *   in one call) to path i's cache, runs the forward, and samples the next
 *   token of each path from its last position's logits. The sampled token is
 *   NOT appended: the caller passes it as the next input (or discards it).
 *   The sampling key of path i is (seed, streamOf(path), pathLength after the
 *   append), so results never depend on batch composition or order.
 * - `fork(path, prefixLength, stream)` makes a new path sharing the first
 *   prefixLength tokens' KV blocks (copy-on-write of the last partial block,
 *   nothing recomputed). To re-sample the token after that prefix, fork at
 *   prefixLength - 1 and extend with the prefix's last token.
 */
export interface GenerationEngine {
  readonly vocabSize: number;
  newPath(stream: bigint | number): number;
  fork(path: number, prefixLength: number, stream: bigint | number): number;
  freePath(path: number): void;
  pathLength(path: number): number;
  extend(paths: readonly number[], inputs: readonly Int32Array[], sampling: SamplingOptions): Promise<DecodeResult>;
}
