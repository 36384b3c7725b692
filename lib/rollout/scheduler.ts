// The rollout scheduler: continuous batching over every active path of every
// prompt (prefill and decode in one engine call), tool calls running
// concurrently with decoding, ARPO's entropy-driven branching and the
// trajectory-level baseline through the same code path.
//
// Departures from the reference implementation (ARPO.md section 1), each tested:
// - entropy is the sampler's exact full-vocabulary entropy (top-k estimate optional);
// - the baseline H_initial belongs to the trajectory (branches inherit it) and
//   lives only as long as this call, so it never leaks across prompts or steps;
// - the decision after tool call c uses the window after result c, not the
//   segment that led to the call;
// - a prompt whose paths all finished under budget gets fresh global samples,
//   never duplicated trajectories; they are decoded speculatively from the
//   start up to their first tool call (setting speculativeRefills), which
//   changes when their tokens are computed, not which tokens or calls;
// - over the tool-call limit a path ends without a forced, trained EOS token;
// - branches fork the KV cache at the end of the tool result (nothing recomputed).
import { setMaxListeners } from 'events';
import { ArpoError, invalidArgument } from '../errors';
import type { GenerationEngine } from '../model/types';
import { DEFAULT_PROTOCOL, formatResult, parseToolCall, type ToolProtocol } from '../tools/protocol';
import { branchFires, branchProbability, decisionUniform, EntropyWindow, pathStream, PREFILL_STREAM_ORDER, refillStreamOrder, seedToU64, topKEntropy } from './branching';
import { emptyMetrics, finalizeMetrics, type MetricsAccumulator } from './metrics';
import { PathState, PromptState, SpeculativeRefill, type BranchRequest } from './prompt-state';
import { resolveRolloutSettings, type RolloutSettings } from './settings';
import { stopCompletedBy } from './stops';
import { accountSlots, type RolloutTrace } from './trace';
import type { RolloutTree } from './tree';
import type { BranchDecision, FinishReason, RolloutMetrics, TokenText, ToolExecution, ToolExecutor, TopLogprobsResult, TopLogprobsSampling } from './types';

/** What a rollout needs from the rest of the system. */
export interface RolloutDeps {
  engine: GenerationEngine;
  /** Detokenises generated tails (stop strings, tool calls) and encodes tool results once. */
  text: TokenText;
  executeTool: ToolExecutor;
  /** Tags, result wrapper and escaping (lib/tools); its stop strings end a segment. */
  protocol?: ToolProtocol;
  /** Tokens that end a trajectory (`eos`). */
  eosTokenIds: readonly number[];
}

export interface RolloutResult {
  /** One tree per prompt, in prompt order; leaves in path-creation order. */
  trees: RolloutTree[];
  /** Every branch decision, by (prompt, path, tool call). */
  decisions: BranchDecision[];
  metrics: RolloutMetrics;
  /** Every engine call and tool call with its time (rollout setting `trace`). */
  trace?: RolloutTrace;
}

interface ToolDone {
  path: PathState;
  tag: string;
  content: string;
  result?: ToolExecution;
  error?: unknown;
  ms: number;
  atMs: number;
}

type BatchEntry = { root: PromptState } | { path: PathState } | { refill: SpeculativeRefill; prompt: PromptState };

/** How a sampled token ends its segment, if it does (the checks in onSample's order). */
type SegmentEnd = { finish: FinishReason } | { call: { tag: string; content: string } } | null;

/** Runs one rollout step: ARPO trees or M independent trajectories per prompt (settings.mode). */
export async function rollout(
  deps: RolloutDeps,
  prompts: readonly ArrayLike<number>[],
  seed: bigint | number,
  settings: Partial<RolloutSettings> = {},
  options: RolloutOptions = {},
): Promise<RolloutResult> {
  return new RolloutRun(deps, prompts, seed, resolveRolloutSettings(settings), options).run();
}

export interface RolloutOptions {
  /**
   * Per prompt, the key of its random streams (default: its index here). A
   * data-parallel rank passes the prompts' indices in the global batch, so
   * each tree is the one a single process would sample.
   */
  streamKeys?: readonly number[];
}

class RolloutRun {
  private readonly engine: GenerationEngine;
  private readonly protocol: ToolProtocol;
  private readonly eos: Set<number>;
  private readonly stops: string[];
  private readonly answerClose: string;
  private readonly prompts: PromptState[];
  private readonly seed: bigint;
  private readonly abort = new AbortController();
  private readonly toolDone: ToolDone[] = [];
  private wake: (() => void) | null = null;
  private toolsInFlight = 0;
  private rotation = 0;
  private readonly decisions: BranchDecision[] = [];
  private readonly m: MetricsAccumulator;
  private readonly trace: RolloutTrace | undefined;
  private t0 = 0;

  constructor(
    private readonly deps: RolloutDeps,
    promptsIn: readonly ArrayLike<number>[],
    seed: bigint | number,
    private readonly s: RolloutSettings,
    options: RolloutOptions = {},
  ) {
    if (!deps || typeof deps !== 'object') throw invalidArgument('a dependencies object', 'deps', deps);
    this.engine = deps.engine;
    if (!this.engine || typeof this.engine.extend !== 'function') throw invalidArgument('a GenerationEngine', 'deps.engine', this.engine);
    if (!deps.text || typeof deps.text.decode !== 'function' || typeof deps.text.encode !== 'function') {
      throw invalidArgument('a TokenText (encode, decode)', 'deps.text', deps.text);
    }
    if (typeof deps.executeTool !== 'function') throw invalidArgument('a function (tag, content, signal)', 'deps.executeTool', deps.executeTool);
    if (!Array.isArray(deps.eosTokenIds)) throw invalidArgument('an array of token ids', 'deps.eosTokenIds', deps.eosTokenIds);
    this.protocol = deps.protocol ?? DEFAULT_PROTOCOL;
    this.eos = new Set(deps.eosTokenIds);
    this.answerClose = `</${this.protocol.answerTag}>`;
    this.stops = [...this.protocol.stopStrings, this.answerClose];
    this.seed = seedToU64(seed);
    if (!Array.isArray(promptsIn) || promptsIn.length === 0) throw invalidArgument('a non-empty array of prompts', 'prompts', promptsIn);
    const keys = options.streamKeys;
    if (keys !== undefined) {
      if (!Array.isArray(keys) || keys.length !== promptsIn.length) throw invalidArgument(`an array of ${promptsIn.length} stream keys`, 'options.streamKeys', keys);
      keys.forEach((k, i) => {
        if (!Number.isInteger(k) || k < 0 || k >= 2 ** 31) throw invalidArgument('a prompt index in [0, 2^31)', `options.streamKeys[${i}]`, k);
      });
      if (new Set(keys).size !== keys.length) throw invalidArgument('distinct stream keys', 'options.streamKeys', keys);
    }
    this.prompts = promptsIn.map((p, i) => {
      if (p === null || typeof p !== 'object' || typeof p.length !== 'number' || p.length === 0) {
        throw invalidArgument('a non-empty array of token ids', `prompts[${i}]`, p);
      }
      for (let j = 0; j < p.length; j++) {
        const t = p[j] as number;
        if (!Number.isInteger(t) || t < 0 || t >= this.engine.vocabSize) throw invalidArgument(`a token id in [0, ${this.engine.vocabSize})`, `prompts[${i}][${j}]`, t);
      }
      return new PromptState(i, Int32Array.from(p), this.engine.vocabSize, s, keys ? keys[i] : i);
    });
    this.m = emptyMetrics(s.mode);
    this.trace = s.trace ? { engineCalls: [], toolCalls: [] } : undefined;
    // Every running tool call listens on this one signal.
    setMaxListeners(0, this.abort.signal);
  }

  async run(): Promise<RolloutResult> {
    const t0 = performance.now();
    this.t0 = t0;
    try {
      for (const p of this.prompts) this.startPrompt(p);
      while (this.prompts.some((p) => !p.done)) {
        this.drainTools();
        for (const p of this.prompts) if (!p.done) this.settle(p);
        const batch = this.collectBatch();
        if (batch.length === 0) {
          if (this.toolsInFlight === 0 && this.toolDone.length === 0) {
            if (this.prompts.some((p) => !p.done)) throw new ArpoError('NATIVE_OP_FAILED', 'rollout: no path is ready and no tool is running (scheduler invariant broken)');
            break;
          }
          if (this.toolDone.length === 0) {
            const w = performance.now();
            await new Promise<void>((resolve) => (this.wake = resolve));
            const waited = performance.now() - w;
            this.m.toolWaitMs += waited;
            accountSlots(this.prompts, waited, this.m.slotMs);
          }
          continue;
        }
        await this.step(batch);
      }
    } catch (e) {
      this.abort.abort();
      this.freeAll();
      throw e;
    }
    for (const p of this.prompts) p.tree.canonicalize();
    // Formation order depends on timing; (prompt, path, tool call) does not.
    this.decisions.sort((a, b) => a.prompt - b.prompt || a.path - b.path || a.toolCall - b.toolCall);
    this.m.wallMs = performance.now() - t0;
    return { trees: this.prompts.map((p) => p.tree), decisions: this.decisions, metrics: finalizeMetrics(this.m, this.prompts.map((p) => p.tree)), ...(this.trace ? { trace: this.trace } : {}) };
  }

  // ---- paths -------------------------------------------------------------

  /** Prefill the prompt minus its last token once; every global sample forks it and feeds the last token. */
  private startPrompt(p: PromptState): void {
    if (p.promptTokens.length > 1) {
      p.rootEngineId = this.engine.newPath(pathStream(p.streamKey, PREFILL_STREAM_ORDER));
      p.rootInput = p.promptTokens.subarray(0, p.promptTokens.length - 1);
    } else {
      p.rootReady = true;
      this.spawnGlobal(p, this.s.initialSamples, 'global');
    }
  }

  private spawnGlobal(p: PromptState, count: number, origin: 'global' | 'refill'): void {
    const last = p.promptTokens[p.promptTokens.length - 1] as number;
    for (let i = 0; i < count; i++) {
      // Refill i samples from its own stream whenever it starts (see refillStreamOrder).
      const stream = origin === 'refill' ? pathStream(p.streamKey, refillStreamOrder(i)) : undefined;
      const path = p.newPath(origin, { node: 0, toolCalls: 0, responseTokens: 0 }, stream);
      path.engineId = this.forkRoot(p, path.stream);
      path.input = Int32Array.of(last);
      this.m.paths[origin]++;
    }
    if (origin === 'global' && this.s.mode === 'arpo' && this.s.speculativeRefills) {
      // Every refill the prompt may need, started now (kept or dropped in settle).
      for (let j = 0; j < p.remaining; j++) {
        const r = new SpeculativeRefill(j, pathStream(p.streamKey, refillStreamOrder(j)));
        r.engineId = this.forkRoot(p, r.stream);
        r.input = Int32Array.of(last);
        p.speculative.push(r);
        this.m.speculation.started++;
      }
    }
  }

  /** A new engine path that continues the prompt (its cached prefix when there is one). */
  private forkRoot(p: PromptState, stream: bigint): number {
    return p.rootEngineId >= 0 ? this.engine.fork(p.rootEngineId, p.promptTokens.length - 1, stream) : this.engine.newPath(stream);
  }

  /** Drops the speculative refills the prompt can no longer need (index >= what is left of its budget). */
  private dropSpeculative(p: PromptState, keepBelow: number): void {
    if (p.speculative.length === 0) return;
    const keep: SpeculativeRefill[] = [];
    for (const r of p.speculative) {
      if (r.index < keepBelow) {
        keep.push(r);
        continue;
      }
      if (r.engineId >= 0) this.engine.freePath(r.engineId);
      r.engineId = -1;
      this.m.speculation.tokensDropped += r.tokens.length;
    }
    p.speculative = keep;
  }

  /**
   * The prompt ended under budget: its speculative refills 0..remaining-1
   * become refill paths, in index order, exactly as spawnGlobal would create
   * them now; their samples so far are replayed into the tree (a tool call
   * they stopped at runs now).
   */
  private keepSpeculative(p: PromptState): void {
    const kept = p.speculative;
    p.speculative = [];
    if (kept.length !== p.remaining || kept.some((r, j) => r.index !== j)) {
      throw new ArpoError('NATIVE_OP_FAILED', `rollout: prompt ${p.index} needs ${p.remaining} refills but holds speculative refills [${kept.map((r) => r.index).join(', ')}] (scheduler invariant broken)`);
    }
    for (const r of kept) {
      const path = p.newPath('refill', { node: 0, toolCalls: 0, responseTokens: 0 }, r.stream);
      path.engineId = r.engineId;
      r.engineId = -1;
      this.m.paths.refill++;
      this.m.speculation.kept++;
      if (r.samples.length === 0) path.input = r.input;
      for (const x of r.samples) this.onSample(path, x.token, x.logprob, x.entropy, x.normEntropy, x.estimate);
    }
  }

  private release(path: PathState): void {
    if (path.status === 'finished' && path.holds === 0 && path.engineId >= 0) {
      this.engine.freePath(path.engineId);
      path.engineId = -1;
    }
  }

  private freeAll(): void {
    for (const p of this.prompts) {
      for (const path of p.paths) {
        if (path.engineId >= 0) {
          try {
            this.engine.freePath(path.engineId);
          } catch {
            /* already failing: keep the first error */
          }
          path.engineId = -1;
        }
      }
      for (const r of p.speculative) {
        if (r.engineId >= 0) {
          try {
            this.engine.freePath(r.engineId);
          } catch {
            /* as above */
          }
          r.engineId = -1;
        }
      }
      if (p.rootEngineId >= 0) {
        try {
          this.engine.freePath(p.rootEngineId);
        } catch {
          /* as above */
        }
        p.rootEngineId = -1;
      }
    }
  }

  // ---- batching ----------------------------------------------------------

  /**
   * Every ready path (and pending prompt prefill), up to the batch limits.
   * The scan starts one prompt further each call, so under the limits no
   * prompt waits behind the others; the order never affects what is sampled.
   */
  private collectBatch(): BatchEntry[] {
    const batch: BatchEntry[] = [];
    let tokens = 0;
    const fits = (n: number): boolean => batch.length < this.s.maxBatchPaths && (batch.length === 0 || tokens + n <= this.s.maxBatchTokens);
    const count = this.prompts.length;
    for (let i = 0; i < count; i++) {
      const p = this.prompts[(this.rotation + i) % count] as PromptState;
      if (p.rootInput && !p.rootInFlight && fits(p.rootInput.length)) {
        batch.push({ root: p });
        tokens += p.rootInput.length;
      }
      for (const path of p.paths) {
        if (path.status !== 'decode' || !path.input || path.inFlight) continue;
        if (!fits(path.input.length)) continue;
        batch.push({ path });
        tokens += path.input.length;
      }
    }
    // Speculative refills take what room is left: never a slot a budgeted path could use.
    for (let i = 0; i < count; i++) {
      const p = this.prompts[(this.rotation + i) % count] as PromptState;
      for (const refill of p.speculative) {
        if (refill.parked || !refill.input || refill.inFlight || !fits(refill.input.length)) continue;
        batch.push({ refill, prompt: p });
        tokens += refill.input.length;
      }
    }
    this.rotation = (this.rotation + 1) % count;
    return batch;
  }

  private async step(batch: BatchEntry[]): Promise<void> {
    const ids: number[] = [];
    const inputs: Int32Array[] = [];
    let tokens = 0;
    let keys = 0;
    for (const e of batch) {
      // The row's cached length after the call: the prompt's prefill, or the prompt and the response so far.
      let after: number;
      if ('root' in e) {
        e.root.rootInFlight = true;
        ids.push(e.root.rootEngineId);
        inputs.push(e.root.rootInput as Int32Array);
        after = (e.root.rootInput as Int32Array).length;
      } else {
        const x = 'path' in e ? e.path : e.refill;
        x.inFlight = true;
        ids.push(x.engineId);
        inputs.push(x.input as Int32Array);
        after = 'path' in e ? e.path.prompt.promptTokens.length + e.path.responseTokens : e.prompt.promptTokens.length + e.refill.tokens.length;
      }
      const n = (inputs[inputs.length - 1] as Int32Array).length;
      tokens += n;
      keys += n * (after - n) + (n * (n + 1)) / 2;
    }
    this.m.tokensComputed += tokens;
    const sampling: TopLogprobsSampling = { temperature: this.s.temperature, topK: this.s.topK, topP: this.s.topP, seed: this.seed };
    const topK = this.s.entropyEstimate === 'top-k' ? this.s.entropyTopK : 0;
    if (topK > 0) sampling.topLogprobs = topK;
    const t = performance.now();
    const out = (await this.engine.extend(ids, inputs, sampling)) as TopLogprobsResult;
    const ms = performance.now() - t;
    this.m.modelMs += ms;
    this.m.engineCalls++;
    this.m.engineRows += batch.length;
    this.m.maxBatchPaths = Math.max(this.m.maxBatchPaths, batch.length);
    // Accounted before the samples change any path's state (the batch's paths are still inFlight).
    accountSlots(this.prompts, ms, this.m.slotMs);
    if (this.trace) {
      this.trace.engineCalls.push({ atMs: t - this.t0, ms, rows: batch.length, tokens, keys, prefills: batch.filter((e) => 'root' in e).length, speculative: batch.filter((e) => 'refill' in e).length });
    }
    if (!out || out.tokens?.length !== batch.length) {
      throw new ArpoError('NATIVE_OP_FAILED', `rollout: engine.extend returned ${out?.tokens?.length} tokens for ${batch.length} paths`);
    }
    if (topK > 0 && !(out.topLogprobs instanceof Float32Array && out.topLogprobs.length === batch.length * topK)) {
      throw new ArpoError('BAD_CONFIG', `rollout: entropyEstimate 'top-k' needs an engine that returns topLogprobs (${batch.length} x ${topK}); this one does not`);
    }
    batch.forEach((e, i) => {
      if ('root' in e) {
        // The prompt is in the cache; its sampled token is discarded. Global samples fork it now.
        e.root.rootInFlight = false;
        e.root.rootInput = null;
        e.root.rootReady = true;
        this.spawnGlobal(e.root, this.s.initialSamples, 'global');
        return;
      }
      const x = 'path' in e ? e.path : e.refill;
      x.inFlight = false;
      x.input = null;
      const estimate = topK > 0 ? topKEntropy(out.topLogprobs as Float32Array, i * topK, topK, this.engine.vocabSize) : (out.normEntropies[i] as number);
      if ('path' in e) this.onSample(e.path, out.tokens[i] as number, out.logprobs[i] as number, out.entropies[i] as number, out.normEntropies[i] as number, estimate);
      else this.onSpeculativeSample(e.refill, out.tokens[i] as number, out.logprobs[i] as number, out.entropies[i] as number, out.normEntropies[i] as number, estimate);
    });
  }

  // ---- one sampled token -------------------------------------------------

  private onSample(path: PathState, token: number, logprob: number, entropy: number, normEntropy: number, estimate: number): void {
    const tree = path.prompt.tree;
    if (tree.node(path.node).kind !== 'generated') {
      path.node = tree.addGenerated(path.node, path.order, path.fresh ? path.origin : undefined);
      path.fresh = false;
    }
    tree.appendGenerated(path.node, token, logprob, entropy, normEntropy);
    path.responseTokens++;
    path.initialWindow?.add(estimate);
    if (path.post && path.post.window.add(estimate)) this.formRequest(path);

    const end = this.segmentEnd(tree.node(path.node).tokens, token, path.responseTokens);
    if (end === null) path.input = Int32Array.of(token);
    else if ('finish' in end) this.finish(path, end.finish);
    else this.callTool(path, token, end.call.tag, end.call.content);
  }

  /** A speculative refill's sample: kept outside the tree; the refill parks where its first segment ends. */
  private onSpeculativeSample(r: SpeculativeRefill, token: number, logprob: number, entropy: number, normEntropy: number, estimate: number): void {
    r.samples.push({ token, logprob, entropy, normEntropy, estimate });
    r.tokens.push(token);
    // A fresh sample's response so far is its segment.
    r.parked = this.segmentEnd(r.tokens, token, r.tokens.length) !== null;
    r.input = r.parked ? null : Int32Array.of(token);
  }

  private segmentEnd(segment: readonly number[], token: number, responseTokens: number): SegmentEnd {
    if (this.eos.has(token)) return { finish: 'eos' };
    const stop = stopCompletedBy(segment, this.deps.text, this.stops);
    if (stop === this.answerClose) return { finish: 'answer' };
    if (responseTokens >= this.s.maxResponseTokens) return { finish: 'length' };
    if (stop !== undefined) {
      const call = parseToolCall(this.deps.text.decode(segment), this.protocol, { from: 0 });
      if (call.kind === 'call') return { call: { tag: call.tag, content: call.content } };
      // A closing tag without its call (stray, or inside <think> with callsInThink 'ignore'): keep generating.
    }
    return null;
  }

  /** Ends the path's current segment: closes its initial window, forms the pending branch request. */
  private endSegment(path: PathState): void {
    if (path.initialWindow) {
      path.initialEntropy = path.initialWindow.mean;
      path.initialWindow = null;
    }
    if (path.post && path.post.window.count > 0) this.formRequest(path);
    path.post = null;
  }

  private finish(path: PathState, reason: FinishReason): void {
    this.endSegment(path);
    path.prompt.tree.addLeaf(path.node, reason, { path: path.order, origin: path.origin, stream: path.stream, toolCalls: path.toolCalls });
    path.status = 'finished';
    path.input = null;
    this.m.finishReasons[reason]++;
    this.release(path);
  }

  // ---- tools ---------------------------------------------------------------

  private callTool(path: PathState, closingToken: number, tag: string, content: string): void {
    const node = path.prompt.tree.node(path.node);
    const k = Math.min(this.s.entropyWindow, node.normEntropies.length);
    let before = 0;
    for (let i = node.normEntropies.length - k; i < node.normEntropies.length; i++) before += node.normEntropies[i] as number;
    this.m.addEntropy(this.m.entropyBefore, tag, k > 0 ? before / k : 0);
    if (path.toolCalls >= this.s.toolCallLimit) {
      // Over the limit: the call is not run and nothing is appended (no forced EOS to train on).
      this.m.tool(tag).overLimit++;
      return this.finish(path, 'tool_limit');
    }
    this.endSegment(path);
    path.status = 'tool';
    path.pendingToken = closingToken;
    this.toolsInFlight++;
    const start = performance.now();
    const done = (d: Omit<ToolDone, 'path' | 'tag' | 'content' | 'ms' | 'atMs'>): void => {
      this.toolsInFlight--;
      this.toolDone.push({ path, tag, content, ms: performance.now() - start, atMs: start - this.t0, ...d });
      const w = this.wake;
      this.wake = null;
      w?.();
    };
    Promise.resolve()
      .then(() => this.deps.executeTool(tag, content, this.abort.signal))
      .then(
        (r) => done({ result: typeof r === 'string' ? { text: r, ok: true } : r }),
        (error: unknown) => done({ error }),
      );
  }

  /** Appends finished tool results (in the main loop, between engine calls, so no engine call overlaps a fork). */
  private drainTools(): void {
    while (this.toolDone.length > 0) {
      const d = this.toolDone.shift() as ToolDone;
      const path = d.path;
      if (path.status !== 'tool') continue;
      const counts = this.m.tool(d.tag);
      counts.executed++;
      this.m.toolMs += d.ms;
      if (this.trace) {
        const own = d.result?.ms;
        this.trace.toolCalls.push({ tag: d.tag, atMs: d.atMs, ms: d.ms, ownMs: typeof own === 'number' && Number.isFinite(own) ? own : null });
      }
      let output: string;
      let ok: boolean;
      let cached = false;
      if (d.result && typeof d.result.text === 'string') {
        output = d.result.text;
        ok = d.result.ok !== false;
        cached = d.result.cached === true;
      } else {
        const msg = d.error instanceof Error ? d.error.message : d.result ? 'the tool returned no text' : String(d.error);
        output = `Error: ${msg}`;
        ok = false;
      }
      if (!ok) counts.failed++;
      if (cached) counts.cached++;
      const tokens = Int32Array.from(this.deps.text.encode(formatResult(output, this.protocol)));
      path.status = 'decode';
      if (tokens.length === 0 || path.responseTokens + tokens.length > this.s.maxResponseTokens) {
        // The result does not fit the response budget: the trajectory ends at its call.
        this.m.toolResultsDropped++;
        this.finish(path, 'length');
        continue;
      }
      const tree = path.prompt.tree;
      const node = tree.addToolResult(path.node, tokens, { tag: d.tag, content: d.content, ok, cached, ms: d.ms }, path.order);
      path.node = node;
      path.toolCalls++;
      path.responseTokens += tokens.length;
      // The closing token was sampled but never fed: it goes in with the result, in one prefill.
      const input = new Int32Array(tokens.length + 1);
      input[0] = path.pendingToken;
      input.set(tokens, 1);
      path.input = input;
      path.post = {
        round: path.toolCalls,
        tag: d.tag,
        window: new EntropyWindow(this.s.entropyWindow),
        resultNode: node,
        resultEnd: tree.node(node).start + tokens.length,
        lastResultToken: tokens[tokens.length - 1] as number,
        responseTokens: path.responseTokens,
      };
      if (path.responseTokens >= this.s.maxResponseTokens) this.finish(path, 'length');
    }
  }

  // ---- branching -----------------------------------------------------------

  /** The window after result c is complete (k tokens, or the segment ended): decide (ARPO.md section 1, step 4). */
  private formRequest(path: PathState): void {
    const post = path.post;
    if (!post) return;
    path.post = null;
    path.requestsFormed = post.round;
    this.m.addEntropy(this.m.entropyAfter, post.tag, post.window.mean);
    if (this.s.mode !== 'arpo') return;
    const delta = post.window.mean - path.initialEntropy;
    const probability = branchProbability(this.s.branchProbability, this.s.entropyWeight, delta);
    const uniform = this.s.branchRule === 'bernoulli' ? decisionUniform(this.seed, path.prompt.streamKey, path.order, post.round) : NaN;
    const fired = branchFires(this.s.branchRule, probability, this.s.branchThreshold, uniform);
    const decision: BranchDecision = {
      prompt: path.prompt.index,
      path: path.order,
      toolCall: post.round,
      tag: post.tag,
      depth: path.prompt.tree.node(post.resultNode).depth,
      entropy: post.window.mean,
      initialEntropy: path.initialEntropy,
      deltaEntropy: delta,
      probability,
      uniform,
      fired,
      branches: 0,
      branchPaths: [],
    };
    this.decisions.push(decision);
    this.m.decisions++;
    if (fired) {
      this.m.decisionsFired++;
      path.prompt.addRequest({ path, post, decision });
    }
  }

  /** Grants queued requests in (round, order) order while no earlier one can still appear; refills or closes an idle prompt. */
  private settle(p: PromptState): void {
    while (p.requests.length > 0) {
      const r = p.requests[0] as BranchRequest;
      if (p.remaining > 0 && p.blocked(r.post.round, r.path.order)) break;
      p.requests.shift();
      const z = Math.min(this.s.branchesPerDecision, p.remaining);
      for (let i = 0; i < z; i++) this.fork(p, r);
      if (z > 0) {
        this.m.addBranchEvent(r.post.tag, r.decision.depth, r.decision.deltaEntropy);
        this.m.branches += z;
      }
      r.path.holds--;
      this.release(r.path);
    }
    this.dropSpeculative(p, p.remaining);
    if (!p.idle || !p.rootReady) return;
    if (p.remaining > 0) {
      // Every path finished under budget: fresh global samples fill it (never copies of a trajectory).
      if (p.speculative.length > 0) {
        this.keepSpeculative(p);
        // Kept refills may have ended in their replay (an answer, EOS, or a call over the limit).
        this.settle(p);
      } else this.spawnGlobal(p, p.remaining, 'refill');
      return;
    }
    if (p.rootEngineId >= 0) {
      this.engine.freePath(p.rootEngineId);
      p.rootEngineId = -1;
    }
    p.done = true;
  }

  /** A branch from the end of the tool result: share the cache up to its last token, re-feed that token, re-sample what follows. */
  private fork(p: PromptState, r: BranchRequest): void {
    const src = r.path;
    const branch = p.newPath('branch', {
      node: r.post.resultNode,
      toolCalls: r.post.round,
      responseTokens: r.post.responseTokens,
      initialEntropy: src.initialEntropy,
    });
    branch.engineId = this.engine.fork(src.engineId, r.post.resultEnd - 1, branch.stream);
    branch.input = Int32Array.of(r.post.lastResultToken);
    r.decision.branches++;
    r.decision.branchPaths.push(branch.order);
    this.m.paths.branch++;
  }
}
