// Builds a run's components from its configuration: the policy model and
// tokenizer, the datasets and their prompts, the tools behind a runner, the
// reward. Everything is created here once; the trainer only wires them.
import * as fs from 'fs';
import * as path from 'path';
import { ArpoError } from '../errors';
import { buildPrompt, PromptDataset, type DatasetExample } from '../data';
import { PolicyModel, type OptimizerSettings } from '../model/policy-model';
import { Tokenizer } from '../model/tokenizer';
import { getReward, loadRewardModule, type RewardFn, type RewardResult } from '../reward';
import { DEFAULT_PROTOCOL, PythonTool, SearchIndex, SearchTool, ToolCallCache, ToolRunner, type Isolation } from '../tools';
import { runnerExecutor, tokenizerText, type RolloutDeps, type RolloutSettings } from '../rollout';
import type { RunConfig } from './config';

/** Tokens that end a trajectory: the tokenizer's EOS plus the chat end-of-turn tokens it knows. */
export function eosTokenIds(tokenizer: Tokenizer, modelDir?: string | null): number[] {
  const ids = new Set<number>();
  if (tokenizer.eosTokenId !== null) ids.add(tokenizer.eosTokenId);
  for (const t of ['<|im_end|>', '<|endoftext|>', '<|eot_id|>', '<|end_of_text|>']) {
    const id = tokenizer.tokenId(t);
    if (id !== undefined) ids.add(id);
  }
  if (modelDir) {
    const gen = path.join(modelDir, 'generation_config.json');
    if (fs.existsSync(gen)) {
      try {
        const eos = (JSON.parse(fs.readFileSync(gen, 'utf8')) as { eos_token_id?: number | number[] }).eos_token_id;
        for (const id of Array.isArray(eos) ? eos : eos === undefined ? [] : [eos]) if (Number.isInteger(id)) ids.add(id);
      } catch {
        /* a malformed generation_config.json only loses these extra ids */
      }
    }
  }
  return [...ids].sort((a, b) => a - b);
}

/** Prompt token ids of an example: the row's messages (or question + system prompt) through the chat template. */
export function promptIds(example: DatasetExample, tokenizer: Tokenizer, systemPrompt: string | null): Int32Array {
  const out = buildPrompt(example, (messages) => tokenizer.applyChatTemplate(messages.map((m) => ({ role: m.role, content: m.content })), { addGenerationPrompt: true }).ids, systemPrompt === null ? {} : { systemPrompt });
  return out instanceof Int32Array ? out : tokenizer.encode(out, { addSpecialTokens: false });
}

/** AdamW and schedule settings from the run config (SFT passes its own lr). */
export function optimizerSettings(cfg: RunConfig, lr: number, totalSteps: number): Partial<OptimizerSettings> {
  const o = cfg.optim;
  return { lr, beta1: o.beta1, beta2: o.beta2, eps: o.eps, weightDecay: o.weightDecay, maxGradNorm: o.maxGradNorm, warmupSteps: o.warmupSteps, totalSteps, schedule: o.schedule };
}

/** Rollout settings from the run config (same names, minus the ones the trainer owns). */
export function rolloutSettings(cfg: RunConfig, overrides: Partial<RolloutSettings> = {}): Partial<RolloutSettings> {
  const r = cfg.rollout;
  return {
    mode: r.mode,
    budget: r.budget,
    initialSamples: r.mode === 'trajectory' ? r.budget : r.initialSamples,
    entropyWindow: r.entropyWindow,
    branchProbability: r.branchProbability,
    entropyWeight: r.entropyWeight,
    branchThreshold: r.branchThreshold,
    branchesPerDecision: r.branchesPerDecision,
    branchRule: r.branchRule,
    toolCallLimit: r.toolCallLimit,
    maxResponseTokens: r.maxResponseTokens,
    temperature: r.temperature,
    topP: r.topP,
    topK: r.topK,
    entropyEstimate: r.entropyEstimate,
    entropyTopK: r.entropyTopK,
    maxBatchPaths: r.maxBatchPaths,
    speculativeRefills: r.speculativeRefills,
    trace: r.trace,
    ...overrides,
  };
}

export interface Tools {
  runner: ToolRunner;
  /** The python sandbox's isolation, when python is mounted. */
  python: Isolation | null;
  close(): Promise<void>;
}

/** The tool runner of a run: search (corpus and/or reference cache), sandboxed python, replay cache. */
export async function buildTools(cfg: RunConfig, runDir: string): Promise<Tools> {
  const t = cfg.tools;
  if (t.search.corpus && t.search.cache) {
    throw new ArpoError('BAD_CONFIG', 'config: set one of tools.search.corpus and tools.search.cache, not both');
  }
  let cache: ToolCallCache | undefined;
  let runner: ToolRunner | undefined;
  const indexes: SearchIndex[] = [];
  const close = async (): Promise<void> => {
    await runner?.close();
    for (const i of indexes) i.close();
    cache?.close();
  };
  try {
    if (t.replayCache) cache = ToolCallCache.open(t.replayCache);
    runner = new ToolRunner({ concurrency: t.concurrency, maxOutputChars: t.maxOutputChars, cache, timeoutMs: Math.max(t.python.timeoutMs + 5000, 30000) });
    const indexDir = path.join(runDir, 'index');
    fs.mkdirSync(indexDir, { recursive: true });
    if (t.search.corpus) {
      const index = await SearchIndex.openJsonl(t.search.corpus, { indexPath: path.join(indexDir, 'corpus.sqlite') });
      indexes.push(index);
      runner.register(new SearchTool(index, { topK: t.search.topK, snippetChars: t.search.snippetChars }));
    } else if (t.search.cache) {
      const index = await SearchIndex.openSearchCache(t.search.cache, { indexPath: path.join(indexDir, 'search-cache.sqlite') });
      indexes.push(index);
      runner.register(new SearchTool(index, { topK: t.search.topK, snippetChars: t.search.snippetChars }));
    }
    let python: Isolation | null = null;
    if (t.python.enabled) {
      const tool = new PythonTool({ timeoutMs: t.python.timeoutMs, isolation: t.python.isolation, warm: t.python.warm });
      runner.register(tool);
      python = tool.sandbox.isolation;
    }
    return { runner, python, close };
  } catch (e) {
    // A sandbox that refuses to start, a bad corpus: close what was opened before it.
    await close();
    throw e;
  }
}

/** The reward of a run: a registered name, after loading the user's module if one is given. */
export async function buildReward(cfg: RunConfig): Promise<RewardFn> {
  if (cfg.reward.module) await loadRewardModule(path.resolve(cfg.reward.module));
  return getReward(cfg.reward.name, { multiToolBonus: cfg.reward.multiToolBonus, badFormatScore: cfg.reward.badFormatScore });
}

/** A reward's output as a RewardResult (plain numbers count as score and accuracy). */
export async function scoreResponse(reward: RewardFn, example: DatasetExample, response: string): Promise<RewardResult> {
  const r = await reward({ response, groundTruth: example.groundTruth, dataSource: example.dataSource, ability: example.ability, extraInfo: example.extraInfo });
  if (typeof r === 'number') return { score: r, formatOk: r >= 0, accuracy: Math.max(0, r), answer: '', reason: '' };
  return r;
}

/** Loads a dataset file with the run's bad-row policy. */
export async function loadDataset(file: string, cfg: RunConfig, limit = 0): Promise<PromptDataset> {
  return PromptDataset.load(file, { onMalformed: cfg.data.onBadRow, ...(limit > 0 ? { limit } : {}) });
}

/** The policy model of a run (an HF directory), with its tokenizer. */
export async function loadPolicy(dir: string, cfg: RunConfig): Promise<{ model: PolicyModel; tokenizer: Tokenizer }> {
  if (!fs.existsSync(path.join(dir, 'config.json'))) throw new ArpoError('BAD_CONFIG', `model.path: ${dir} has no config.json`);
  const model = await PolicyModel.load(dir, {
    dtype: cfg.model.dtype,
    device: cfg.model.device,
    threads: cfg.model.threads,
    batchInvariant: cfg.train.deterministic,
  });
  const tokenizer = Tokenizer.fromDir(cfg.model.tokenizer ?? dir);
  return { model, tokenizer };
}

export const PROTOCOL = DEFAULT_PROTOCOL;

/** What a rollout needs: the model as engine, the tokenizer as text, the tools, the protocol and EOS ids. */
export function rolloutDeps(model: PolicyModel, tokenizer: Tokenizer, runner: ToolRunner, modelDir: string | null): RolloutDeps {
  return { engine: model, text: tokenizerText(tokenizer), executeTool: runnerExecutor(runner), protocol: PROTOCOL, eosTokenIds: eosTokenIds(tokenizer, modelDir) };
}
