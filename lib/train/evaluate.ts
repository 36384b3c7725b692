// `arpo eval`: evaluation of a model directory on a dataset with the run's
// tools and reward: accuracy, reward, format and tool use. Greedy (one sample
// per question) by default; with samples K at a temperature, accuracy is
// pass@1 averaged over the K samples, and acc/pass@K the share of questions
// with a right sample (the best accuracy of the K).
import * as fs from 'fs';
import * as path from 'path';
import { ArpoError, invalidArgument } from '../errors';
import type { FinishReason } from '../rollout/types';
import type { RunConfig } from './config';
import type { StepMetrics } from './metrics';
import { buildReward, buildTools, loadDataset, loadPolicy, rolloutDeps } from './setup';
import { validate } from './trainer';

export interface EvalResult {
  metrics: StepMetrics;
  /** Per example: question, ground truth, response, score, accuracy, format verdict, how it ended, tool calls. */
  rows: EvalRow[];
}

export interface EvalRow {
  /** The question's row in the evaluated dataset (0-based, after --limit). */
  index: number;
  /** Which of the question's samples (0 when greedy). */
  sample: number;
  question: string;
  groundTruth: string | readonly string[];
  /** The row's `extra_info.family` when it is a string (the demo's task families), else its `data_source`. */
  family: string;
  response: string;
  score: number;
  accuracy: number;
  /** The reward's format verdict (false: the reward's format penalty applied). */
  formatOk: boolean;
  /** How generation ended: an answer, EOS, the response-length limit (`length`: e.g. a repetition loop) or the tool-call limit. */
  finish: FinishReason;
  toolCalls: number;
}

/**
 * One family's held-out numbers: accuracy with its standard error over questions, mean reward,
 * the share of responses that failed the format check and of those cut off at the length limit,
 * and tool calls.
 */
export interface FamilyStats {
  /** Questions (rows with the same `index` are samples of one question). */
  n: number;
  accuracy: number;
  se: number;
  reward: number;
  badFormat: number;
  cutOff: number;
  toolCalls: number;
}

/**
 * Per-family statistics of evaluation rows, families in first-seen order, plus `all`.
 * Rows with the same `index` are samples of one question: accuracy is their mean
 * (pass@1), and its standard error is over questions, sqrt(var(a_q) / n) with a_q
 * a question's mean accuracy; with one 0/1 sample each, that is sqrt(p(1-p)/n).
 * Rows without `index` are a question each.
 */
export function familyStats(rows: readonly (Pick<EvalRow, 'family' | 'accuracy' | 'score' | 'formatOk' | 'finish' | 'toolCalls'> & { index?: number })[]): Record<string, FamilyStats> {
  type Row = (typeof rows)[number];
  const groups = new Map<string, Row[]>();
  for (const r of rows) groups.set(r.family, [...(groups.get(r.family) ?? []), r]);
  const stats = (rs: readonly Row[]): FamilyStats => {
    const mean = (f: (r: Row) => number): number => (rs.length === 0 ? NaN : rs.reduce((a, r) => a + f(r), 0) / rs.length);
    const perQuestion = new Map<number | Row, number[]>();
    for (const r of rs) {
      const key = r.index ?? r;
      perQuestion.set(key, [...(perQuestion.get(key) ?? []), r.accuracy]);
    }
    const a = [...perQuestion.values()].map((xs) => xs.reduce((x, y) => x + y, 0) / xs.length);
    const n = a.length;
    const accuracy = mean((r) => r.accuracy);
    const q = n === 0 ? NaN : a.reduce((x, y) => x + y, 0) / n;
    const variance = n === 0 ? NaN : Math.max(0, a.reduce((x, y) => x + y * y, 0) / n - q * q);
    return {
      n,
      accuracy,
      se: n === 0 ? NaN : Math.sqrt(variance / n),
      reward: mean((r) => r.score),
      badFormat: mean((r) => (r.formatOk ? 0 : 1)),
      cutOff: mean((r) => (r.finish === 'length' ? 1 : 0)),
      toolCalls: mean((r) => r.toolCalls),
    };
  };
  const out: Record<string, FamilyStats> = {};
  for (const [f, rs] of groups) out[f] = stats(rs);
  out.all = stats(rows);
  return out;
}

/**
 * Two evaluations of the same questions side by side, per family: the change in
 * accuracy and its standard error sqrt(se_a^2 + se_b^2); `worse` marks a family
 * whose accuracy fell by more than that error.
 */
export function compareFamilies(before: Record<string, FamilyStats>, after: Record<string, FamilyStats>): Record<string, { before: FamilyStats; after: FamilyStats; delta: number; se: number; worse: boolean }> {
  const out: Record<string, { before: FamilyStats; after: FamilyStats; delta: number; se: number; worse: boolean }> = {};
  for (const f of Object.keys(before)) {
    const a = before[f]!;
    const b = after[f];
    if (!b) continue;
    const delta = b.accuracy - a.accuracy;
    const se = Math.sqrt(a.se * a.se + b.se * b.se);
    out[f] = { before: a, after: b, delta, se, worse: delta < -se };
  }
  return out;
}

function familyOf(e: { extraInfo: Readonly<Record<string, unknown>>; dataSource: string } | undefined): string {
  if (!e) return '';
  const f = e.extraInfo.family;
  return typeof f === 'string' && f.length > 0 ? f : e.dataSource;
}

export interface EvalOptions {
  /** Evaluate at most this many rows (0 = every row). */
  limit?: number;
  /** Write the rows here (JSONL). */
  outFile?: string;
  workDir?: string;
  /** Samples per question (default 1); more than one needs a temperature > 0. */
  samples?: number;
  /** Sampling temperature (default 0: greedy). */
  temperature?: number;
}

/** The sampling of an evaluation, checked: samples an integer >= 1, temperature finite >= 0, and > 0 when samples > 1. */
export function evalSampling(options: Pick<EvalOptions, 'samples' | 'temperature'>): { samples: number; temperature: number } {
  const samples = options.samples ?? 1;
  const temperature = options.temperature ?? 0;
  if (typeof samples !== 'number' || !Number.isInteger(samples) || samples < 1 || samples > 1024) throw invalidArgument('an integer in [1, 1024]', 'eval samples', samples);
  if (typeof temperature !== 'number' || !Number.isFinite(temperature) || temperature < 0) throw invalidArgument('a finite number >= 0 (0 = greedy)', 'eval temperature', temperature);
  if (samples > 1 && temperature === 0) {
    throw new ArpoError('INVALID_ARGUMENT', `eval samples ${samples} with temperature 0: greedy samples are all the same; give a temperature > 0 (e.g. 1, the rollout's) or one sample`);
  }
  return { samples, temperature };
}

/** Evaluates `modelDir` on `dataFile` (limit 0 = every row); writes nothing unless `outFile` is given (JSONL of rows). */
export async function evaluate(modelDir: string, dataFile: string, cfg: RunConfig, options: EvalOptions = {}): Promise<EvalResult> {
  const sampling = evalSampling(options);
  if (!fs.existsSync(dataFile)) throw new ArpoError('BAD_CONFIG', `eval: data file ${dataFile} does not exist`);
  const { model, tokenizer } = await loadPolicy(modelDir, cfg);
  const tools = await buildTools(cfg, options.workDir ?? path.dirname(path.resolve(modelDir)));
  try {
    const reward = await buildReward(cfg);
    const data = await loadDataset(dataFile, cfg, options.limit ?? 0);
    const deps = rolloutDeps(model, tokenizer, tools.runner, modelDir);
    const { metrics, items } = await validate(tokenizer, deps, data.examples, reward, cfg, 0, sampling);
    const samplesSoFar = new Map<number, number>();
    const rows = items.map((i): EvalRow => {
      const sample = samplesSoFar.get(i.group) ?? 0;
      samplesSoFar.set(i.group, sample + 1);
      return {
        index: i.group,
        sample,
        question: data.examples[i.group]?.question ?? '',
        groundTruth: data.examples[i.group]?.groundTruth ?? '',
        family: familyOf(data.examples[i.group]),
        response: i.response,
        score: i.reward.score,
        accuracy: i.reward.accuracy,
        formatOk: i.reward.formatOk,
        finish: i.trajectory.finishReason,
        toolCalls: i.trajectory.toolTags.length,
      };
    });
    if (options.outFile) fs.writeFileSync(options.outFile, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    return { metrics, rows };
  } finally {
    await tools.close();
    model.dispose();
  }
}
