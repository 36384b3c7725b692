// The tag protocol between a policy and its tools (ARPO.md, "Interaction protocol"):
// the model writes `<search> q </search>` / `<python> code </python>`, generation
// stops at the closing tag, and the tool output comes back as ` <result>\n…\n</result>`.
import { ArpoError, invalidArgument } from '../errors';

/** Where tool calls written inside `<think>…</think>` count. */
export type CallsInThink = 'allow' | 'ignore';

/** Options of {@link createProtocol}; every field has the reference's default. */
export interface ToolProtocolOptions {
  /** Tags that call a tool (reference: `search`, `python`). */
  toolTags?: readonly string[];
  /** Tag that wraps a tool's output (reference: `result`). */
  resultTag?: string;
  /** Tag of the final answer (reference: `answer`); an answer before any call ends parsing. */
  answerTag?: string;
  /** Tag of the reasoning block (reference: `think`). */
  thinkTag?: string;
  /** Text before the escaped tool output (reference: `" <result>\n"`). */
  resultOpen?: string;
  /** Text after the escaped tool output (reference: `"\n</result>"`). */
  resultClose?: string;
  /** Tool calls per trajectory (reference `call_limit`: 5); over the limit the path ends. */
  callLimit?: number;
  /**
   * `allow` (default): calls inside `<think>` run, as in the reference, whose
   * system prompt says "During thinking, you can invoke the … tool".
   * `ignore`: tags inside a `<think>` block are only reasoning text.
   */
  callsInThink?: CallsInThink;
  /** Also escape `<|` (chat-template special tokens such as `<|im_end|>`) in tool output. Default true. */
  escapeSpecialTokens?: boolean;
}

/** A validated, frozen protocol. Build it with {@link createProtocol}. */
export interface ToolProtocol {
  readonly toolTags: readonly string[];
  readonly resultTag: string;
  readonly answerTag: string;
  readonly thinkTag: string;
  readonly resultOpen: string;
  readonly resultClose: string;
  readonly callLimit: number;
  readonly callsInThink: CallsInThink;
  readonly escapeSpecialTokens: boolean;
  /** Stop strings for generation: the closing tag of every tool (`</search>`, `</python>`). */
  readonly stopStrings: readonly string[];
}

const TAG_NAME = /^[A-Za-z][A-Za-z0-9_-]{0,63}$/;

function checkTag(name: string, value: unknown): string {
  if (typeof value !== 'string' || !TAG_NAME.test(value)) {
    throw invalidArgument('a tag name (letter, then letters, digits, _ or -; at most 64)', name, value);
  }
  return value;
}

/** A validated, frozen protocol; defaults reproduce the ARPO reference exactly. */
export function createProtocol(options: ToolProtocolOptions = {}): ToolProtocol {
  if (options === null || typeof options !== 'object') throw invalidArgument('an options object', 'options', options);
  const toolTagsIn = options.toolTags ?? ['search', 'python'];
  if (!Array.isArray(toolTagsIn) || toolTagsIn.length === 0) {
    throw invalidArgument('a non-empty array of tag names', 'toolTags', toolTagsIn);
  }
  const toolTags = toolTagsIn.map((t, i) => checkTag(`toolTags[${i}]`, t));
  const resultTag = checkTag('resultTag', options.resultTag ?? 'result');
  const answerTag = checkTag('answerTag', options.answerTag ?? 'answer');
  const thinkTag = checkTag('thinkTag', options.thinkTag ?? 'think');
  const all = [...toolTags, resultTag, answerTag, thinkTag];
  const dup = all.find((t, i) => all.indexOf(t) !== i);
  if (dup !== undefined) throw invalidArgument('distinct tag names', 'toolTags/resultTag/answerTag/thinkTag', dup);
  const resultOpen = options.resultOpen ?? ` <${resultTag}>\n`;
  const resultClose = options.resultClose ?? `\n</${resultTag}>`;
  if (typeof resultOpen !== 'string') throw invalidArgument('a string', 'resultOpen', resultOpen);
  if (typeof resultClose !== 'string') throw invalidArgument('a string', 'resultClose', resultClose);
  const callLimit = options.callLimit ?? 5;
  if (!Number.isInteger(callLimit) || callLimit < 0) throw invalidArgument('a non-negative integer', 'callLimit', callLimit);
  const callsInThink = options.callsInThink ?? 'allow';
  if (callsInThink !== 'allow' && callsInThink !== 'ignore') {
    throw invalidArgument('"allow" or "ignore"', 'callsInThink', callsInThink);
  }
  const escapeSpecialTokens = options.escapeSpecialTokens ?? true;
  if (typeof escapeSpecialTokens !== 'boolean') throw invalidArgument('a boolean', 'escapeSpecialTokens', escapeSpecialTokens);
  return Object.freeze({
    toolTags: Object.freeze(toolTags),
    resultTag,
    answerTag,
    thinkTag,
    resultOpen,
    resultClose,
    callLimit,
    callsInThink,
    escapeSpecialTokens,
    stopStrings: Object.freeze(toolTags.map((t) => `</${t}>`)),
  });
}

/** The default (reference) protocol. */
export const DEFAULT_PROTOCOL: ToolProtocol = createProtocol();

/** A complete tool call: `text.slice(span.start, span.end)` is `<tag>content</tag>`. */
export interface ToolCall {
  readonly kind: 'call';
  readonly tag: string;
  /** What is between the tags, trimmed (the reference strips it too). */
  readonly content: string;
  /** Offsets into the parsed text: from the opening `<` to just after the closing `>`. */
  readonly span: { readonly start: number; readonly end: number };
}

/**
 * Why there is no call: `no_call` (no tool tag at all), `unclosed` (an opening
 * tool tag without its closing tag: generation ended mid-call), `answer` (the
 * answer tag comes before any complete call).
 */
export interface NoToolCall {
  readonly kind: 'none';
  readonly reason: 'no_call' | 'unclosed' | 'answer';
  /** For `unclosed` / `answer`: the tag and where its opening tag starts. */
  readonly tag?: string;
  readonly at?: number;
}

export type ToolCallParse = ToolCall | NoToolCall;

/** Options of {@link parseToolCall}. */
export interface ParseOptions {
  /**
   * Where the model's newest text starts (e.g. the offset of the segment just
   * generated). Default: just after the last result close tag, so calls that
   * were already answered are never parsed again.
   */
  from?: number;
}

/** Decodes model bytes as UTF-8; invalid sequences become U+FFFD instead of throwing. */
export function decodeModelText(text: string | Uint8Array): string {
  if (typeof text === 'string') return text;
  return new TextDecoder('utf-8', { fatal: false }).decode(text);
}

/** [start, end) ranges of `<think>…</think>` blocks; an unclosed one runs to the end of the text. */
function thinkRanges(text: string, from: number, thinkTag: string): Array<[number, number]> {
  const open = `<${thinkTag}>`;
  const close = `</${thinkTag}>`;
  const ranges: Array<[number, number]> = [];
  let i = text.indexOf(open, from);
  while (i >= 0) {
    const j = text.indexOf(close, i + open.length);
    if (j < 0) {
      ranges.push([i, text.length]);
      break;
    }
    ranges.push([i, j + close.length]);
    i = text.indexOf(open, j + close.length);
  }
  return ranges;
}

function inRanges(pos: number, ranges: Array<[number, number]>): boolean {
  for (const [a, b] of ranges) if (pos >= a && pos < b) return true;
  return false;
}

/** Positions of `needle` in `text` from `from`, skipping the masked ranges. */
function positions(text: string, needle: string, from: number, masked: Array<[number, number]>): number[] {
  const out: number[] = [];
  for (let i = text.indexOf(needle, from); i >= 0; i = text.indexOf(needle, i + needle.length)) {
    if (!inRanges(i, masked)) out.push(i);
  }
  return out;
}

/**
 * The first complete tool call after the last result, or why there is none.
 *
 * Rules (each has a test): the call is the earliest closing tool tag paired
 * with the nearest same-name opening tag before it (so a repeated or nested
 * opening, `<search> a <search> b </search>`, yields ` b `, like the
 * reference's `rindex`); a closing tag with no opening is skipped; an answer
 * tag before that call wins; calls inside `<think>` follow `callsInThink`
 * (answer tags inside `<think>` never count). Linear in the text length.
 */
export function parseToolCall(
  text: string | Uint8Array,
  protocol: ToolProtocol = DEFAULT_PROTOCOL,
  options: ParseOptions = {},
): ToolCallParse {
  if (typeof text !== 'string' && !(text instanceof Uint8Array)) throw invalidArgument('a string or Uint8Array', 'text', text);
  const s = decodeModelText(text);
  let from: number;
  if (options.from !== undefined) {
    if (!Number.isInteger(options.from) || options.from < 0) throw invalidArgument('a non-negative integer', 'from', options.from);
    from = Math.min(options.from, s.length);
  } else {
    const close = `</${protocol.resultTag}>`;
    const last = s.lastIndexOf(close);
    from = last < 0 ? 0 : last + close.length;
  }
  const think = thinkRanges(s, from, protocol.thinkTag);
  const callMask = protocol.callsInThink === 'ignore' ? think : [];

  let best: ToolCall | undefined;
  let firstUnclosed: { tag: string; at: number } | undefined;
  for (const tag of protocol.toolTags) {
    const open = `<${tag}>`;
    const close = `</${tag}>`;
    const opens = positions(s, open, from, callMask);
    if (opens.length === 0) continue;
    const closes = positions(s, close, from, callMask);
    // Earliest closing tag that has an opening tag before it; pair it with the
    // last such opening (two-pointer walk, O(opens + closes)).
    let k = -1;
    let call: ToolCall | undefined;
    for (const c of closes) {
      while (k + 1 < opens.length && (opens[k + 1] as number) + open.length <= c) k++;
      if (k < 0) continue; // stray closing tag
      const o = opens[k] as number;
      call = { kind: 'call', tag, content: s.slice(o + open.length, c).trim(), span: { start: o, end: c + close.length } };
      break;
    }
    if (call) {
      if (!best || call.span.end < best.span.end) best = call;
    } else {
      const at = opens[0] as number;
      if (!firstUnclosed || at < firstUnclosed.at) firstUnclosed = { tag, at };
    }
  }
  const answers = positions(s, `<${protocol.answerTag}>`, from, think);
  const answerAt = answers[0];
  if (answerAt !== undefined && (!best || answerAt < best.span.start)) {
    return { kind: 'none', reason: 'answer', tag: protocol.answerTag, at: answerAt };
  }
  if (best) return best;
  if (firstUnclosed) return { kind: 'none', reason: 'unclosed', tag: firstUnclosed.tag, at: firstUnclosed.at };
  return { kind: 'none', reason: 'no_call' };
}

/** True while a trajectory that has made `callsMade` calls may make another (reference: `< call_limit`). */
export function canCallTool(callsMade: number, protocol: ToolProtocol = DEFAULT_PROTOCOL): boolean {
  if (!Number.isInteger(callsMade) || callsMade < 0) throw invalidArgument('a non-negative integer', 'callsMade', callsMade);
  return callsMade < protocol.callLimit;
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;
// C0 controls other than \t \n \r, and DEL: they carry no meaning for a model and
// some tokenizers reject them.
const CONTROL = /[\u0000-\u0008\u000B\u000C\u000E-\u001F\u007F]/g;

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

const forgeryPatterns = new WeakMap<ToolProtocol, RegExp>();

function forgeryPattern(protocol: ToolProtocol): RegExp {
  let re = forgeryPatterns.get(protocol);
  if (!re) {
    const names = [...protocol.toolTags, protocol.resultTag, protocol.answerTag, protocol.thinkTag].map(escapeRegExp).join('|');
    // Any spelling a lenient reader could take for a protocol tag: any case,
    // spaces inside, attributes, self-closing: `</RESULT >`, `< search x=1>`.
    const parts = [`<(?=\\s*\\/?\\s*(?:${names})(?![A-Za-z0-9_-])[^<>]*>)`];
    if (protocol.escapeSpecialTokens) parts.push('<(?=\\|)');
    re = new RegExp(parts.join('|'), 'gi');
    forgeryPatterns.set(protocol, re);
  }
  return re;
}

/**
 * Tool output made safe to splice into the model's context: lone surrogates
 * become U+FFFD, control characters are dropped, and every `<` that opens a
 * protocol tag (or a `<|special|>` token) becomes `&lt;`, so output can never
 * close the result early, forge a tool call, or forge an answer.
 */
export function escapeToolOutput(output: string, protocol: ToolProtocol = DEFAULT_PROTOCOL): string {
  if (typeof output !== 'string') throw invalidArgument('a string', 'output', output);
  return output.replace(LONE_SURROGATE, '\uFFFD').replace(CONTROL, '').replace(forgeryPattern(protocol), '&lt;');
}

/** ` <result>\n<escaped output>\n</result>`: the text appended after a tool call. */
export function formatResult(output: string, protocol: ToolProtocol = DEFAULT_PROTOCOL): string {
  return protocol.resultOpen + escapeToolOutput(output, protocol) + protocol.resultClose;
}

/** Throws unless `tag` is one of the protocol's tool tags. */
export function assertToolTag(tag: string, protocol: ToolProtocol): void {
  if (!protocol.toolTags.includes(tag)) {
    throw new ArpoError('INVALID_ARGUMENT', `Expected one of the tool tags ${protocol.toolTags.join(', ')} for tag but received ${JSON.stringify(tag)} of type ${typeof tag}`);
  }
}
