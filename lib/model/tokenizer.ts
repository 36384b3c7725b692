// The tokenizer of a checkpoint: tokenizer.json through @huggingface/tokenizers,
// special tokens and the chat template from tokenizer_config.json, plain-text
// encoding of tool results (special-token strings never become special ids),
// an incremental detokeniser, and a tiny byte-level BPE builder for demos.
import * as fs from 'fs';
import * as path from 'path';
import { Tokenizer as HFTokenizer } from '@huggingface/tokenizers';
import { ArpoError, describeType, describeValue, invalidArgument } from '../errors';
import { applyChatTemplate, type ChatMessage, type ChatPrompt, type ChatTemplateOptions } from './chat';

export interface EncodeOptions {
  /** Run the post-processor's special tokens (e.g. Llama's BOS). Default false: chat templates already contain them. */
  addSpecialTokens?: boolean;
}
export interface DecodeOptions {
  skipSpecialTokens?: boolean;
}

type Json = Record<string, unknown>;

/** A special-token field of tokenizer_config.json: a string, {content}, or null. */
function tokenContent(v: unknown): string | null {
  if (typeof v === 'string') return v;
  if (v !== null && typeof v === 'object' && typeof (v as { content?: unknown }).content === 'string') return (v as { content: string }).content;
  return null;
}

const MAX_TOKEN_ID = 2 ** 31 - 1; // ids travel as int32 (Int32Array, the model's embedding rows)

/** Token ids of tokenizer.json (model.vocab values, added_tokens[].id) are integers in [0, 2^31): anything else would wrap or vanish silently in an Int32Array. */
function checkTokenIds(tokenizerJson: Json, source: string): void {
  const bad = (field: string, value: unknown): ArpoError =>
    new ArpoError('BAD_CHECKPOINT', `${source}: expected a token id (an integer in [0, ${MAX_TOKEN_ID}]) for ${field} but received ${describeValue(value)} of type ${describeType(value)}`);
  const isId = (v: unknown): boolean => Number.isInteger(v) && (v as number) >= 0 && (v as number) <= MAX_TOKEN_ID;
  const model = tokenizerJson.model as { vocab?: unknown } | undefined;
  const vocab = model !== null && typeof model === 'object' ? model.vocab : undefined;
  if (vocab !== null && typeof vocab === 'object' && !Array.isArray(vocab)) {
    for (const [token, id] of Object.entries(vocab as Record<string, unknown>)) if (!isId(id)) throw bad(`model.vocab[${JSON.stringify(token)}]`, id);
  }
  const added = tokenizerJson.added_tokens;
  if (added === undefined || added === null) return;
  if (!Array.isArray(added)) throw new ArpoError('BAD_CHECKPOINT', `${source}: expected an array for added_tokens but received ${describeValue(added)} of type ${describeType(added)}`);
  added.forEach((t: unknown, i) => {
    if (t === null || typeof t !== 'object' || Array.isArray(t)) throw new ArpoError('BAD_CHECKPOINT', `${source}: expected an object for added_tokens[${i}] but received ${describeValue(t)} of type ${describeType(t)}`);
    const { id, content } = t as { id?: unknown; content?: unknown };
    if (!isId(id)) throw bad(`added_tokens[${i}].id`, id);
    if (typeof content !== 'string' || content.length === 0) throw new ArpoError('BAD_CHECKPOINT', `${source}: expected a non-empty string for added_tokens[${i}].content but received ${describeValue(content)} of type ${describeType(content)}`);
  });
}

function readJson(file: string): Json {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new ArpoError('BAD_CHECKPOINT', `${file}: cannot read (${(e as Error).message})`);
  }
  try {
    const v = JSON.parse(text) as unknown;
    if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new Error('not a JSON object');
    return v as Json;
  } catch (e) {
    throw new ArpoError('BAD_CHECKPOINT', `${file}: not valid JSON (${(e as Error).message})`);
  }
}

export class Tokenizer {
  /** Where it came from (for messages). */
  readonly source: string;
  /** Largest token id + 1 over the model vocabulary and the added tokens. */
  readonly vocabSize: number;
  readonly bosTokenId: number | null;
  readonly eosTokenId: number | null;
  readonly padTokenId: number | null;
  /** Ids of tokens marked special (excluded by skipSpecialTokens, never produced by encodeToolResult). */
  readonly specialTokenIds: ReadonlySet<number>;
  /** The Jinja chat template (tokenizer_config.json `chat_template`, or chat_template.jinja), or null. */
  readonly chatTemplate: string | null;
  /** Special-token strings for the template context (bos_token, eos_token, pad_token, unk_token). */
  readonly templateTokens: Readonly<Record<string, string>>;

  private readonly hf: HFTokenizer;
  private readonly specialContents: readonly string[];
  private readonly nonSpecialAdded: ReadonlyMap<string, number>;

  private constructor(tokenizerJson: Json, tokenizerConfig: Json, source: string, chatTemplateFile: string | null) {
    this.source = source;
    checkTokenIds(tokenizerJson, source);
    try {
      this.hf = new HFTokenizer(tokenizerJson, tokenizerConfig);
    } catch (e) {
      throw new ArpoError('BAD_CHECKPOINT', `${source}: @huggingface/tokenizers cannot load it (${(e as Error).message})`);
    }
    const added = Array.isArray(tokenizerJson.added_tokens) ? (tokenizerJson.added_tokens as Array<{ id: number; content: string; special?: boolean }>) : [];
    const special = new Set<number>();
    const specialContents: string[] = [];
    const nonSpecial = new Map<string, number>();
    let maxId = this.hf.model ? this.hf.model.vocab.length - 1 : -1;
    for (const t of added) {
      maxId = Math.max(maxId, t.id);
      if (t.special) {
        special.add(t.id);
        specialContents.push(t.content);
      } else {
        nonSpecial.set(t.content, t.id);
      }
    }
    this.vocabSize = maxId + 1;
    this.specialTokenIds = special;
    this.specialContents = specialContents;
    this.nonSpecialAdded = nonSpecial;

    const idOf = (field: string): number | null => {
      const content = tokenContent(tokenizerConfig[field]);
      if (content === null) return null;
      const id = this.hf.token_to_id(content);
      if (id === undefined) throw new ArpoError('BAD_CHECKPOINT', `${source}: ${field} ${JSON.stringify(content)} is not in the vocabulary`);
      return id;
    };
    this.bosTokenId = idOf('bos_token');
    this.eosTokenId = idOf('eos_token');
    this.padTokenId = idOf('pad_token');
    const templateTokens: Record<string, string> = {};
    for (const field of ['bos_token', 'eos_token', 'pad_token', 'unk_token']) {
      const c = tokenContent(tokenizerConfig[field]);
      if (c !== null) templateTokens[field] = c;
    }
    this.templateTokens = Object.freeze(templateTokens);

    let template: unknown = chatTemplateFile ?? tokenizerConfig.chat_template ?? null;
    if (Array.isArray(template)) {
      // Some configs hold named templates: [{name: "default", template: ...}, ...].
      const named = template as unknown[];
      named.forEach((t, i) => {
        if (t === null || typeof t !== 'object' || Array.isArray(t)) {
          throw new ArpoError('BAD_CHECKPOINT', `${source}: expected an object {name, template} for chat_template[${i}] but received ${describeValue(t)} of type ${describeType(t)}`);
        }
      });
      const entries = named as Array<{ name?: unknown; template?: unknown }>;
      template = (entries.find((t) => t.name === 'default') ?? entries[0])?.template ?? null;
    }
    if (template !== null && typeof template !== 'string') {
      throw new ArpoError('BAD_CHECKPOINT', `${source}: chat_template must be a string, got ${typeof template}`);
    }
    this.chatTemplate = template;
  }

  /** Loads `<dir>/tokenizer.json` and `<dir>/tokenizer_config.json` (optional); a `chat_template.jinja` / `chat_template.json` there overrides the config's template. */
  static fromDir(dir: string): Tokenizer {
    const tokFile = path.join(dir, 'tokenizer.json');
    const cfgFile = path.join(dir, 'tokenizer_config.json');
    const tplFile = path.join(dir, 'chat_template.jinja');
    const tplJsonFile = path.join(dir, 'chat_template.json'); // older transformers: {"chat_template": "..."}
    const config = fs.existsSync(cfgFile) ? readJson(cfgFile) : {};
    let template: string | null = null;
    if (fs.existsSync(tplFile)) template = fs.readFileSync(tplFile, 'utf8');
    else if (fs.existsSync(tplJsonFile)) {
      const t = readJson(tplJsonFile).chat_template;
      if (typeof t === 'string') template = t;
    }
    return new Tokenizer(readJson(tokFile), config, tokFile, template);
  }

  /** From the parsed tokenizer.json and tokenizer_config.json objects. */
  static fromObjects(tokenizerJson: Json, tokenizerConfig: Json = {}, source = 'tokenizer.json'): Tokenizer {
    return new Tokenizer(tokenizerJson, tokenizerConfig, source, null);
  }

  /** Id of a token string (added tokens included), or undefined. */
  tokenId(token: string): number | undefined {
    return this.hf.token_to_id(token);
  }

  /** Text -> ids; special-token strings in the text become their special ids (use encodeToolResult for untrusted text). */
  encode(text: string, options: EncodeOptions = {}): Int32Array {
    if (typeof text !== 'string') throw invalidArgument('a string', 'text', text);
    if (text.length === 0 && !options.addSpecialTokens) return new Int32Array(0);
    return Int32Array.from(this.hf.encode(text, { add_special_tokens: options.addSpecialTokens ?? false }).ids);
  }

  /**
   * Encodes a tool result once, as plain text, for appending to a trajectory
   * (token in, token out: never re-tokenise the trajectory). No BOS/EOS, and
   * special-token strings inside the text (a web page quoting `<|im_end|>`)
   * are tokenised as ordinary text, as HF's split_special_tokens=True does,
   * so a tool can never inject a turn boundary.
   */
  encodeToolResult(text: string): Int32Array {
    if (typeof text !== 'string') throw invalidArgument('a string', 'text', text);
    if (!this.specialContents.some((s) => text.includes(s))) return this.encode(text);
    const hf = this.hf as unknown as {
      normalizer: ((t: string) => string) | null;
      pre_tokenizer: ((t: string, o?: unknown) => string[]) | null;
      model: ((tokens: string[]) => string[]) & { tokens_to_ids: Map<string, number>; unk_token_id?: number };
    };
    const ids: number[] = [];
    // Non-special added tokens (e.g. Qwen's <think>) still match, as in HF.
    const sections = splitOn(text, [...this.nonSpecialAdded.keys()]);
    sections.forEach((section, sectionIndex) => {
      const addedId = this.nonSpecialAdded.get(section);
      if (addedId !== undefined) {
        ids.push(addedId);
        return;
      }
      const normalized = hf.normalizer ? hf.normalizer(section) : section;
      if (normalized.length === 0) return;
      const pieces = hf.pre_tokenizer ? hf.pre_tokenizer(normalized, { section_index: sectionIndex }) : [normalized];
      for (const token of hf.model(pieces)) {
        const id = hf.model.tokens_to_ids.get(token) ?? hf.model.unk_token_id;
        if (id === undefined) throw new ArpoError('BAD_DATA', `${this.source}: cannot encode piece ${JSON.stringify(token)} (no unk token)`);
        ids.push(id);
      }
    });
    return Int32Array.from(ids);
  }

  /**
   * Ids -> text (clean_up_tokenization_spaces as the tokenizer config says).
   * Ids without a token (a model's padded vocabulary rows beyond the
   * tokenizer's, e.g. Qwen's 151669..151935) decode to nothing, as in HF;
   * anything but a non-negative integer is an error.
   */
  decode(ids: ArrayLike<number>, options: DecodeOptions = {}): string {
    const list: number[] = [];
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i]!;
      if (!Number.isInteger(id) || id < 0) throw invalidArgument('a non-negative integer token id', `ids[${i}]`, id);
      if (id < this.vocabSize && this.hf.id_to_token(id) !== undefined) list.push(id);
    }
    if (list.length === 0) return '';
    return this.hf.decode(list, { skip_special_tokens: options.skipSpecialTokens ?? false });
  }

  /** The text of one token on its own (a partial UTF-8 sequence shows as U+FFFD: use IncrementalDetokenizer for streams). */
  tokenPiece(id: number): string {
    return this.decode([id]);
  }

  /** The chat template rendered and encoded (see chat.ts). */
  applyChatTemplate(messages: readonly ChatMessage[], options: ChatTemplateOptions): ChatPrompt {
    return applyChatTemplate(this, messages, options);
  }

  /** A streaming detokeniser over this tokenizer. */
  detokenizer(options: DecodeOptions = {}): IncrementalDetokenizer {
    return new IncrementalDetokenizer(this, options);
  }
}

/** Splits text into sections, each either one of `tokens` (longest match first) or text between them. */
function splitOn(text: string, tokens: readonly string[]): string[] {
  if (tokens.length === 0) return [text];
  const sorted = [...tokens].sort((a, b) => b.length - a.length);
  const out: string[] = [];
  let start = 0;
  let i = 0;
  while (i < text.length) {
    const hit = sorted.find((t) => t.length > 0 && text.startsWith(t, i));
    if (hit) {
      if (i > start) out.push(text.slice(start, i));
      out.push(hit);
      i += hit.length;
      start = i;
    } else {
      i++;
    }
  }
  if (start < text.length) out.push(text.slice(start));
  return out;
}

/**
 * Turns a token stream into text pieces whose concatenation equals decoding
 * the whole stream, correct across multi-byte UTF-8 characters split over
 * tokens and across decoders that depend on neighbours (SentencePiece
 * spaces). The method of HF text-generation-inference's `decode_token`: keep
 * a prefix window [prefixOffset, readOffset), decode window + new tokens, emit
 * the new suffix unless it ends in an incomplete character (U+FFFD). Cost per
 * token is O(window), never O(stream).
 */
export class IncrementalDetokenizer {
  private readonly ids: number[] = [];
  private prefixOffset = 0;
  private readOffset = 0;

  constructor(private readonly tokenizer: Tokenizer, private readonly options: DecodeOptions = {}) {}

  /** Number of tokens pushed. */
  get length(): number {
    return this.ids.length;
  }

  /** Adds one token; returns the newly completed text ('' while a character is incomplete). */
  push(id: number): string {
    this.ids.push(id);
    const prefixText = this.tokenizer.decode(this.ids.slice(this.prefixOffset, this.readOffset), this.options);
    const newText = this.tokenizer.decode(this.ids.slice(this.prefixOffset), this.options);
    // A UTF-8 character spans at most 4 bytes, so 4 pending tokens with a
    // trailing U+FFFD mean a genuinely invalid sequence: emit it rather than stall.
    const pending = this.ids.length - this.readOffset;
    if (newText.length > prefixText.length && (!newText.endsWith('\uFFFD') || pending >= 4)) {
      const piece = newText.slice(prefixText.length);
      this.prefixOffset = this.readOffset;
      this.readOffset = this.ids.length;
      return piece;
    }
    return '';
  }

  /** Text still held back (an incomplete character at the end of the stream), released as is. */
  flush(): string {
    if (this.readOffset === this.ids.length) return '';
    const prefixText = this.tokenizer.decode(this.ids.slice(this.prefixOffset, this.readOffset), this.options);
    const newText = this.tokenizer.decode(this.ids.slice(this.prefixOffset), this.options);
    this.prefixOffset = this.readOffset;
    this.readOffset = this.ids.length;
    return newText.slice(prefixText.length);
  }
}

// ------------------------------------------------------------ tiny byte-level BPE
/** GPT-2's reversible byte -> printable character table (ByteLevel pre-tokenizer / decoder). */
export function bytesToUnicode(): string[] {
  const table = new Array<string>(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table[b] = String.fromCodePoint(printable ? b : 256 + extra++);
  }
  return table;
}

/** ChatML (the Qwen turn format) for the tiny tokenizer; tools are listed in the system turn. */
export const CHATML_TEMPLATE =
  "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}" +
  "{{- '# Tools\\n' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}{{- '<|im_end|>\\n' }}" +
  "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}" +
  "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}" +
  "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}" +
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

export interface TinyTokenizerFiles {
  tokenizerJson: Json;
  tokenizerConfig: Json;
}

/**
 * A small byte-level BPE in HF tokenizer.json format: the 256 byte tokens,
 * then whole-word tokens for `words` built by left-to-right merges (each word
 * also with a leading space, Ġ), then the special tokens. Any text encodes
 * and round-trips exactly (bytes are always there); listed words become one
 * token unless an earlier word's merges cut into them (words sharing letter
 * pairs in a different grouping). Used by tests and the demo world.
 */
export function buildTinyBpeTokenizer(
  words: readonly string[],
  specials: readonly string[] = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'],
): TinyTokenizerFiles {
  const byteChar = bytesToUnicode();
  const vocab = Object.create(null) as Record<string, number>; // no prototype: words like "constructor" are ordinary keys
  const merges: string[] = [];
  let next = 0;
  const add = (tok: string): void => {
    if (!(tok in vocab)) vocab[tok] = next++;
  };
  for (let b = 0; b < 256; b++) add(byteChar[b]!);
  for (const word of words) {
    if (typeof word !== 'string' || word.length === 0) throw invalidArgument('non-empty strings', 'words', word);
    const units = [...Buffer.from(word, 'utf8')].map((b) => byteChar[b]!);
    let acc = units[0]!;
    for (let i = 1; i < units.length; i++) {
      const merged = acc + units[i]!;
      if (!(merged in vocab)) {
        merges.push(`${acc} ${units[i]!}`);
        add(merged);
      }
      acc = merged;
    }
    // The word after a space: one more merge, Ġ + the finished word (BPE
    // applies merges by rank, so the word is whole before this one fires).
    const spaced = byteChar[0x20]! + acc;
    if (!(spaced in vocab)) {
      merges.push(`${byteChar[0x20]!} ${acc}`);
      add(spaced);
    }
  }
  const addedTokens = specials.map((content) => ({ id: next++, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
  const tokenizerJson: Json = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges },
  };
  const has = (s: string): boolean => specials.includes(s);
  const tokenizerConfig: Json = {
    add_bos_token: false,
    clean_up_tokenization_spaces: false,
    model_max_length: 32768,
    tokenizer_class: 'PreTrainedTokenizerFast',
    bos_token: null,
    eos_token: has('<|im_end|>') ? '<|im_end|>' : (specials[0] ?? null),
    pad_token: has('<|endoftext|>') ? '<|endoftext|>' : null,
    chat_template: has('<|im_start|>') && has('<|im_end|>') ? CHATML_TEMPLATE : null,
  };
  return { tokenizerJson, tokenizerConfig };
}

/** Writes tokenizer.json + tokenizer_config.json into dir (created if needed). */
export function writeTokenizerFiles(dir: string, files: TinyTokenizerFiles): void {
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(files.tokenizerJson));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), `${JSON.stringify(files.tokenizerConfig, null, 2)}\n`);
}
