// Per-prompt rollout state: the prompt's paths and its branch budget. Firing
// decisions are granted in a fixed logical order, (tool-call index, path
// creation order), never in wall-clock order, so the trees do not depend on
// tool latencies or batching; a path keeps its KV cache until every request
// that forks from it is settled.
import { EntropyWindow, pathStream } from './branching';
import type { RolloutSettings } from './settings';
import { RolloutTree } from './tree';
import type { BranchDecision, PathOrigin } from './types';

/** The open entropy window after a tool result (ARPO.md section 1, step 3). */
export interface PostResultWindow {
  /** 1-based index of the tool call whose result opened it. */
  round: number;
  tag: string;
  window: EntropyWindow;
  resultNode: number;
  /** Trajectory length once the result is in (the branch point), its last token, and the response tokens so far. */
  resultEnd: number;
  lastResultToken: number;
  responseTokens: number;
}

export type PathStatus = 'decode' | 'tool' | 'finished';

/** One path: a trajectory being generated over its own engine path (KV cache). */
export class PathState {
  engineId = -1;
  /** Current tree node: the open generated segment, or the node the next segment will hang from. */
  node: number;
  /** Tokens for the next engine call (the pending sampled token, plus a tool result when one was just run); null when not ready. */
  input: Int32Array | null = null;
  /** The sampled token that closed a tool call: not yet in the KV cache. */
  pendingToken = -1;
  inFlight = false;
  status: PathStatus = 'decode';
  responseTokens: number;
  /** Tool results appended to this trajectory (inherited ones included). */
  toolCalls: number;
  /** Tool-call rounds whose branch request this path has formed (or inherited). */
  requestsFormed: number;
  /** Initial entropy window: open during the path's first segment; branches inherit the closed mean. */
  initialWindow: EntropyWindow | null;
  initialEntropy = 0;
  post: PostResultWindow | null = null;
  /** True until the path's first token opens its first node. */
  fresh = true;
  /** Unsettled branch requests that will fork from this path's cache. */
  holds = 0;
  readonly stream: bigint;

  constructor(
    readonly prompt: PromptState,
    readonly order: number,
    readonly origin: PathOrigin,
    start: { node: number; toolCalls: number; responseTokens: number; initialEntropy?: number; k: number },
    /** Its sampling stream (default: keyed by its creation order; refills bring theirs). */
    stream?: bigint,
  ) {
    this.stream = stream ?? pathStream(prompt.streamKey, order);
    this.node = start.node;
    this.toolCalls = start.toolCalls;
    this.requestsFormed = start.toolCalls;
    this.responseTokens = start.responseTokens;
    if (start.initialEntropy === undefined) this.initialWindow = new EntropyWindow(start.k);
    else {
      this.initialWindow = null;
      this.initialEntropy = start.initialEntropy;
    }
  }
}

/**
 * A speculative refill (rollout setting `speculativeRefills`): the prompt's
 * refill `index`, a fresh global sample decoded ahead of time up to the end of
 * its first segment and kept outside the tree. If the prompt ends under
 * budget with more than `index` slots left, it becomes refill path `index`
 * (its samples replayed into the tree, the tool call it stopped at run then);
 * otherwise it is dropped.
 */
export class SpeculativeRefill {
  engineId = -1;
  input: Int32Array | null = null;
  inFlight = false;
  /** The first segment ended (EOS, answer, length or a tool call): nothing to decode until it is kept. */
  parked = false;
  /** Every sample so far, as the engine returned it (token, logprob, entropy, normalised entropy, the branching estimate). */
  readonly samples: { token: number; logprob: number; entropy: number; normEntropy: number; estimate: number }[] = [];
  /** The sampled tokens (the segment so far). */
  readonly tokens: number[] = [];
  constructor(
    readonly index: number,
    readonly stream: bigint,
  ) {}
}

/** A firing decision waiting for its budget grant. */
export interface BranchRequest {
  path: PathState;
  post: PostResultWindow;
  decision: BranchDecision;
}

export class PromptState {
  readonly tree: RolloutTree;
  readonly paths: PathState[] = [];
  readonly requests: BranchRequest[] = [];
  /** Speculative refills still in the running, by refill index (those past `remaining` are dropped as soon as the budget shrinks). */
  speculative: SpeculativeRefill[] = [];
  /** Engine path holding the prompt minus its last token (forked by every global sample); -1 when none. */
  rootEngineId = -1;
  rootInput: Int32Array | null = null;
  rootInFlight = false;
  rootReady = false;
  done = false;

  constructor(
    readonly index: number,
    readonly promptTokens: Int32Array,
    vocabSize: number,
    readonly settings: RolloutSettings,
    /** Keys the prompt's random streams (sampling, branch decisions): its index in the global batch, so a data-parallel rank samples the same tree as one process. */
    readonly streamKey: number = index,
  ) {
    this.tree = new RolloutTree(index, promptTokens, vocabSize);
  }

  get created(): number {
    return this.paths.length;
  }
  get remaining(): number {
    return this.settings.budget - this.paths.length;
  }

  newPath(origin: PathOrigin, start: { node: number; toolCalls: number; responseTokens: number; initialEntropy?: number }, stream?: bigint): PathState {
    const p = new PathState(this, this.paths.length, origin, { ...start, k: this.settings.entropyWindow }, stream);
    this.paths.push(p);
    return p;
  }

  /** Queues a firing request, kept sorted by (tool-call round, path order). */
  addRequest(r: BranchRequest): void {
    r.path.holds++;
    this.requests.push(r);
    this.requests.sort((a, b) => a.post.round - b.post.round || a.path.order - b.path.order);
  }

  /**
   * True while some live path could still form a request that comes before
   * (round, order): its next round is r + 1 and it may still call a tool.
   */
  blocked(round: number, order: number): boolean {
    for (const q of this.paths) {
      if (q.status === 'finished') continue;
      const next = q.requestsFormed + 1;
      if (next > this.settings.toolCallLimit) continue;
      if (next < round || (next === round && q.order < order)) return true;
    }
    return false;
  }

  /** Every path finished and every request settled. */
  get idle(): boolean {
    return this.requests.length === 0 && this.paths.every((p) => p.status === 'finished');
  }
}
