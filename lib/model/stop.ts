// Stop detection on a token stream (token in, token out): stop strings such
// as `</search>`, `</python>`, `</answer>` are found in the incrementally
// detokenised text with a rolling tail, however the tokenizer split them,
// without re-decoding the whole generation; stop token ids (EOS) too.
import { invalidArgument } from '../errors';
import type { IncrementalDetokenizer, Tokenizer } from './tokenizer';

export interface StopMatch {
  /** The stop string found, or the stop token's text for a stop token id. */
  readonly stop: string;
  /** 'string' for a stop string, 'token' for a stop token id. */
  readonly kind: 'string' | 'token';
  /** Index (0-based, in push order) of the token whose text completed the stop. */
  readonly tokenIndex: number;
  /** Characters of that token's text after the end of the stop string (0 when it ends exactly there). */
  readonly trailingChars: number;
}

export interface StopMatcherOptions {
  /** Token ids that stop on their own (e.g. EOS). */
  stopTokenIds?: Iterable<number>;
}

export class StopMatcher {
  readonly stops: readonly string[];
  private readonly stopTokenIds: ReadonlySet<number>;
  private readonly keep: number; // tail length: longest stop - 1 characters can still start a match
  private detok: IncrementalDetokenizer;
  private tail = '';
  private count = 0;
  private found: StopMatch | null = null;

  constructor(private readonly tokenizer: Tokenizer, stops: readonly string[], options: StopMatcherOptions = {}) {
    if (!Array.isArray(stops)) throw invalidArgument('an array of strings', 'stops', stops);
    stops.forEach((s, i) => {
      if (typeof s !== 'string' || s.length === 0) throw invalidArgument('a non-empty string', `stops[${i}]`, s);
    });
    this.stops = Object.freeze([...stops]);
    this.stopTokenIds = new Set(options.stopTokenIds ?? []);
    this.keep = Math.max(0, ...stops.map((s) => s.length - 1));
    this.detok = tokenizer.detokenizer();
  }

  /** The match, once one happened (later pushes are ignored). */
  get match(): StopMatch | null {
    return this.found;
  }

  /** Feeds one generated token; returns the match when this token completes a stop, else null. */
  push(id: number): StopMatch | null {
    if (this.found) return null;
    const tokenIndex = this.count++;
    if (this.stopTokenIds.has(id)) {
      this.found = { stop: this.tokenizer.tokenPiece(id), kind: 'token', tokenIndex, trailingChars: 0 };
      return this.found;
    }
    const piece = this.detok.push(id);
    if (piece.length === 0) return null;
    const window = this.tail + piece;
    // Only occurrences that end inside the new piece are new; the earliest-ending wins.
    let best: { stop: string; end: number } | null = null;
    for (const s of this.stops) {
      const from = Math.max(0, this.tail.length - s.length + 1);
      const at = window.indexOf(s, from);
      if (at >= 0 && (best === null || at + s.length < best.end)) best = { stop: s, end: at + s.length };
    }
    this.tail = this.keep > 0 ? window.slice(-this.keep) : '';
    if (best) {
      this.found = { stop: best.stop, kind: 'string', tokenIndex, trailingChars: window.length - best.end };
      return this.found;
    }
    return null;
  }

  /** Feeds tokens in order; returns the first match (tokens after it are not consumed). */
  pushMany(ids: ArrayLike<number>): StopMatch | null {
    for (let i = 0; i < ids.length; i++) {
      const m = this.push(ids[i]!);
      if (m) return m;
    }
    return null;
  }

  /** Starts over (a new segment of generation). */
  reset(): void {
    this.detok = this.tokenizer.detokenizer();
    this.tail = '';
    this.count = 0;
    this.found = null;
  }
}
