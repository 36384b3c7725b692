// The Tool interface every tool implements (search, python, MCP, user tools),
// and the result shape the runner hands to the rollout engine.

/** What a tool receives with each call. */
export interface ToolCallContext {
  /** Aborted on the runner's timeout or the caller's cancellation; tools stop work and reject. */
  readonly signal: AbortSignal;
}

/** A tool's own verdict on a call, when a plain string is not enough. */
export interface ToolOutput {
  /** What the model reads (before escaping and truncation by the runner). */
  readonly text: string;
  /** False when the tool ran but the call failed (a traceback, an MCP `isError`); the text explains. Default true. */
  readonly ok?: boolean;
  /** Structured details for logs and metrics (e.g. the sandbox's isolation level); never shown to the model. */
  readonly meta?: Readonly<Record<string, unknown>>;
}

/**
 * A tool mounted under a tag. `execute` gets the trimmed content between the
 * tags and returns the output text; it throws (or rejects) when it cannot run,
 * and must give up promptly once `ctx.signal` aborts.
 */
export interface Tool {
  /** Stable name: the key of its metrics and of its replay-cache entries. */
  readonly name: string;
  /** The protocol tag that calls it (`search` for `<search>…</search>`). */
  readonly tag: string;
  /**
   * Part of the replay-cache key besides the content: whatever changes the
   * answer (corpus hash, top-k, limits). Tools whose output must never be
   * cached (clocks, randomness) set `cacheable: false`.
   */
  readonly cacheKey?: string;
  readonly cacheable?: boolean;
  execute(content: string, ctx: ToolCallContext): Promise<string | ToolOutput>;
  /** Frees processes, connections and files. */
  close?(): Promise<void>;
}

/** What {@link ToolRunner.run} returns for every call: it never throws for a failed tool. */
export interface ToolRunResult {
  /** The output (or an explanatory error text) for the model, truncated, not yet escaped: pass it to `formatResult`. */
  readonly text: string;
  /** True when the tool answered normally. */
  readonly ok: boolean;
  /** Why the call failed, for logs (the text says it to the model). */
  readonly error?: string;
  readonly timedOut: boolean;
  /** Wall time of the call in milliseconds, queueing in the pool excluded. */
  readonly ms: number;
  /** Served from the replay cache (or joined an identical call already running). */
  readonly cached: boolean;
  /** Attempts made (1 + retries used); 0 when served from the cache. */
  readonly attempts: number;
  /** Output longer than the runner's limit was cut. */
  readonly truncated: boolean;
  readonly meta?: Readonly<Record<string, unknown>>;
}
