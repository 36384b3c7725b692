// ToolRunner: the registry of mounted tools and the pool that runs their calls
// (bounded concurrency, per-call timeout, retries, output truncation, metrics,
// replay cache). A failed call yields an explanatory text; the rollout goes on.
import { ArpoError, invalidArgument, unknownName } from '../errors';
import { callKey, REPLAY_MODES, type ReplayMode, type ToolCallCache } from './replay';
import type { Tool, ToolOutput, ToolRunResult } from './tool';

/** Options of {@link ToolRunner}; all optional. */
export interface ToolRunnerOptions {
  /**
   * Calls of one tool running at once (default 8); the rest wait in FIFO
   * order. Each mounted tool has its own limit and queue, so a quick tool
   * (an in-process search) never waits behind a slow one's calls (sandboxed
   * python).
   */
  concurrency?: number;
  /** Wall limit of one attempt in ms (default 60000; the reference's tool timeout is 60 s). */
  timeoutMs?: number;
  /** Extra attempts after a tool throws (default 1). Timeouts and `ok: false` answers are not retried. */
  retries?: number;
  /** Wait before retry r (1-based): retryDelayMs * 2^(r-1) (default 100). */
  retryDelayMs?: number;
  /** Longest output kept, in UTF-16 code units (default 10000: the reference's 10 pages x 1000 chars). */
  maxOutputChars?: number;
  /** Longest call content accepted (default 100000); longer calls fail without running. */
  maxInputChars?: number;
  /** Replay cache; with it, identical concurrent calls also share one execution. */
  cache?: ToolCallCache;
  /** How the cache is used (default `auto` with a cache, `off` without). */
  replay?: ReplayMode;
  /** Close the cache file in {@link ToolRunner.close} (default false: the caller owns it). */
  ownsCache?: boolean;
}

/** Counters of one tool since the runner was made. */
export interface ToolMetrics {
  calls: number;
  ok: number;
  /** Calls that failed other than by timeout (thrown errors after retries, `ok: false`, rejected input). */
  failures: number;
  timeouts: number;
  /** Retries used (attempts beyond the first). */
  retries: number;
  cacheHits: number;
  /** Summed wall time of executed calls (cache hits excluded), ms. */
  totalMs: number;
  maxMs: number;
}

export interface RunOptions {
  /** Cancels the call (queued or running); the result then says so. */
  signal?: AbortSignal;
}

function positiveInt(name: string, value: unknown, min: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min) {
    throw invalidArgument(min === 0 ? 'a non-negative integer' : `an integer >= ${min}`, name, value);
  }
  return value;
}

/** Cuts `text` to `max` code units without splitting a surrogate pair; says how much was cut. */
export function truncateOutput(text: string, max: number): { text: string; truncated: boolean } {
  if (text.length <= max) return { text, truncated: false };
  let cut = max;
  const c = text.charCodeAt(cut - 1);
  if (c >= 0xd800 && c <= 0xdbff) cut -= 1;
  return { text: `${text.slice(0, cut)}\n[output truncated: ${text.length - cut} more characters]`, truncated: true };
}

/** FIFO counting semaphore whose waiters can be cancelled. */
class Pool {
  private active = 0;
  private readonly waiting: Array<{ go: () => void; cancel: () => void }> = [];
  constructor(private readonly size: number) {}

  /** Resolves to a release function, or rejects when `signal` aborts first. */
  acquire(signal?: AbortSignal): Promise<() => void> {
    const release = () => {
      this.active -= 1;
      const next = this.waiting.shift();
      if (next) next.go();
    };
    if (this.active < this.size) {
      this.active += 1;
      return Promise.resolve(release);
    }
    return new Promise((resolve, reject) => {
      const entry = {
        go: () => {
          signal?.removeEventListener('abort', entry.cancel);
          this.active += 1;
          resolve(release);
        },
        cancel: () => {
          const i = this.waiting.indexOf(entry);
          if (i >= 0) this.waiting.splice(i, 1);
          reject(new ArpoError('TOOL_FAILED', 'cancelled while queued'));
        },
      };
      if (signal?.aborted) return entry.cancel();
      signal?.addEventListener('abort', entry.cancel, { once: true });
      this.waiting.push(entry);
    });
  }

  get queued(): number {
    return this.waiting.length;
  }
}

type Attempt = { kind: 'output'; output: ToolOutput } | { kind: 'error'; error: unknown } | { kind: 'timeout' } | { kind: 'aborted' };

function toOutput(value: string | ToolOutput): ToolOutput {
  if (typeof value === 'string') return { text: value };
  if (value !== null && typeof value === 'object' && typeof value.text === 'string') return value;
  return { text: `tool returned ${typeof value} instead of text`, ok: false };
}

function errorMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => (clearTimeout(t), resolve()), { once: true });
  });

/**
 * The registry of mounted tools and the pool that runs their calls.
 * `run(tag, content)` never throws for a tool's failure: it returns a
 * {@link ToolRunResult} whose text explains what went wrong.
 */
export class ToolRunner {
  readonly concurrency: number;
  readonly timeoutMs: number;
  readonly retries: number;
  readonly retryDelayMs: number;
  readonly maxOutputChars: number;
  readonly maxInputChars: number;
  readonly replay: ReplayMode;
  private readonly cache: ToolCallCache | undefined;
  private readonly ownsCache: boolean;
  private readonly tools = new Map<string, Tool>();
  private readonly stats = new Map<string, ToolMetrics>();
  private readonly inflight = new Map<string, Promise<ToolRunResult>>();
  /** One pool of `concurrency` slots per mounted tag. */
  private readonly pools = new Map<string, Pool>();

  constructor(options: ToolRunnerOptions = {}) {
    if (options === null || typeof options !== 'object') throw invalidArgument('an options object', 'options', options);
    this.concurrency = positiveInt('concurrency', options.concurrency ?? 8, 1);
    this.timeoutMs = positiveInt('timeoutMs', options.timeoutMs ?? 60000, 1);
    this.retries = positiveInt('retries', options.retries ?? 1, 0);
    this.retryDelayMs = positiveInt('retryDelayMs', options.retryDelayMs ?? 100, 0);
    this.maxOutputChars = positiveInt('maxOutputChars', options.maxOutputChars ?? 10000, 1);
    this.maxInputChars = positiveInt('maxInputChars', options.maxInputChars ?? 100000, 1);
    this.cache = options.cache;
    const replay = options.replay ?? (options.cache ? 'auto' : 'off');
    if (!REPLAY_MODES.includes(replay)) throw invalidArgument(`one of ${REPLAY_MODES.join(', ')}`, 'replay', replay);
    if (replay !== 'off' && !options.cache) throw invalidArgument(`a cache for replay mode ${replay}`, 'cache', options.cache);
    this.replay = replay;
    this.ownsCache = options.ownsCache ?? false;
  }

  /** Mounts a tool under its tag; a tag holds one tool. */
  register(tool: Tool): this {
    if (tool === null || typeof tool !== 'object' || typeof tool.execute !== 'function') {
      throw invalidArgument('a Tool (name, tag, execute)', 'tool', tool);
    }
    if (typeof tool.name !== 'string' || tool.name.length === 0) throw invalidArgument('a non-empty string', 'tool.name', tool.name);
    if (typeof tool.tag !== 'string' || !/^[A-Za-z][A-Za-z0-9_-]*$/.test(tool.tag)) throw invalidArgument('a tag name', 'tool.tag', tool.tag);
    const held = this.tools.get(tool.tag);
    if (held) throw new ArpoError('INVALID_ARGUMENT', `Tag ${JSON.stringify(tool.tag)} already holds tool ${JSON.stringify(held.name)}`);
    this.tools.set(tool.tag, tool);
    this.pools.set(tool.tag, new Pool(this.concurrency));
    if (!this.stats.has(tool.name)) {
      this.stats.set(tool.name, { calls: 0, ok: 0, failures: 0, timeouts: 0, retries: 0, cacheHits: 0, totalMs: 0, maxMs: 0 });
    }
    return this;
  }

  /** The mounted tags. */
  get tags(): string[] {
    return [...this.tools.keys()];
  }

  /** The tool under `tag` (throws listing the mounted tags). */
  tool(tag: string): Tool {
    const t = this.tools.get(tag);
    if (!t) throw unknownName('tool tag', tag, this.tags);
    return t;
  }

  /** Calls queued behind their tool's concurrency limit right now (all tools). */
  get queued(): number {
    let n = 0;
    for (const p of this.pools.values()) n += p.queued;
    return n;
  }

  /** Per-tool counters (copies), keyed by tool name. */
  metrics(): Record<string, ToolMetrics> {
    const out: Record<string, ToolMetrics> = {};
    for (const [name, m] of this.stats) out[name] = { ...m };
    return out;
  }

  /** Namespaced metrics for the training log: `tools/<name>/calls`, `.../mean_ms`, `.../success_rate`, … */
  metricsFlat(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [name, m] of this.stats) {
      const executed = m.calls - m.cacheHits;
      out[`tools/${name}/calls`] = m.calls;
      out[`tools/${name}/failures`] = m.failures;
      out[`tools/${name}/timeouts`] = m.timeouts;
      out[`tools/${name}/cache_hits`] = m.cacheHits;
      out[`tools/${name}/success_rate`] = m.calls ? m.ok / m.calls : 0;
      out[`tools/${name}/mean_ms`] = executed ? m.totalMs / executed : 0;
    }
    return out;
  }

  /** Runs the call `<tag>content</tag>`. Never throws for a tool's failure. */
  async run(tag: string, content: string, options: RunOptions = {}): Promise<ToolRunResult> {
    if (typeof tag !== 'string') throw invalidArgument('a string', 'tag', tag);
    if (typeof content !== 'string') throw invalidArgument('a string', 'content', content);
    const tool = this.tools.get(tag);
    if (!tool) {
      const text = `Error: no tool is mounted for <${tag}>; mounted: ${this.tags.map((t) => `<${t}>`).join(', ') || 'none'}.`;
      return { text, ok: false, error: 'unknown tag', timedOut: false, ms: 0, cached: false, attempts: 0, truncated: false };
    }
    const m = this.stats.get(tool.name) as ToolMetrics;
    m.calls += 1;
    if (content.length > this.maxInputChars) {
      m.failures += 1;
      const text = `Error: the <${tag}> call is ${content.length} characters long; the limit is ${this.maxInputChars}.`;
      return { text, ok: false, error: 'input too long', timedOut: false, ms: 0, cached: false, attempts: 0, truncated: false };
    }
    const useCache = this.replay !== 'off' && this.cache !== undefined && tool.cacheable !== false;
    if (!useCache) return this.account(m, await this.execute(tool, content, options.signal));

    const cache = this.cache as ToolCallCache;
    const key = callKey(tool.name, tool.cacheKey ?? '', content);
    const started = performance.now();
    if (this.replay !== 'record') {
      const hit = cache.get(tool.name, key);
      if (hit) {
        m.cacheHits += 1;
        if (hit.ok) m.ok += 1;
        else m.failures += 1;
        const cut = truncateOutput(hit.text, this.maxOutputChars);
        return { text: cut.text, ok: hit.ok, timedOut: false, ms: performance.now() - started, cached: true, attempts: 0, truncated: cut.truncated, ...(hit.meta ? { meta: hit.meta } : {}) };
      }
      if (this.replay === 'replay') {
        m.failures += 1;
        const text = `Error: no recorded result for this <${tag}> call (replay mode).`;
        return { text, ok: false, error: 'replay miss', timedOut: false, ms: 0, cached: false, attempts: 0, truncated: false };
      }
    }
    // One execution per identical question at a time: later callers join it.
    const running = this.inflight.get(key);
    if (running) {
      m.cacheHits += 1;
      const joined = await this.join(running, options.signal, tag);
      if (joined.ok) m.ok += 1;
      else if (joined.timedOut) m.timeouts += 1;
      else m.failures += 1;
      return { ...joined, cached: true, attempts: 0 };
    }
    const work = this.execute(tool, content, options.signal).then((r) => {
      // Only answers are stored: a failure or timeout may succeed next time.
      if (r.ok) cache.put(tool.name, key, content, { text: r.text, ok: true, ms: r.ms, ...(r.meta ? { meta: r.meta } : {}) });
      return r;
    });
    this.inflight.set(key, work);
    try {
      return this.account(m, await work);
    } finally {
      this.inflight.delete(key);
    }
  }

  private async join(running: Promise<ToolRunResult>, signal: AbortSignal | undefined, tag: string): Promise<ToolRunResult> {
    if (!signal) return running;
    const aborted = new Promise<ToolRunResult>((resolve) => {
      const done = () => resolve(cancelled(tag, 0));
      if (signal.aborted) done();
      else signal.addEventListener('abort', done, { once: true });
    });
    return Promise.race([running, aborted]);
  }

  private account(m: ToolMetrics, r: ToolRunResult): ToolRunResult {
    if (r.ok) m.ok += 1;
    else if (r.timedOut) m.timeouts += 1;
    else m.failures += 1;
    if (r.attempts > 1) m.retries += r.attempts - 1;
    m.totalMs += r.ms;
    m.maxMs = Math.max(m.maxMs, r.ms);
    return r;
  }

  /** Queue, then attempts with timeout and retries; returns the final verdict. */
  private async execute(tool: Tool, content: string, signal: AbortSignal | undefined): Promise<ToolRunResult> {
    let release: () => void;
    try {
      release = await (this.pools.get(tool.tag) as Pool).acquire(signal);
    } catch {
      return cancelled(tool.tag, 0);
    }
    const started = performance.now();
    try {
      let attempts = 0;
      for (;;) {
        attempts += 1;
        const a = await this.attempt(tool, content, signal);
        const ms = performance.now() - started;
        if (a.kind === 'output') {
          const cut = truncateOutput(a.output.text, this.maxOutputChars);
          const ok = a.output.ok !== false;
          return {
            text: cut.text,
            ok,
            ...(ok ? {} : { error: 'tool reported failure' }),
            timedOut: false,
            ms,
            cached: false,
            attempts,
            truncated: cut.truncated,
            ...(a.output.meta ? { meta: a.output.meta } : {}),
          };
        }
        if (a.kind === 'aborted') return cancelled(tool.tag, ms, attempts);
        if (a.kind === 'timeout') {
          const text = `Error: tool <${tool.tag}> timed out after ${(this.timeoutMs / 1000).toFixed(1)} s.`;
          return { text, ok: false, error: 'timeout', timedOut: true, ms, cached: false, attempts, truncated: false };
        }
        if (attempts > this.retries) {
          const msg = errorMessage(a.error);
          const cut = truncateOutput(`Error: tool <${tool.tag}> failed: ${msg}`, this.maxOutputChars);
          return { text: cut.text, ok: false, error: msg, timedOut: false, ms, cached: false, attempts, truncated: cut.truncated };
        }
        await sleep(this.retryDelayMs * 2 ** (attempts - 1), signal);
      }
    } finally {
      release();
    }
  }

  /** One attempt: the tool's promise raced against the timeout and the caller's signal. */
  private attempt(tool: Tool, content: string, outer: AbortSignal | undefined): Promise<Attempt> {
    if (outer?.aborted) return Promise.resolve({ kind: 'aborted' });
    const ac = new AbortController();
    let timer: NodeJS.Timeout | undefined;
    let onOuter: (() => void) | undefined;
    const stop = new Promise<Attempt>((resolve) => {
      timer = setTimeout(() => {
        ac.abort(new ArpoError('TOOL_TIMEOUT', `timed out after ${this.timeoutMs} ms`));
        resolve({ kind: 'timeout' });
      }, this.timeoutMs);
      if (outer) {
        onOuter = () => {
          ac.abort(outer.reason);
          resolve({ kind: 'aborted' });
        };
        outer.addEventListener('abort', onOuter, { once: true });
      }
    });
    let work: Promise<Attempt>;
    try {
      work = Promise.resolve(tool.execute(content, { signal: ac.signal })).then(
        (v): Attempt => ({ kind: 'output', output: toOutput(v) }),
        (error: unknown): Attempt => ({ kind: 'error', error }),
      );
    } catch (error) {
      work = Promise.resolve({ kind: 'error', error });
    }
    return Promise.race([work, stop]).finally(() => {
      clearTimeout(timer);
      if (outer && onOuter) outer.removeEventListener('abort', onOuter);
      // Tell a tool that is still running (it lost the race) to stop.
      if (!ac.signal.aborted) ac.abort(new ArpoError('TOOL_FAILED', 'call settled'));
    });
  }

  /** Closes every mounted tool (processes, connections, index files), and the cache when it owns it. */
  async close(): Promise<void> {
    const errors: unknown[] = [];
    for (const t of this.tools.values()) {
      try {
        await t.close?.();
      } catch (e) {
        errors.push(e);
      }
    }
    this.tools.clear();
    if (this.ownsCache) this.cache?.close();
    if (errors.length) throw new ArpoError('TOOL_FAILED', `Closing tools failed: ${errors.map(errorMessage).join('; ')}`);
  }
}

function cancelled(tag: string, ms: number, attempts = 0): ToolRunResult {
  return { text: `Error: the <${tag}> call was cancelled.`, ok: false, error: 'cancelled', timedOut: false, ms, cached: false, attempts, truncated: false };
}
