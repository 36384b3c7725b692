// `arpo eval`: greedy (n = 1) evaluation of a model directory on a dataset
// with the run's tools and reward: accuracy, reward, format and tool use.
import * as fs from 'fs';
import * as path from 'path';
import { ArpoError } from '../errors';
import type { RunConfig } from './config';
import type { StepMetrics } from './metrics';
import { buildReward, buildTools, loadDataset, loadPolicy, rolloutDeps } from './setup';
import { validate } from './trainer';

export interface EvalResult {
  metrics: StepMetrics;
  /** Per example: question, ground truth, response, score, accuracy, tool calls. */
  rows: { question: string; groundTruth: string | readonly string[]; response: string; score: number; accuracy: number; toolCalls: number }[];
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
      response: i.response,
      score: i.reward.score,
      accuracy: i.reward.accuracy,
      toolCalls: i.trajectory.toolTags.length,
    }));
    if (options.outFile) fs.writeFileSync(options.outFile, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    return { metrics, rows };
  } finally {
    await tools.close();
    model.dispose();
  }
}
