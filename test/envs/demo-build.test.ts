// buildDemoEnvironment end to end: byte-identical files for a seed, the verl row format, and the
// tokenizer loaded by @huggingface/tokenizers (exact round-trip, single-token tags and digits,
// merges applied as a naive BPE reference would, compositional names).
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';
import { buildDemoEnvironment, renderChatML, type DemoEnvironment } from '../../lib/envs/demo';
import { bytesToUnicode, CHAT_SPECIAL_TOKENS, PROTOCOL_TOKENS } from '../../lib/envs/demo/tokenizer';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-envs-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

let env: DemoEnvironment;
let buildMs = 0;
let tokenizer: Tokenizer;
let tokenizerJson: { model: { vocab: Record<string, number>; merges: [string, string][] }; added_tokens: { id: number; content: string; special: boolean }[] };
beforeAll(async () => {
  const t0 = performance.now();
  env = await buildDemoEnvironment({ seed: 42, dir: path.join(tmp, 'a') });
  buildMs = performance.now() - t0;
  tokenizerJson = JSON.parse(fs.readFileSync(env.files.tokenizer, 'utf8'));
  tokenizer = new Tokenizer(tokenizerJson, JSON.parse(fs.readFileSync(env.files.tokenizerConfig, 'utf8')));
});

const readLines = (file: string) => fs.readFileSync(file, 'utf8').trimEnd().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
const encode = (text: string) => tokenizer.encode(text, { add_special_tokens: false }).ids;

describe('buildDemoEnvironment', () => {
  it('writes byte-identical files for the same seed, different ones for another seed, in under 5 s', async () => {
    expect(buildMs).toBeLessThan(5000);
    const again = await buildDemoEnvironment({ seed: 42, dir: path.join(tmp, 'b') });
    const other = await buildDemoEnvironment({ seed: 43, dir: path.join(tmp, 'c') });
    for (const key of Object.keys(env.files) as (keyof typeof env.files)[]) {
      const a = fs.readFileSync(env.files[key]);
      expect(a.equals(fs.readFileSync(again.files[key]))).toBe(true);
      if (key !== 'tokenizerConfig') expect(a.equals(fs.readFileSync(other.files[key]))).toBe(false);
    }
  });

  it('writes question files in the reference verl row format, counts as in the manifest', () => {
    const m = env.manifest;
    for (const split of ['train', 'valid', 'test'] as const) {
      const rows = readLines(env.files[split]);
      expect(rows).toHaveLength(env.questions[split].length);
      rows.forEach((row, i) => {
        const q = env.questions[split][i];
        expect(row).toEqual({
          data_source: 'arpo_demo',
          prompt: [{ role: 'system', content: m.systemPrompt }, { role: 'user', content: q?.question }],
          ability: 'qa',
          reward_model: { ground_truth: q?.groundTruth, style: 'rule' },
          extra_info: { question: q?.question, index: i, split, id: q?.id, family: q?.family, needs: q?.needs },
          metadata: null,
        });
      });
    }
    expect(readLines(env.files.corpus)).toHaveLength(env.corpus.length);
    const corpusKeys = Object.keys(readLines(env.files.corpus)[0] ?? {});
    expect(corpusKeys).toEqual(['id', 'title', 'text']);
    const sft = readLines(env.files.sft);
    expect(sft).toHaveLength(400);
    expect(m.counts.sftTraces).toBe(400);
    expect(JSON.parse(fs.readFileSync(env.files.manifest, 'utf8'))).toEqual(m);
    expect(m.toolBackend).toBe('local-test-helper');
  });

  it('builds the traces with the caller tools once corpus.jsonl exists', async () => {
    const dir = path.join(tmp, 'd');
    let corpusAtCall = '';
    const custom = await buildDemoEnvironment({
      seed: 42, dir, sizes: { sft: 20, questions: { train: 100, valid: 20, test: 20 } },
      createRunTool: ({ corpus }) => {
        corpusAtCall = fs.readFileSync(corpus, 'utf8');
        return async (tag, content) => `${tag} said ${content.length}`;
      },
    });
    expect(corpusAtCall.split('\n').length).toBe(custom.corpus.length + 1);
    expect(custom.manifest.toolBackend).toBe('custom');
    const results = custom.traces.flatMap((t) => t.toolCalls.map((c) => c.result));
    expect(results.length).toBeGreaterThan(10);
    for (const r of results) expect(r).toMatch(/^(search|python) said \d+$/);
    // Tools that do not state the facts make ungrounded traces, and the manifest says so.
    expect(custom.manifest.counts.sftGrounded).toBeLessThan(20);
  });

  it('rejects bad options naming the field', async () => {
    await expect(buildDemoEnvironment({ seed: 1, dir: '' })).rejects.toThrow('Expected a non-empty folder path for dir but received "" of type string');
    await expect(buildDemoEnvironment({ seed: 1, dir: path.join(tmp, 'e'), sizes: { sft: 5000 } })).rejects.toThrow('for sizes.sft but received 5000');
    await expect(buildDemoEnvironment({ seed: 1, dir: path.join(tmp, 'e'), sizes: { vocabSize: 10 } })).rejects.toThrow('for sizes.vocabSize but received 10');
    await expect(buildDemoEnvironment({ seed: 'x' as never, dir: path.join(tmp, 'e') })).rejects.toThrow('for seed but received "x" of type string');
  });
});

describe('demo tokenizer', () => {
  it('loads in @huggingface/tokenizers and round-trips every generated text exactly', () => {
    const texts: string[] = [];
    for (const d of env.corpus) texts.push(`${d.title}. ${d.text}`, JSON.stringify(d));
    for (const split of ['train', 'valid', 'test'] as const) {
      for (const q of env.questions[split]) texts.push(renderChatML([{ role: 'system', content: env.manifest.systemPrompt }, { role: 'user', content: q.question }], true));
    }
    for (const t of env.traces) {
      texts.push(renderChatML(t.messages, false));
      for (const s of t.messages[2].segments) texts.push(s.text);
    }
    // Text the policy may produce that the demo never wrote: byte-level BPE must still round-trip it.
    texts.push('Traceback (most recent call last):\n  File "<string>", line 1\n\tZeroDivisionError: ß ∑ 漢字 🙂 \u0000 \r\n', '  <think><think>}}\\boxed{\\boxed{ ');
    let mismatches = 0;
    for (const text of texts) {
      const back = tokenizer.decode(encode(text));
      if (back !== text && mismatches++ < 3) console.log('round-trip mismatch', JSON.stringify(text.slice(0, 120)), JSON.stringify(back.slice(0, 120)));
    }
    expect(mismatches).toBe(0);
    expect(texts.length).toBeGreaterThan(3000);
  });

  it('makes each tag and special one token, each digit one token, and stays small', () => {
    const added = new Map(tokenizerJson.added_tokens.map((t) => [t.content, t]));
    for (const tag of [...CHAT_SPECIAL_TOKENS, ...PROTOCOL_TOKENS]) {
      expect(encode(tag)).toEqual([added.get(tag)?.id]);
      expect(encode(`x ${tag} y`)).toContain(added.get(tag)?.id);
    }
    for (const s of CHAT_SPECIAL_TOKENS) expect(added.get(s)?.special).toBe(true);
    expect(added.get('<think>')?.special).toBe(false);
    expect(encode('\\boxed{1843}')).toEqual([added.get('\\boxed{')?.id, ...'1843'.split('').map((d) => encode(d)[0]), added.get('}')?.id]);
    for (const d of '0123456789') expect(encode(d)).toHaveLength(1);
    expect(encode(' 2234108')).toHaveLength(8); // space, then one token per digit
    const ids = new Set([...Object.values(tokenizerJson.model.vocab), ...tokenizerJson.added_tokens.map((t) => t.id)]);
    expect(env.manifest.tokenizer.vocabSize).toBe(ids.size);
    expect(Math.max(...ids)).toBe(ids.size - 1); // ids are dense 0..V-1
    expect(ids.size).toBeLessThanOrEqual(1536);
    expect(ids.size).toBeGreaterThan(600);
    // The chat specials of the config exist as tokens.
    const config = JSON.parse(fs.readFileSync(env.files.tokenizerConfig, 'utf8')) as { eos_token: string; pad_token: string };
    expect(added.get(config.eos_token)).toBeDefined();
    expect(added.get(config.pad_token)).toBeDefined();
  });

  it('honours a small vocabulary budget and still round-trips', async () => {
    const small = await buildDemoEnvironment({ seed: 42, dir: path.join(tmp, 'small'), sizes: { vocabSize: 400, sft: 50 } });
    expect(small.manifest.tokenizer.vocabSize).toBeLessThanOrEqual(400);
    const tok = new Tokenizer(JSON.parse(fs.readFileSync(small.files.tokenizer, 'utf8')), JSON.parse(fs.readFileSync(small.files.tokenizerConfig, 'utf8')));
    for (const t of small.traces) {
      const text = renderChatML(t.messages, false);
      expect(tok.decode(tok.encode(text, { add_special_tokens: false }).ids)).toBe(text);
    }
  });

  it('applies its merges the way a naive BPE does', () => {
    // Reference: split on added tokens, pre-tokenize, map bytes to GPT-2 characters, then repeatedly
    // merge the adjacent pair of lowest rank (Sennrich et al.), as the Rust library defines BPE.
    const byteChars = bytesToUnicode();
    const rank = new Map(tokenizerJson.model.merges.map(([a, b], i) => [`${a} ${b}`, i]));
    const vocab = tokenizerJson.model.vocab;
    const addedIds = new Map(tokenizerJson.added_tokens.map((t) => [t.content, t.id]));
    const addedRe = new RegExp(`(${[...addedIds.keys()].sort((a, b) => b.length - a.length).map((s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|')})`);
    const pre = /[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;
    const naive = (text: string): number[] => {
      const out: number[] = [];
      for (const part of text.split(addedRe)) {
        if (part === '') continue;
        const id = addedIds.get(part);
        if (id !== undefined) { out.push(id); continue; }
        for (const piece of part.match(pre) ?? []) {
          let sym = Array.from(new TextEncoder().encode(piece), (b) => byteChars[b] as string);
          for (;;) {
            let best = -1;
            let bestRank = Infinity;
            for (let i = 0; i + 1 < sym.length; i++) {
              const r = rank.get(`${sym[i]} ${sym[i + 1]}`);
              if (r !== undefined && r < bestRank) { bestRank = r; best = i; }
            }
            if (best < 0) break;
            sym = [...sym.slice(0, best), (sym[best] as string) + (sym[best + 1] as string), ...sym.slice(best + 2)];
          }
          for (const s of sym) out.push(vocab[s] as number);
        }
      }
      return out;
    };
    const sample = [...env.traces.slice(0, 60).map((t) => renderChatML(t.messages, false)), ...env.corpus.slice(0, 60).map((d) => d.text)];
    for (const text of sample) expect(encode(text)).toEqual(naive(text));
  });

  it('keeps names compositional: every name is its syllable tokens, held-out prompts use only tokens seen in SFT', () => {
    let words = 0;
    for (const e of env.world.entities) {
      for (const word of e.name.split(' ')) {
        const syllables = env.world.lexicon[word];
        if (!syllables) continue;
        const expected = syllables.map((syl, i) => (i === 0 ? `\u0120${syl}` : syl)); // U+0120: the byte-level space
        expect(tokenizer.encode(` ${word}`, { add_special_tokens: false }).tokens).toEqual(expected);
        words++;
      }
    }
    expect(words).toBeGreaterThan(300);
    const seen = new Set<number>();
    for (const t of env.traces) for (const id of encode(renderChatML(t.messages, false))) seen.add(id);
    const unseen = new Set<string>();
    for (const q of [...env.questions.test, ...env.questions.valid]) {
      const ids = encode(q.question);
      for (const id of ids) if (!seen.has(id)) unseen.add(tokenizer.decode([id]));
    }
    // Held-out questions are about entities never in training; their names are still made of trained tokens.
    expect([...unseen]).toEqual([]);
  });

  it('writes a chat template that @huggingface/jinja renders as ChatML', () => {
    const config = JSON.parse(fs.readFileSync(env.files.tokenizerConfig, 'utf8')) as { chat_template: string };
    const messages = env.traces[0]?.messages.map((m) => ({ role: m.role, content: m.content })) ?? [];
    const template = new Template(config.chat_template);
    expect(template.render({ messages, add_generation_prompt: false })).toBe(renderChatML(messages, false));
    expect(template.render({ messages: messages.slice(0, 2), add_generation_prompt: true })).toBe(
      `<|im_start|>system\n${messages[0]?.content}<|im_end|>\n<|im_start|>user\n${messages[1]?.content}<|im_end|>\n<|im_start|>assistant\n`,
    );
  });
});
