// The embedded demo environment: one call writes a seeded synthetic world's search corpus,
// question splits (verl row format), SFT traces, a small tokenizer and a manifest into a folder.
import * as fs from 'fs';
import * as path from 'path';
import { invalidArgument } from '../../errors';
import { corpusJsonl, generateCorpus, type CorpusDocInfo } from './corpus';
import { localRunTool, type RunTool } from './local-tools';
import { DEMO_SYSTEM_PROMPT, renderChatML } from './prompt';
import { DEFAULT_QUESTION_SIZES, generateQuestions, type DemoQuestion, type QuestionSizes } from './questions';
import { buildTokenizerFiles, trainBpe } from './tokenizer';
import { DEFAULT_FLAW_RATES, FLAWS, generateTraces, tracesJsonl, type Flaw, type SftTrace } from './traces';
import { DEFAULT_WORLD_SIZES, SPLITS, generateWorld, type Split, type World, type WorldSizes } from './world';

export { DEMO_SYSTEM_PROMPT, DEMO_CHAT_TEMPLATE, renderChatML } from './prompt';
export { localRunTool, localSearch, localPython, type RunTool } from './local-tools';
export { openDemoTools, demoIsolation, type DemoTools, type DemoToolsOptions } from './tools';
export { PretrainCurriculum, PRETRAIN_TASKS, PRETRAIN_MIX, type PretrainSequence, type PretrainTask } from './pretrain';
export type { DemoQuestion, QuestionFamily, SolutionStep } from './questions';
export type { SftTrace, TraceSegment, Flaw } from './traces';
export type { World, Entity, Split } from './world';

export const DEMO_DATA_SOURCE = 'arpo_demo';

export interface DemoSizes {
  readonly world?: Partial<WorldSizes>;
  readonly questions?: Partial<QuestionSizes>;
  /** Number of SFT traces, written for the first `sft` train questions. */
  readonly sft?: number;
  /** Upper bound on the tokenizer's vocabulary (bytes + merges + added tokens). */
  readonly vocabSize?: number;
}

export interface BuildDemoOptions {
  readonly seed: number;
  /** Output folder (created if missing; files in it are overwritten). */
  readonly dir: string;
  readonly sizes?: DemoSizes;
  readonly flawRates?: Readonly<Partial<Record<Flaw, number>>>;
  /**
   * Makes the tool runner for the SFT traces once corpus.jsonl exists (the real
   * search engine indexes that file). It returns the text that goes between
   * ` <result>\n` and `\n</result>`, normalised exactly as the rollout will do it.
   * Default: `localRunTool`, the in-process test helper.
   */
  readonly createRunTool?: (paths: { corpus: string; dir: string }) => RunTool | Promise<RunTool>;
}

export interface DemoFiles {
  readonly corpus: string;
  readonly train: string;
  readonly valid: string;
  readonly test: string;
  readonly sft: string;
  readonly tokenizer: string;
  readonly tokenizerConfig: string;
  readonly manifest: string;
}

export interface DemoEnvironment {
  readonly dir: string;
  readonly files: DemoFiles;
  readonly world: World;
  readonly corpus: readonly CorpusDocInfo[];
  readonly questions: Readonly<Record<Split, readonly DemoQuestion[]>>;
  readonly traces: readonly SftTrace[];
  readonly manifest: DemoManifest;
}

export interface DemoManifest {
  readonly name: 'arpo-demo';
  readonly formatVersion: 1;
  readonly seed: number;
  readonly dataSource: string;
  readonly splitPolicy: string;
  readonly toolBackend: 'local-test-helper' | 'custom';
  readonly sizes: { world: WorldSizes; questions: QuestionSizes; sft: number; vocabSize: number };
  readonly flawRates: Readonly<Record<Flaw, number>>;
  readonly counts: Record<string, unknown>;
  readonly tokenizer: { vocabSize: number; merges: number; eos: string; pad: string };
  readonly files: Record<keyof DemoFiles, string>;
  readonly systemPrompt: string;
}

/** One dataset row in the reference's verl format (see /work/shared/data/arpo/README.md). */
export function questionRow(q: DemoQuestion, index: number, systemPrompt = DEMO_SYSTEM_PROMPT): Record<string, unknown> {
  return {
    data_source: DEMO_DATA_SOURCE,
    prompt: [
      { role: 'system', content: systemPrompt },
      { role: 'user', content: q.question },
    ],
    ability: 'qa',
    reward_model: { ground_truth: q.groundTruth, style: 'rule' },
    extra_info: { question: q.question, index, split: q.split, id: q.id, family: q.family, needs: q.needs },
    metadata: null,
  };
}

function jsonl(rows: readonly unknown[]): string {
  return rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
}

function resolveSizes(sizes: DemoSizes | undefined): DemoManifest['sizes'] {
  if (sizes !== undefined && (sizes === null || typeof sizes !== 'object')) throw invalidArgument('an object', 'sizes', sizes);
  const world: WorldSizes = { ...DEFAULT_WORLD_SIZES, ...sizes?.world, splitFractions: { ...DEFAULT_WORLD_SIZES.splitFractions, ...sizes?.world?.splitFractions } };
  const questions: QuestionSizes = { ...DEFAULT_QUESTION_SIZES, ...sizes?.questions, familyMix: { ...DEFAULT_QUESTION_SIZES.familyMix, ...sizes?.questions?.familyMix } };
  const sft = sizes?.sft ?? Math.min(400, questions.train);
  if (typeof sft !== 'number' || !Number.isInteger(sft) || sft < 0 || sft > questions.train) {
    throw invalidArgument(`an integer in [0, ${questions.train}] (at most the train questions)`, 'sizes.sft', sft);
  }
  const vocabSize = sizes?.vocabSize ?? 1536;
  if (typeof vocabSize !== 'number' || !Number.isInteger(vocabSize) || vocabSize < 300 || vocabSize > 65536) {
    throw invalidArgument('an integer in [300, 65536]', 'sizes.vocabSize', vocabSize);
  }
  return { world, questions, sft, vocabSize };
}

function countBy<T>(items: readonly T[], key: (t: T) => string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const it of items) out[key(it)] = (out[key(it)] ?? 0) + 1;
  return Object.fromEntries(Object.entries(out).sort(([a], [b]) => (a < b ? -1 : 1)));
}

/**
 * Builds the demo environment into `dir`: corpus.jsonl, train/valid/test.jsonl,
 * sft.jsonl, tokenizer.json, tokenizer_config.json, manifest.json. The same seed
 * and sizes give byte-identical files (with the default tools, or with any
 * deterministic `createRunTool`).
 */
export async function buildDemoEnvironment(options: BuildDemoOptions): Promise<DemoEnvironment> {
  if (options === null || typeof options !== 'object') throw invalidArgument('an options object', 'options', options);
  const { seed, dir } = options;
  if (typeof dir !== 'string' || dir.length === 0) throw invalidArgument('a non-empty folder path', 'dir', dir);
  if (options.createRunTool !== undefined && typeof options.createRunTool !== 'function') {
    throw invalidArgument('a function ({ corpus, dir }) => RunTool', 'createRunTool', options.createRunTool);
  }
  const sizes = resolveSizes(options.sizes);
  const world = generateWorld(seed, sizes.world);
  const corpus = generateCorpus(world);
  const questions = generateQuestions(world, sizes.questions);

  fs.mkdirSync(dir, { recursive: true });
  const files: DemoFiles = {
    corpus: path.join(dir, 'corpus.jsonl'),
    train: path.join(dir, 'train.jsonl'),
    valid: path.join(dir, 'valid.jsonl'),
    test: path.join(dir, 'test.jsonl'),
    sft: path.join(dir, 'sft.jsonl'),
    tokenizer: path.join(dir, 'tokenizer.json'),
    tokenizerConfig: path.join(dir, 'tokenizer_config.json'),
    manifest: path.join(dir, 'manifest.json'),
  };
  fs.writeFileSync(files.corpus, corpusJsonl(corpus));
  for (const split of SPLITS) fs.writeFileSync(files[split], jsonl(questions[split].map((q, i) => questionRow(q, i))));

  const runTool = options.createRunTool ? await options.createRunTool({ corpus: files.corpus, dir }) : localRunTool(corpus);
  const flawRates = { ...DEFAULT_FLAW_RATES, ...options.flawRates };
  const traces = await generateTraces(questions.train.slice(0, sizes.sft), world, runTool, { seed, flawRates });
  fs.writeFileSync(files.sft, tracesJsonl(traces));

  // The tokenizer sees every text the demo will feed it: corpus, every prompt as rendered, every trace.
  const texts: string[] = corpus.map((d) => `${d.title}. ${d.text}`);
  for (const split of SPLITS) {
    for (const q of questions[split]) texts.push(renderChatML([{ role: 'system', content: DEMO_SYSTEM_PROMPT }, { role: 'user', content: q.question }], true));
  }
  for (const t of traces) texts.push(renderChatML(t.messages, false));
  const merges = trainBpe(texts, { vocabSize: sizes.vocabSize, minFrequency: 2, lexicon: world.lexicon });
  const tok = buildTokenizerFiles(merges);
  fs.writeFileSync(files.tokenizer, JSON.stringify(tok.tokenizerJson, null, 2) + '\n');
  fs.writeFileSync(files.tokenizerConfig, JSON.stringify(tok.tokenizerConfig, null, 2) + '\n');

  const allQuestions = SPLITS.flatMap((s) => questions[s]);
  const manifest: DemoManifest = {
    name: 'arpo-demo',
    formatVersion: 1,
    seed,
    dataSource: DEMO_DATA_SOURCE,
    splitPolicy:
      'disjoint entities: search and both questions of a split only involve entities assigned to that split ' +
      '(a company, its founder and headquarters share a split); python questions are distinct expressions across splits. ' +
      'The corpus holds every entity; sft.jsonl covers the first sizes.sft train questions.',
    toolBackend: options.createRunTool ? 'custom' : 'local-test-helper',
    sizes,
    flawRates: Object.fromEntries(FLAWS.map((f) => [f, flawRates[f]])) as Record<Flaw, number>,
    counts: {
      entities: countBy(world.entities.filter((e) => e.split !== null), (e) => e.kind),
      entitiesPerSplit: countBy(world.entities.filter((e) => e.split !== null), (e) => e.split ?? ''),
      decoys: world.entities.filter((e) => e.split === null).length,
      countries: world.countries.length,
      corpusDocs: countBy(corpus, (d) => d.role),
      questions: Object.fromEntries(SPLITS.map((s) => [s, countBy(questions[s], (q) => q.family)])),
      questionTemplates: countBy(allQuestions, (q) => q.template),
      sftTraces: traces.length,
      sftFlaws: countBy(traces, (t) => t.flaws[0] ?? 'none'),
      sftCorrect: traces.filter((t) => t.correct).length,
      sftWellFormed: traces.filter((t) => t.wellFormed).length,
      sftGrounded: traces.filter((t) => t.grounded).length,
    },
    tokenizer: { vocabSize: tok.vocabSize, merges: tok.mergeCount, eos: '<|im_end|>', pad: '<|endoftext|>' },
    files: Object.fromEntries(Object.entries(files).map(([k, v]) => [k, path.basename(v)])) as Record<keyof DemoFiles, string>,
    systemPrompt: DEMO_SYSTEM_PROMPT,
  };
  fs.writeFileSync(files.manifest, JSON.stringify(manifest, null, 2) + '\n');
  return { dir, files, world, corpus, questions, traces, manifest };
}
