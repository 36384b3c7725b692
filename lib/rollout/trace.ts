// Where a rollout's time goes (issue 14). Always: the budget's path slots
// accounted in slot-milliseconds by what they were doing during each engine
// call and each wait for tools — decoding in the call, ready but left out of
// it (batch limits), waiting for a tool result, a branch request waiting for
// its grant (held back until no earlier decision can still appear), or not
// yet started (a future branch or refill; `speculative` while a speculative
// refill decodes for it). Optionally (rollout setting
// `trace`): every engine call and tool call with its time.
import type { PromptState } from './prompt-state';

/** Slot-milliseconds of the unfinished part of the budget (M slots per prompt), by state. */
export interface SlotTime {
  /** In the engine call. */
  decode: number;
  /** Ready to decode but not in the call (batch path or token limits). */
  ready: number;
  /** Waiting for a tool result. */
  tool: number;
  /** A fired branch request waiting for its grant. */
  grant: number;
  /** Budget not yet used by any path, while a speculative refill that may fill it decodes or waits. */
  speculative: number;
  /** Budget not yet used by any path: a later branch or a refill. */
  unused: number;
}

export function emptySlotTime(): SlotTime {
  return { decode: 0, ready: 0, tool: 0, grant: 0, speculative: 0, unused: 0 };
}

export interface EngineCallTrace {
  /** Start, ms since the rollout began. */
  atMs: number;
  ms: number;
  /** Paths in the call (prompt prefills included) and tokens fed. */
  rows: number;
  tokens: number;
  /**
   * Attention keys the call's new tokens read: for a row of n new tokens after
   * L cached ones, n * L + n (n + 1) / 2 (a decode row: its context length).
   */
  keys: number;
  prefills: number;
  /** Rows of speculative refills (not budget slots until kept). */
  speculative: number;
}

export interface ToolCallTrace {
  tag: string;
  atMs: number;
  /** From the call to its result being available to the scheduler. */
  ms: number;
  /** The tool's own execution time when it reports one (the rest is queueing in the runner). */
  ownMs: number | null;
}

export interface RolloutTrace {
  engineCalls: EngineCallTrace[];
  toolCalls: ToolCallTrace[];
}

/**
 * Adds `ms` of every unfinished prompt's slots to `into`, by what each slot is
 * doing now; a path is in the engine call while its `inFlight` is set.
 */
export function accountSlots(prompts: readonly PromptState[], ms: number, into: SlotTime): void {
  if (!(ms > 0)) return;
  for (const p of prompts) {
    if (p.done) continue;
    for (const path of p.paths) {
      if (path.status === 'finished') continue;
      if (path.status === 'tool') into.tool += ms;
      else if (path.inFlight) into.decode += ms;
      else into.ready += ms;
    }
    let requested = 0;
    for (let i = 0; i < p.requests.length; i++) requested += Math.min(p.settings.branchesPerDecision, p.remaining);
    const grant = Math.min(requested, p.remaining);
    into.grant += grant * ms;
    const speculative = Math.min(p.speculative.length, p.remaining - grant);
    into.speculative += speculative * ms;
    into.unused += (p.remaining - grant - speculative) * ms;
  }
}
