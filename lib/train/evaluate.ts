// `arpo eval`: greedy (n = 1) evaluation of a model directory on a dataset
// with the run's tools and reward: accuracy, reward, format and tool use.
import * as fs from 'fs';
import * as path from 'path';
import { ArpoError } from '../errors';
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
 * One family's held-out numbers: accuracy with its standard error sqrt(p(1-p)/n), mean reward,
 * the share of responses that failed the format check and of those cut off at the length limit,
 * and tool calls.
 */
export interface FamilyStats {
  n: number;
  accuracy: number;
  se: number;
  reward: number;
  badFormat: number;
  cutOff: number;
  toolCalls: number;
}

/** Per-family statistics of evaluation rows, families in first-seen order, plus `all`. */
export function familyStats(rows: readonly Pick<EvalRow, 'family' | 'accuracy' | 'score' | 'formatOk' | 'finish' | 'toolCalls'>[]): Record<string, FamilyStats> {
  const groups = new Map<string, (typeof rows)[number][]>();
  for (const r of rows) groups.set(r.family, [...(groups.get(r.family) ?? []), r]);
  const stats = (rs: readonly (typeof rows)[number][]): FamilyStats => {
    const n = rs.length;
    const mean = (f: (r: (typeof rows)[number]) => number): number => (n === 0 ? NaN : rs.reduce((a, r) => a + f(r), 0) / n);
    const accuracy = mean((r) => r.accuracy);
    return {
      n,
      accuracy,
      se: n === 0 ? NaN : Math.sqrt(Math.max(0, accuracy * (1 - accuracy)) / n),
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

/** Evaluates `modelDir` on `dataFile` (limit 0 = every row); writes nothing unless `outFile` is given (JSONL of rows). */
export async function evaluate(modelDir: string, dataFile: string, cfg: RunConfig, options: { limit?: number; outFile?: string; workDir?: string } = {}): Promise<EvalResult> {
  if (!fs.existsSync(dataFile)) throw new ArpoError('BAD_CONFIG', `eval: data file ${dataFile} does not exist`);
  const { model, tokenizer } = await loadPolicy(modelDir, cfg);
  const tools = await buildTools(cfg, options.workDir ?? path.dirname(path.resolve(modelDir)));
  try {
    const reward = await buildReward(cfg);
    const data = await loadDataset(dataFile, cfg, options.limit ?? 0);
    const deps = rolloutDeps(model, tokenizer, tools.runner, modelDir);
    const { metrics, items } = await validate(tokenizer, deps, data.examples, reward, cfg, 0);
    const rows = items.map((i) => ({
      question: data.examples[i.group]?.question ?? '',
      groundTruth: data.examples[i.group]?.groundTruth ?? '',
      family: familyOf(data.examples[i.group]),
      response: i.response,
      score: i.reward.score,
      accuracy: i.reward.accuracy,
      formatOk: i.reward.formatOk,
      finish: i.trajectory.finishReason,
      toolCalls: i.trajectory.toolTags.length,
    }));
    if (options.outFile) fs.writeFileSync(options.outFile, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    return { metrics, rows };
  } finally {
    await tools.close();
    model.dispose();
  }
}
