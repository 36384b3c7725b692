// A small byte-level BPE tokenizer for the demo, trained on the generated texts and written in the
// Hugging Face `tokenizer.json` / `tokenizer_config.json` format (the Qwen2 layout, scaled down).
//
// Design: byte-level (GPT-2 byte-to-unicode alphabet, all 256 bytes) so every string round-trips
// exactly, whatever the policy generates; the Qwen2 pre-tokenizer split, which puts every digit in
// its own piece (numbers tokenise compositionally); protocol tags and chat specials as added tokens
// (always one token each). Invented names are trained as their syllables, so no entity name is a
// single token: names in held-out questions are built from tokens seen in training.
import * as fs from 'fs';
import * as path from 'path';
import { invalidArgument } from '../../errors';
import { DEMO_CHAT_TEMPLATE } from './prompt';

/** Chat specials (special: true): skipped when decoding with skip_special_tokens. */
export const CHAT_SPECIAL_TOKENS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'] as const;

/** Protocol tags (special: false, like Qwen3's `<think>`): kept in decoded text, where rewards parse them. */
export const PROTOCOL_TOKENS = [
  '<think>', '</think>', '<search>', '</search>', '<python>', '</python>',
  '<result>', '</result>', '<answer>', '</answer>', '\\boxed{', '}',
] as const;

/**
 * The Qwen2 pre-tokenizer pattern without its leading `(?i:'s|'t|...)` contraction
 * group (the demo text has no contractions, and `(?i:` is not JavaScript regex
 * syntax). `\p{N}` alone makes every digit its own piece.
 */
export const PRETOKENIZE_PATTERN = "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/**
 * GPT-2's reversible byte -> printable character map (openai/gpt-2 encoder.py,
 * bytes_to_unicode): printable Latin-1 bytes map to themselves, the other 68
 * to U+0100 onwards, so a byte string is a string of visible characters.
 */
export function bytesToUnicode(): string[] {
  const keep: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) keep.push(b);
  for (let b = 0xa1; b <= 0xac; b++) keep.push(b);
  for (let b = 0xae; b <= 0xff; b++) keep.push(b);
  const map: string[] = new Array<string>(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) map[b] = keep.includes(b) ? String.fromCharCode(b) : String.fromCharCode(256 + extra++);
  return map;
}

const BYTE_CHARS = bytesToUnicode();
const ENCODER = new TextEncoder();

/** Text -> its byte-level characters, one per UTF-8 byte. */
export function toByteLevel(text: string): string[] {
  return Array.from(ENCODER.encode(text), (b) => BYTE_CHARS[b] as string);
}

function escapeRegex(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** Splits text on added tokens (longest first, as Hugging Face does), dropping the tokens themselves. */
export function splitOnAddedTokens(text: string, added: readonly string[]): string[] {
  const sorted = [...added].sort((a, b) => b.length - a.length);
  const re = new RegExp(sorted.map(escapeRegex).join('|'), 'g');
  return text.split(re).filter((s) => s.length > 0);
}

/** The pre-tokenizer's pieces of a text that holds no added tokens. */
export function pretokenize(text: string): string[] {
  return text.match(new RegExp(PRETOKENIZE_PATTERN, 'gu')) ?? [];
}

export interface BpeTrainingOptions {
  /** Upper bound on the vocabulary: 256 bytes + merges + added tokens. */
  readonly vocabSize: number;
  /** A pair is merged only if it occurs at least this often (weighted by word counts). */
  readonly minFrequency: number;
  /** Invented word -> syllables: such words are counted as their syllables, never merged whole. */
  readonly lexicon?: Readonly<Record<string, readonly string[]>>;
}

/**
 * Word frequencies of the pre-tokenized texts, with lexicon words replaced by
 * their syllables; the syllable forms are also counted on their own.
 */
function countWords(
  texts: readonly string[], lexicon: Readonly<Record<string, readonly string[]>>, added: readonly string[],
): { words: Map<string, number>; syllables: Map<string, number> } {
  const words = new Map<string, number>();
  const syllableForms = new Map<string, number>();
  const add = (m: Map<string, number>, w: string) => m.set(w, (m.get(w) ?? 0) + 1);
  for (const text of texts) {
    for (const section of splitOnAddedTokens(text, added)) {
      for (const piece of pretokenize(section)) {
        const m = /^([^\p{L}\p{N}]?)(\p{L}+)$/u.exec(piece);
        const syllables = m ? lexicon[m[2] as string] : undefined;
        if (!m || !syllables) {
          add(words, piece);
          continue;
        }
        // The first syllable keeps the piece's prefix (a space) as the pre-tokenizer would.
        syllables.forEach((s, i) => {
          const form = i === 0 ? (m[1] as string) + s : s;
          add(words, form);
          add(syllableForms, form);
        });
      }
    }
  }
  return { words, syllables: syllableForms };
}

/** Merges `a b` into `ab` wherever it occurs in w, left to right (one BPE merge step). */
function applyMerge(w: string[], a: string, b: string): string[] {
  const merged: string[] = [];
  for (let i = 0; i < w.length; i++) {
    if (i + 1 < w.length && w[i] === a && w[i + 1] === b) {
      merged.push(a + b);
      i++;
    } else merged.push(w[i] as string);
  }
  return merged;
}

/**
 * Classic BPE training (Sennrich et al. 2016) over weighted words, after
 * applying `initial` merges: repeatedly merge the most frequent adjacent pair
 * of symbols (ties: the lexicographically smallest pair, for determinism),
 * updating pair counts incrementally for the words that contain it.
 */
function learnMerges(entries: readonly [string, number][], budget: number, minFrequency: number, initial: readonly [string, string][]): [string, string][] {
  const words = entries.map(([w]) => initial.reduce((sym, [a, b]) => applyMerge(sym, a, b), toByteLevel(w)));
  const freq = entries.map(([, c]) => c);
  // Byte-level symbols never contain ' ' (space maps to U+0120), so it separates a pair's halves.
  const pairCount = new Map<string, number>();
  const pairWords = new Map<string, Set<number>>();
  const addPairs = (wi: number, sign: 1 | -1) => {
    const w = words[wi] as string[];
    for (let i = 0; i + 1 < w.length; i++) {
      const key = `${w[i]} ${w[i + 1]}`;
      pairCount.set(key, (pairCount.get(key) ?? 0) + sign * (freq[wi] as number));
      if (sign > 0) {
        let set = pairWords.get(key);
        if (!set) pairWords.set(key, (set = new Set()));
        set.add(wi);
      }
    }
  };
  words.forEach((_, wi) => addPairs(wi, 1));
  const merges: [string, string][] = [];
  while (merges.length < budget) {
    let best: string | null = null;
    let bestCount = 0;
    for (const [key, c] of pairCount) {
      if (c > bestCount || (c === bestCount && best !== null && key < best)) {
        best = key;
        bestCount = c;
      }
    }
    if (best === null || bestCount < minFrequency) break;
    const [a, b] = best.split(' ') as [string, string];
    merges.push([a, b]);
    for (const wi of pairWords.get(best) ?? []) {
      addPairs(wi, -1);
      words[wi] = applyMerge(words[wi] as string[], a, b);
      addPairs(wi, 1);
    }
    pairWords.delete(best);
    for (const [key, c] of pairCount) if (c <= 0) pairCount.delete(key);
  }
  return merges;
}

const byKey = (a: [string, number], b: [string, number]) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0);

/** Naive BPE of one pre-token: merge the adjacent pair of lowest rank until none applies. */
function encodePiece(symbols: readonly string[], rank: ReadonlyMap<string, number>): string[] {
  let sym = symbols.slice();
  for (;;) {
    let best = -1;
    let bestRank = Infinity;
    for (let i = 0; i + 1 < sym.length; i++) {
      const r = rank.get(`${sym[i]} ${sym[i + 1]}`);
      if (r !== undefined && r < bestRank) {
        bestRank = r;
        best = i;
      }
    }
    if (best < 0) return sym;
    sym = [...sym.slice(0, best), (sym[best] as string) + (sym[best + 1] as string), ...sym.slice(best + 2)];
  }
}

/**
 * Merges that make every syllable form one token: left-to-right prefix merges
 * (`v e`, then `ve l`), all two-symbol merges before all three-symbol ones;
 * then, for any form that an earlier merge cut differently (`bri` whose `r i`
 * outranks `b r`), merges joining its pieces, until every form is one token.
 * Built by construction rather than by frequency so that, with syllables that
 * start with a consonant, a merge of these can never straddle two syllables.
 */
function syllableMerges(forms: readonly string[]): [string, string][] {
  const merges: [string, string][] = [];
  const have = new Set<string>();
  const push = (a: string, b: string) => {
    if (!have.has(`${a} ${b}`)) {
      have.add(`${a} ${b}`);
      merges.push([a, b]);
    }
  };
  const steps: { len: number; a: string; b: string }[] = [];
  for (const f of forms) {
    const ch = toByteLevel(f);
    let acc = ch[0] as string;
    for (let i = 1; i < ch.length; i++) {
      steps.push({ len: i + 1, a: acc, b: ch[i] as string });
      acc += ch[i] as string;
    }
  }
  steps.sort((x, y) => x.len - y.len || (x.a + ' ' + x.b < y.a + ' ' + y.b ? -1 : x.a + ' ' + x.b > y.a + ' ' + y.b ? 1 : 0));
  for (const { a, b } of steps) push(a, b);
  for (let round = 0; round < 16; round++) {
    const rank = new Map(merges.map(([a, b], i) => [`${a} ${b}`, i]));
    let changed = false;
    for (const f of forms) {
      const pieces = encodePiece(toByteLevel(f), rank);
      let acc = pieces[0] as string;
      for (let i = 1; i < pieces.length; i++) {
        push(acc, pieces[i] as string);
        acc += pieces[i] as string;
        changed = true;
      }
    }
    if (!changed) break;
  }
  return merges;
}

/**
 * Trains the merges in two phases. First the syllables of invented names
 * (built, see syllableMerges): these merges get the lowest ranks, so when a
 * name is encoded its syllables form before any merge learned elsewhere can
 * cut across them, and a held-out name is made of the syllable tokens seen in
 * training. Then classic frequency-based BPE over everything, up to the budget.
 */
export function trainBpe(texts: readonly string[], options: BpeTrainingOptions): [string, string][] {
  const added = [...CHAT_SPECIAL_TOKENS, ...PROTOCOL_TOKENS];
  const budget = options.vocabSize - 256 - added.length + 1; // `}` reuses its byte id
  if (!Number.isInteger(options.vocabSize) || budget < 0) throw invalidArgument(`an integer >= ${256 + added.length - 1}`, 'vocabSize', options.vocabSize);
  if (!Number.isInteger(options.minFrequency) || options.minFrequency < 1) throw invalidArgument('an integer >= 1', 'minFrequency', options.minFrequency);
  const { words, syllables } = countWords(texts, options.lexicon ?? {}, added);
  const first = syllableMerges([...syllables.keys()].sort()).slice(0, budget);
  const rest = learnMerges([...words.entries()].sort(byKey), budget - first.length, options.minFrequency, first);
  return [...first, ...rest];
}

interface AddedTokenJson {
  id: number;
  content: string;
  single_word: boolean;
  lstrip: boolean;
  rstrip: boolean;
  normalized: boolean;
  special: boolean;
}

export interface TokenizerFiles {
  readonly tokenizerJson: Record<string, unknown>;
  readonly tokenizerConfig: Record<string, unknown>;
  readonly vocabSize: number;
  readonly mergeCount: number;
}

/**
 * Assembles tokenizer.json (ids: 256 bytes in byte order, then merges in rank
 * order, then the added tokens; `}` reuses its byte's id, as Hugging Face does
 * for an added token already in the vocabulary) and tokenizer_config.json.
 */
export function buildTokenizerFiles(merges: readonly [string, string][], modelMaxLength = 4096): TokenizerFiles {
  const vocab: Record<string, number> = {};
  BYTE_CHARS.forEach((c, i) => (vocab[c] = i));
  let next = 256;
  for (const [a, b] of merges) if (vocab[a + b] === undefined) vocab[a + b] = next++;
  const addedJson: AddedTokenJson[] = [];
  for (const content of [...CHAT_SPECIAL_TOKENS, ...PROTOCOL_TOKENS]) {
    const special = (CHAT_SPECIAL_TOKENS as readonly string[]).includes(content);
    const id = vocab[content] ?? next++;
    addedJson.push({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special });
  }
  const tokenizerJson = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: addedJson,
    normalizer: null,
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: PRETOKENIZE_PATTERN }, behavior: 'Isolated', invert: false },
        { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
      ],
    },
    post_processor: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: merges.map(([a, b]) => [a, b]),
    },
  };
  const decoderTable: Record<string, Omit<AddedTokenJson, 'id'>> = {};
  for (const t of addedJson) decoderTable[String(t.id)] = { content: t.content, lstrip: false, normalized: false, rstrip: false, single_word: false, special: t.special };
  const tokenizerConfig = {
    add_bos_token: false,
    add_prefix_space: false,
    added_tokens_decoder: decoderTable,
    additional_special_tokens: ['<|im_start|>', '<|im_end|>'],
    bos_token: null,
    chat_template: DEMO_CHAT_TEMPLATE,
    clean_up_tokenization_spaces: false,
    eos_token: '<|im_end|>',
    errors: 'replace',
    model_max_length: modelMaxLength,
    pad_token: '<|endoftext|>',
    split_special_tokens: false,
    tokenizer_class: 'Qwen2Tokenizer',
    unk_token: null,
  };
  return { tokenizerJson, tokenizerConfig, vocabSize: next, mergeCount: merges.length };
}

/** Writes tokenizer.json and tokenizer_config.json into dir; returns their paths. */
export function writeTokenizerFiles(dir: string, files: TokenizerFiles): { tokenizer: string; config: string } {
  fs.mkdirSync(dir, { recursive: true });
  const tokenizer = path.join(dir, 'tokenizer.json');
  const config = path.join(dir, 'tokenizer_config.json');
  fs.writeFileSync(tokenizer, JSON.stringify(files.tokenizerJson, null, 2) + '\n');
  fs.writeFileSync(config, JSON.stringify(files.tokenizerConfig, null, 2) + '\n');
  return { tokenizer, config };
}
