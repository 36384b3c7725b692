// A deterministic stand-in for the policy model: a tiny word-level "agent"
// whose next-token distribution depends on the path's tokens (n-gram hash +
// protocol state), sampled with the (seed, stream, position) key of rng.h, with
// real fork semantics and counters for the work done. Plus its TokenText and tools.
import { mix64 } from '../../lib/rollout/branching';
import type { DecodeResult, GenerationEngine, SamplingOptions } from '../../lib/model/types';
import type { TokenText } from '../../lib/rollout/types';

// ---- vocabulary ------------------------------------------------------------
export const EOS = 0;
const SPECIAL = ['<|endoftext|>', '<think>', '</think>', '<search>', '</search>', '<python>', '</python>', '<answer>', '</answer>', ' <result>', '</result>'];
const WORDS = ['alpha', 'beta', 'gamma', 'delta', 'river', 'city', 'year', 'king', 'sum', 'prime', 'two', 'three', 'print', 'x', 'who', 'when', 'is', 'the', 'of', 'and', 'boxed', 'page', 'answer', 'find'].map((w) => ` ${w}`);
const CHARS: string[] = ['\n'];
for (let c = 32; c < 127; c++) CHARS.push(String.fromCharCode(c));
export const VOCAB: readonly string[] = [...SPECIAL, ...WORDS, ...CHARS];
export const VOCAB_SIZE = VOCAB.length;
const ID = new Map(VOCAB.map((s, i) => [s, i]));
export const tok = (s: string): number => {
  const id = ID.get(s);
  if (id === undefined) throw new Error(`no token ${JSON.stringify(s)}`);
  return id;
};
const WORD_IDS = WORDS.map(tok);
const MULTI = VOCAB.filter((s) => s.length > 1).sort((a, b) => b.length - a.length);

/** Greedy longest-match tokenizer over the fake vocabulary (unknown characters become '?'). */
export const fakeText: TokenText & { calls: number } = {
  calls: 0,
  encode(text: string): number[] {
    const out: number[] = [];
    let i = 0;
    outer: while (i < text.length) {
      for (const m of MULTI) {
        if (text.startsWith(m, i)) {
          out.push(ID.get(m) as number);
          i += m.length;
          continue outer;
        }
      }
      out.push(ID.get(text[i] as string) ?? (ID.get('?') as number));
      i++;
    }
    return out;
  },
  decode(tokens: ArrayLike<number>): string {
    this.calls++;
    let s = '';
    for (let i = 0; i < tokens.length; i++) s += VOCAB[tokens[i] as number] ?? '\uFFFD';
    return s;
  },
};

// ---- the model -------------------------------------------------------------
type Mode = 'free' | 'search' | 'python' | 'answer' | 'done';
interface State {
  mode: Mode;
  inTag: number; // tokens since the current tag opened
  since: number; // tokens since the last </result> (or the start)
  results: number;
  lastTool: 'search' | 'python' | '';
  h1: number; // last two tokens
  h2: number;
}
const START: State = { mode: 'free', inTag: 0, since: 0, results: 0, lastTool: '', h1: -1, h2: -1 };

function next(s: State, t: number): State {
  const n: State = { ...s, h2: s.h1, h1: t, since: s.since + 1, inTag: s.inTag + 1 };
  const str = VOCAB[t];
  if (str === '<search>') Object.assign(n, { mode: 'search', inTag: 0, lastTool: 'search' });
  else if (str === '<python>') Object.assign(n, { mode: 'python', inTag: 0, lastTool: 'python' });
  else if (str === '<answer>') Object.assign(n, { mode: 'answer', inTag: 0 });
  else if (str === '</search>' || str === '</python>') n.mode = 'free';
  else if (str === '</answer>') n.mode = 'done';
  else if (str === '</result>') Object.assign(n, { since: 0, results: s.results + 1, mode: 'free' });
  return n;
}

function hash32(a: number, b: number, c: number): number {
  let h = Math.imul(a ^ 0x9e3779b9, 0x85ebca6b) ^ Math.imul(b + 0x632be5ab, 0xc2b2ae35) ^ Math.imul(c + 0x27d4eb2f, 0x165667b1);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b3c6d);
  h ^= h >>> 12;
  h = Math.imul(h, 0x297a2d39);
  return (h ^ (h >>> 15)) >>> 0;
}

/** Knobs of the fake agent's behaviour. */
export interface FakeModelOptions {
  /** Probability of opening a tool call at a free-text position (split search / python). */
  toolRate: number;
  /** Probability of opening the answer, per free position, grows with results seen. */
  answerRate: number;
  eosRate: number;
  /** Words in a tag before its closing tag becomes likely. */
  tagLength: number;
}
const DEFAULT_MODEL: FakeModelOptions = { toolRate: 0.06, answerRate: 0.015, eosRate: 0.002, tagLength: 3 };

/** The next-token distribution after state s (probabilities over the vocabulary). */
export function fakeDistribution(s: State, opts: FakeModelOptions): Float64Array {
  const p = new Float64Array(VOCAB_SIZE);
  if (s.mode === 'done') {
    p[EOS] = 1;
    return p;
  }
  // Sharpness of the word distribution: flat right after a tool result (high
  // entropy, more so after search), sharper as the segment goes on.
  const ramp = Math.min(1, s.since / 12);
  const scale = s.results === 0 ? 2.2 : (s.lastTool === 'search' ? 0.2 : 0.8) + 2.4 * ramp;
  let wordMass = 1;
  const put = (t: number, q: number): void => {
    p[t] = q;
    wordMass -= q;
  };
  if (s.mode === 'free') {
    put(tok('<search>'), opts.toolRate * 0.6);
    put(tok('<python>'), opts.toolRate * 0.4);
    put(tok('<answer>'), Math.min(0.5, opts.answerRate * (1 + 3 * s.results)));
    put(EOS, opts.eosRate);
  } else {
    const close = s.mode === 'search' ? '</search>' : s.mode === 'python' ? '</python>' : '</answer>';
    put(tok(close), s.inTag < opts.tagLength ? 0.02 : 0.45);
  }
  let z = 0;
  const w = new Float64Array(WORD_IDS.length);
  for (let j = 0; j < WORD_IDS.length; j++) {
    const g = (hash32(s.h1, s.h2, j) / 4294967296) * 2 - 1;
    w[j] = Math.exp(scale * 2 * g);
    z += w[j] as number;
  }
  for (let j = 0; j < WORD_IDS.length; j++) p[WORD_IDS[j] as number] = (wordMass * (w[j] as number)) / z;
  return p;
}

/** Distribution of token i given tokens[0..i), for every i (an unbatched, uncached reference). */
export function fakeDistributionsAlong(tokens: ArrayLike<number>, opts: Partial<FakeModelOptions> = {}): Float64Array[] {
  const o = { ...DEFAULT_MODEL, ...opts };
  const out: Float64Array[] = [];
  let s = START;
  for (let i = 0; i < tokens.length; i++) {
    out.push(fakeDistribution(s, o));
    s = next(s, tokens[i] as number);
  }
  return out;
}

interface FakePath {
  tokens: number[];
  states: State[]; // states[i]: after tokens[0..i]
  stream: bigint;
}

function u64(x: bigint | number): bigint {
  return BigInt.asUintN(64, BigInt(x));
}

/** Uniform in (0, 1) keyed by (seed, stream, position), as rng.h's row_key + uniform(key, 0). */
export function rowUniform(seed: bigint, stream: bigint, position: number): number {
  const key = mix64(seed ^ mix64(stream ^ mix64(BigInt(position))));
  const bits = mix64(key) >> 11n;
  return (Number(bits) + 0.5) / 9007199254740992;
}

export class FakeEngine implements GenerationEngine {
  readonly vocabSize = VOCAB_SIZE;
  private readonly paths = new Map<number, FakePath>();
  private nextId = 1;
  readonly opts: FakeModelOptions;
  /** Work counters: tokens run through the "model", engine calls, forks, largest batch, live paths. */
  computedTokens = 0;
  extendCalls = 0;
  forks = 0;
  maxBatch = 0;
  peakLive = 0;
  /** Every (path, input length) of every call, for batching checks. */
  readonly calls: { paths: number[]; streams: bigint[]; lengths: number[]; keys: number }[] = [];

  constructor(opts: Partial<FakeModelOptions> = {}, private readonly delay: () => number = () => 0) {
    this.opts = { ...DEFAULT_MODEL, ...opts };
  }

  get livePaths(): number {
    return this.paths.size;
  }

  private get(path: number): FakePath {
    const p = this.paths.get(path);
    if (!p) throw new Error(`FakeEngine: unknown path ${path}`);
    return p;
  }

  private add(p: FakePath): number {
    const id = this.nextId++;
    this.paths.set(id, p);
    this.peakLive = Math.max(this.peakLive, this.paths.size);
    return id;
  }

  newPath(stream: bigint | number): number {
    return this.add({ tokens: [], states: [], stream: u64(stream) });
  }

  fork(path: number, prefixLength: number, stream: bigint | number): number {
    const p = this.get(path);
    if (!Number.isInteger(prefixLength) || prefixLength < 0 || prefixLength > p.tokens.length) {
      throw new Error(`FakeEngine.fork: prefixLength ${prefixLength} outside [0, ${p.tokens.length}]`);
    }
    this.forks++;
    // Copying the per-position states stands in for sharing KV blocks: nothing is recomputed.
    return this.add({ tokens: p.tokens.slice(0, prefixLength), states: p.states.slice(0, prefixLength), stream: u64(stream) });
  }

  freePath(path: number): void {
    this.get(path);
    this.paths.delete(path);
  }

  pathLength(path: number): number {
    return this.get(path).tokens.length;
  }

  /** The distribution at the end of a path's cache (for tests). */
  distributionAfter(path: number): Float64Array {
    const p = this.get(path);
    return fakeDistribution(p.states[p.states.length - 1] ?? START, this.opts);
  }

  async extend(paths: readonly number[], inputs: readonly Int32Array[], sampling: SamplingOptions & { topLogprobs?: number }): Promise<DecodeResult & { topLogprobs?: Float32Array }> {
    if (paths.length !== inputs.length) throw new Error('FakeEngine.extend: paths and inputs differ in length');
    if (new Set(paths).size !== paths.length) throw new Error('FakeEngine.extend: a path appears twice');
    if ((sampling.topK ?? 0) !== 0 || (sampling.topP ?? 1) !== 1) throw new Error('FakeEngine: top-k / top-p sampling not modelled');
    const d = this.delay();
    await new Promise<void>((r) => (d > 0 ? setTimeout(r, d) : setImmediate(r)));
    const n = paths.length;
    const out = { tokens: new Int32Array(n), logprobs: new Float32Array(n), entropies: new Float32Array(n), normEntropies: new Float32Array(n) };
    const K = sampling.topLogprobs ?? 0;
    const top = K > 0 ? new Float32Array(n * K) : undefined;
    const seed = u64(sampling.seed);
    this.extendCalls++;
    this.maxBatch = Math.max(this.maxBatch, n);
    // Attention keys the new tokens read, from the cached lengths: token t of a row attends over L + t + 1 positions.
    let keys = 0;
    paths.forEach((p, i) => {
      const L = this.get(p).tokens.length;
      for (let t = 0; t < (inputs[i] as Int32Array).length; t++) keys += L + t + 1;
    });
    this.calls.push({ paths: [...paths], streams: paths.map((p) => this.get(p).stream), lengths: inputs.map((x) => x.length), keys });
    for (let i = 0; i < n; i++) {
      const p = this.get(paths[i] as number);
      const input = inputs[i] as Int32Array;
      if (input.length === 0) throw new Error('FakeEngine.extend: empty input');
      for (const t of input) {
        if (!Number.isInteger(t) || t < 0 || t >= VOCAB_SIZE) throw new Error(`FakeEngine.extend: token ${t} out of range`);
        const prev = p.states[p.states.length - 1] ?? START;
        p.tokens.push(t);
        p.states.push(next(prev, t));
      }
      this.computedTokens += input.length;
      let probs = fakeDistribution(p.states[p.states.length - 1] as State, this.opts);
      const T = sampling.temperature;
      if (T > 0 && T !== 1) {
        const q = probs.map((x) => Math.pow(x, 1 / T));
        const z = q.reduce((a, b) => a + b, 0);
        probs = q.map((x) => x / z);
      }
      let h = 0;
      for (const x of probs) if (x > 0) h -= x * Math.log(x);
      let token = 0;
      if (T === 0) {
        for (let j = 1; j < VOCAB_SIZE; j++) if ((probs[j] as number) > (probs[token] as number)) token = j;
      } else {
        // Inverse CDF with one uniform keyed by (seed, stream, position after the append).
        const u = rowUniform(seed, p.stream, p.tokens.length);
        let c = 0;
        token = -1;
        for (let j = 0; j < VOCAB_SIZE; j++) {
          c += probs[j] as number;
          if (u < c && (probs[j] as number) > 0) {
            token = j;
            break;
          }
        }
        if (token < 0) for (let j = VOCAB_SIZE - 1; j >= 0; j--) if ((probs[j] as number) > 0) { token = j; break; }
      }
      out.tokens[i] = token;
      out.logprobs[i] = Math.log(probs[token] as number);
      out.entropies[i] = h;
      out.normEntropies[i] = h / Math.log(VOCAB_SIZE);
      if (top) {
        const lp = Array.from(probs, (x) => (x > 0 ? Math.log(x) : -Infinity)).sort((a, b) => b - a);
        for (let j = 0; j < K; j++) top[i * K + j] = lp[j] ?? -Infinity;
      }
    }
    return top ? { ...out, topLogprobs: top } : out;
  }
}

// ---- tools -----------------------------------------------------------------
/** Deterministic fake tools: the output depends only on (tag, content); latency from `latency()`. */
export function fakeTools(latency: () => number = () => 0): {
  execute: (tag: string, content: string, signal: AbortSignal) => Promise<string>;
  calls: { tag: string; content: string }[];
} {
  const calls: { tag: string; content: string }[] = [];
  return {
    calls,
    execute: (tag, content, signal) =>
      new Promise<string>((resolve, reject) => {
        calls.push({ tag, content });
        const h = hash32(content.length, tag.length, [...content].reduce((a, c) => (a * 31 + c.charCodeAt(0)) | 0, 7));
        const out = tag === 'search' ? `Page 1: ${WORDS[h % WORDS.length]} river ${h % 97}` : `${h % 1000}`;
        const ms = latency();
        const onAbort = (): void => {
          clearTimeout(t);
          reject(new Error('aborted'));
        };
        const t = setTimeout(() => {
          signal.removeEventListener('abort', onAbort);
          resolve(out);
        }, ms);
        signal.addEventListener('abort', onAbort, { once: true });
      }),
  };
}

/** A seeded LCG for test randomness (latencies, settings), independent of the code under test. */
export function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 4294967296;
  };
}

/** A prompt for the fake agent. */
export function fakePrompt(i: number): number[] {
  return Array.from(fakeText.encode(`Q${i}: who is the king of the city?<think>`));
}
