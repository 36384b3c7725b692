// Stop-string detection on a growing token segment without re-decoding it:
// each new token decodes only a short tail, so a segment of n tokens costs O(n).
import type { TokenText } from './types';

/** Tokens decoded per check; a stop string must fit in this many tokens (tags are a few tokens). */
export const STOP_TAIL_TOKENS = 32;

/**
 * The stop string (if any) that the newest token of `tokens` completes: it
 * occurs in the decoded tail and ends inside the text the newest token added
 * (an occurrence wholly before it was seen, and acted on, one token earlier).
 */
export function stopCompletedBy(tokens: readonly number[], text: TokenText, stops: readonly string[]): string | undefined {
  const n = tokens.length;
  if (n === 0) return undefined;
  const lo = Math.max(0, n - STOP_TAIL_TOKENS);
  const tail = text.decode(tokens.slice(lo, n));
  let best: { stop: string; end: number } | undefined;
  let before: number | undefined;
  for (const stop of stops) {
    const at = tail.indexOf(stop);
    if (at < 0) continue;
    before ??= n - 1 > lo ? text.decode(tokens.slice(lo, n - 1)).length : 0;
    // earliest occurrence ending after the previous tail: that one the new token completed
    for (let i = at; i >= 0; i = tail.indexOf(stop, i + 1)) {
      const end = i + stop.length;
      if (end > before) {
        if (!best || end < best.end) best = { stop, end };
        break;
      }
    }
  }
  return best?.stop;
}
