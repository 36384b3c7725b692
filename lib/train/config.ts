// The run configuration of `arpo train` / `arpo sft` / `arpo demo`: every
// option declared once (path, schema, default, doc) in OPTIONS, from which the
// zod schema, the defaults, `--set key=value` parsing and `--help` are derived.
// Validated once at load and frozen; errors name the option path and value.
import * as fs from 'fs';
import * as path from 'path';
import { z } from 'zod';
import YAML from 'yaml';
import { ArpoError, describeValue } from '../errors';
import { DEVICE_PATTERN } from '../native/validate';

interface OptionSpec {
  schema: z.ZodType;
  default: unknown;
  doc: string;
}

function opt<S extends z.ZodType>(schema: S, def: z.infer<S>, doc: string): { schema: S; default: z.infer<S>; doc: string } {
  return { schema, default: def, doc };
}

const int = (min: number) => z.number().int().min(min);
const num = () => z.number().finite();
const prob = () => z.number().min(0).max(1);

/** Every option, by dotted path. Defaults follow the ARPO reference scripts where they exist (ARPO.md). */
export const OPTIONS = {
  // ---------------------------------------------------------------- model
  'model.path': opt(z.string().min(1).nullable(), null, 'Hugging Face model directory (config.json + safetensors) to start from'),
  'model.dtype': opt(z.enum(['float32', 'bfloat16', 'float64']), 'float32', 'Compute dtype (float64: for exactness checks)'),
  'model.device': opt(z.string().regex(DEVICE_PATTERN, 'expected cpu, cuda or cuda:N'), 'cpu', 'Where the policy, its KV cache and optimiser state live: cpu, cuda or cuda:N (CUDA needs arpo built against a PyTorch with CUDA; with --nproc, cuda means each rank\'s own GPU)'),
  'model.threads': opt(int(0), 0, 'Intra-op CPU threads (0 = all cores)'),
  'model.tokenizer': opt(z.string().min(1).nullable(), null, 'Tokenizer directory (default: the model directory)'),
  // ---------------------------------------------------------------- data
  'data.train': opt(z.string().min(1).nullable(), null, 'Training prompts: reference parquet or JSONL with the same fields'),
  'data.valid': opt(z.string().min(1).nullable(), null, 'Validation prompts (parquet or JSONL)'),
  'data.validLimit': opt(int(0), 0, 'Use at most this many validation rows (0 = all)'),
  'data.systemPrompt': opt(z.string().nullable(), null, 'System prompt replacing the rows\' system message in RL prompts and SFT conversations ("" drops it; null keeps the rows\')'),
  'data.onBadRow': opt(z.enum(['skip', 'fail']), 'fail', 'What to do with a malformed dataset row'),
  'data.shuffle': opt(z.boolean(), true, 'Shuffle training prompts each epoch (seeded)'),
  // ---------------------------------------------------------------- rollout
  'rollout.mode': opt(z.enum(['arpo', 'trajectory']), 'arpo', 'ARPO entropy-driven tree rollout, or M independent trajectories (GRPO/DAPO/REINFORCE++ sampling)'),
  'rollout.budget': opt(int(1), 16, 'M: trajectories (leaves) per prompt'),
  'rollout.initialSamples': opt(int(1), 8, 'N: global samples started per prompt before branching (ARPO)'),
  'rollout.entropyWindow': opt(int(1), 20, 'k: tokens after a tool result whose mean normalised entropy gives H_t'),
  'rollout.branchProbability': opt(prob(), 0.5, 'alpha: base branch probability'),
  'rollout.entropyWeight': opt(num(), 0.2, 'beta: weight of the entropy change in P_t = alpha + beta * dH'),
  'rollout.branchThreshold': opt(prob(), 0.5, 'tau: branch when P_t > tau (branch rule "threshold")'),
  'rollout.branchesPerDecision': opt(int(1), 1, 'Z: extra paths forked per firing branch decision'),
  'rollout.branchRule': opt(z.enum(['bernoulli', 'threshold']), 'bernoulli', 'bernoulli: branch with probability P_t (reference code); threshold: P_t > tau (paper)'),
  'rollout.entropyEstimate': opt(z.enum(['exact', 'top-k']), 'exact', 'Exact full-vocabulary entropy, or the reference top-k approximation'),
  'rollout.entropyTopK': opt(int(1), 10, 'k of the top-k entropy approximation (reference: 10)'),
  'rollout.toolCallLimit': opt(int(0), 5, 'Per-trajectory tool-call limit (over it the path ends)'),
  'rollout.maxBatchPaths': opt(int(1), 256, 'Most paths decoded in one engine call (continuous batching width)'),
  'rollout.speculativeRefills': opt(z.boolean(), false, 'Decode the refills a prompt may need (M - N fresh samples) from the start, each up to its first tool call (not run), and keep the ones the prompt ends up needing: the same trees and tool calls as starting them once every path has finished, without the second wave (fewer, wider engine calls; pays where a call costs per call, e.g. a GPU)'),
  'rollout.trace': opt(z.boolean(), false, 'Write every engine call and tool call of each training step with its time to <train.outDir>/rollout-trace.jsonl'),
  'rollout.maxResponseTokens': opt(int(1), 4096, 'Maximum generated + tool tokens per trajectory'),
  'rollout.temperature': opt(z.number().min(0).finite(), 1.0, 'Sampling temperature'),
  'rollout.topP': opt(z.number().gt(0).max(1), 1.0, 'Nucleus sampling mass'),
  'rollout.topK': opt(int(0), 0, 'Top-k sampling (0 = off)'),
  // ---------------------------------------------------------------- tools
  'tools.search.corpus': opt(z.string().min(1).nullable(), null, 'JSONL corpus {id, title, text} for the search tool'),
  'tools.search.cache': opt(z.string().min(1).nullable(), null, 'Reference search cache (search_cache.json): exact hits, else BM25 over its pages'),
  'tools.search.topK': opt(int(1), 5, 'Search results per query'),
  'tools.search.snippetChars': opt(int(16), 300, 'Characters per search result snippet'),
  'tools.python.enabled': opt(z.boolean(), true, 'Mount the sandboxed python interpreter'),
  'tools.python.timeoutMs': opt(int(100), 10000, 'Wall timeout per python call'),
  'tools.python.warm': opt(int(0), 4, 'Python sandboxes started ahead of their calls (each a fresh, isolated process that runs one call; 0: start one per call). Cuts a call from ~60-140 ms to ~10 ms'),
  'tools.python.isolation': opt(z.enum(['full', 'basic']), 'full', 'full: network, mount and pid namespaces, rlimits and (as root) a sandbox uid, or refuse to start saying what is missing; basic: explicitly accept the fallback (socket guard, temp dir, process group, rlimits), recorded in run.json and the log'),
  'tools.concurrency': opt(int(1), 4, 'Calls of one tool running at once (each tool has its own limit and queue: a search never waits behind python calls)'),
  'tools.maxOutputChars': opt(int(64), 4000, 'Truncate tool output to this many characters'),
  'tools.replayCache': opt(z.string().min(1).nullable(), null, 'Record/replay tool calls in this cache file'),
  // ---------------------------------------------------------------- reward
  'reward.name': opt(z.string().min(1), 'arpo-deep-research', 'Reward function (registry name)'),
  'reward.module': opt(z.string().min(1).nullable(), null, 'TypeScript/JavaScript module registering extra rewards'),
  'reward.multiToolBonus': opt(num(), 0.1, 'r_M: bonus for a right answer that used both search and python (arpo-deep-research, hierarchical)'),
  'reward.badFormatScore': opt(num(), -1, 'Score of a response that fails the format check (arpo-deep-research, hierarchical; the reference: -1)'),
  // ---------------------------------------------------------------- algorithm
  'algorithm.name': opt(z.enum(['arpo', 'grpo', 'dapo', 'reinforce++']), 'arpo', 'Algorithm preset: sets estimator, rollout mode and loss defaults'),
  'algorithm.estimator': opt(z.enum(['grpo', 'dr-grpo', 'rloo', 'reinforce++']), 'grpo', 'Advantage estimator'),
  'algorithm.attribution': opt(z.enum(['soft', 'hard']), 'soft', 'ARPO advantage attribution over the rollout tree'),
  'algorithm.dynamicSampling': opt(z.boolean(), false, 'Drop prompts whose rewards all agree (DAPO)'),
  // ---------------------------------------------------------------- loss
  'loss.clipLow': opt(z.number().min(0).max(1), 0.2, 'epsilon_low of the clipped ratio'),
  'loss.clipHigh': opt(z.number().min(0), 0.2, 'epsilon_high of the clipped ratio (DAPO clip-higher: 0.28)'),
  'loss.dualClipC': opt(num(), 3.0, 'Dual-clip bound c for negative advantages (<= 1 disables)'),
  'loss.klType': opt(z.enum(['k1', 'k2', 'k3', 'low_var_kl', 'abs']), 'low_var_kl', 'KL estimator to the reference policy'),
  'loss.klCoef': opt(z.number().min(0), 0, 'KL coefficient (reference scripts: 0)'),
  'loss.entropyCoef': opt(z.number().min(0), 0, 'Entropy bonus coefficient'),
  'loss.aggregation': opt(z.enum(['token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum', 'seq-mean-token-sum-norm']), 'token-mean', 'Loss aggregation over tokens'),
  // ---------------------------------------------------------------- optimiser
  'optim.lr': opt(z.number().gt(0), 1e-6, 'AdamW learning rate'),
  'optim.weightDecay': opt(z.number().min(0), 0.01, 'AdamW decoupled weight decay'),
  'optim.beta1': opt(prob(), 0.9, 'AdamW beta1'),
  'optim.beta2': opt(prob(), 0.999, 'AdamW beta2'),
  'optim.eps': opt(z.number().gt(0), 1e-8, 'AdamW epsilon'),
  'optim.schedule': opt(z.enum(['constant', 'linear', 'cosine']), 'constant', 'Learning-rate schedule after warmup'),
  'optim.warmupSteps': opt(int(0), 0, 'Linear warmup steps'),
  'optim.maxGradNorm': opt(z.number().gt(0), 1.0, 'Gradient clipping max norm'),
  // ---------------------------------------------------------------- sft (cold start)
  'sft.data': opt(z.string().min(1).nullable(), null, 'SFT conversations (JSONL {messages}; tool results in <result> blocks or segments are masked)'),
  'sft.epochs': opt(int(1), 3, 'Passes over the SFT data'),
  'sft.batchSequences': opt(int(1), 16, 'Conversations per SFT optimiser step'),
  'sft.lr': opt(z.number().gt(0), 1e-5, 'SFT learning rate (the optim.* settings apply otherwise)'),
  'sft.checkpointEvery': opt(int(0), 50, 'SFT steps between checkpoints in <train.outDir>/sft-checkpoints (0: only the last); `arpo sft --resume` continues from the newest'),
  'sft.skipUngrounded': opt(z.boolean(), false, 'Drop SFT rows marked "grounded": false'),
  // ---------------------------------------------------------------- train
  'train.steps': opt(int(1), 100, 'Optimiser steps (each on one batch of prompts)'),
  'train.batchPrompts': opt(int(1), 128, 'Prompts per step'),
  'train.miniBatchPrompts': opt(int(1), 16, 'Prompts per PPO mini-batch'),
  'train.ppoEpochs': opt(int(1), 2, 'PPO epochs over each batch'),
  'train.microBatchTokens': opt(int(16), 8192, 'Tokens per forward/backward micro-batch (gradient accumulation)'),
  'train.packing': opt(z.enum(['tree', 'flat']), 'tree', 'Train on packed rollout trees (every shared token computed once) or on the flattened trajectories (the reference path)'),
  'train.deterministic': opt(z.boolean(), false, 'Batch-invariant decoding: the same seed gives the same numbers whatever the tool latencies (each path\'s logits independent of the paths sharing its engine calls)'),
  'train.oldLogprobs': opt(z.enum(['rollout', 'recompute']), 'recompute', 'Old log-probs from the rollout sampler, or recomputed before the update'),
  'train.validateEvery': opt(int(0), 10, 'Validate (greedy, n = 1) every this many steps (0 = never)'),
  'train.checkpointEvery': opt(int(0), 10, 'Checkpoint every this many steps (0 = only at the end)'),
  'train.seed': opt(int(0), 1, 'Seed of data order, sampling and branch decisions'),
  'train.reportTrees': opt(int(0), 3, 'Rollout trees of each step kept for the report\'s tree view (the widest reward spread first; <train.outDir>/rollout-trees.json, rewritten every step; 0: none)'),
  'train.outDir': opt(z.string().min(1), 'runs/arpo', 'Run directory: metrics.jsonl, checkpoints, report.html'),
  'train.distTimeoutS': opt(z.number().gt(0), 300, 'Data parallel (several ranks): a rank that dies or hangs makes the others stop with an error naming it after this many seconds'),
} as const satisfies Record<string, OptionSpec>;

export type OptionPath = keyof typeof OPTIONS;

type Infer<P extends OptionPath> = z.infer<(typeof OPTIONS)[P]['schema']>;
type Nest<K extends string, V> = K extends `${infer H}.${infer R}` ? { [k in H]: Nest<R, V> } : { [k in K]: V };
type UnionToIntersection<U> = (U extends unknown ? (x: U) => void : never) extends (x: infer I) => void ? I : never;
type DeepFlatten<T> = T extends object ? { [K in keyof T]: DeepFlatten<T[K]> } : T;
/** The validated, frozen configuration object (nested by option path). */
export type RunConfig = DeepFlatten<UnionToIntersection<{ [P in OptionPath]: Nest<P, Infer<P>> }[OptionPath]>>;

function setPath(target: Record<string, unknown>, dotted: string, value: unknown): void {
  const parts = dotted.split('.');
  let obj = target;
  for (let i = 0; i < parts.length - 1; i++) {
    const k = parts[i]!;
    const next = obj[k];
    if (next === undefined || next === null || typeof next !== 'object' || Array.isArray(next)) obj[k] = {};
    obj = obj[k] as Record<string, unknown>;
  }
  obj[parts[parts.length - 1]!] = value;
}

function getPath(source: unknown, dotted: string): { found: boolean; value: unknown } {
  let cur: unknown = source;
  for (const k of dotted.split('.')) {
    if (cur === null || typeof cur !== 'object' || !(k in (cur as object))) return { found: false, value: undefined };
    cur = (cur as Record<string, unknown>)[k];
  }
  return { found: true, value: cur };
}

/** Dotted paths of every leaf in a plain object (arrays and non-objects are leaves). */
function leafPaths(obj: unknown, prefix = ''): string[] {
  if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) return prefix ? [prefix] : [];
  const out: string[] = [];
  for (const [k, v] of Object.entries(obj as Record<string, unknown>)) out.push(...leafPaths(v, prefix ? `${prefix}.${k}` : k));
  return out;
}

function deepFreeze<T>(o: T): T {
  if (o && typeof o === 'object') {
    for (const v of Object.values(o as object)) deepFreeze(v);
    Object.freeze(o);
  }
  return o;
}

/**
 * Algorithm presets: defaults that `algorithm.name` sets for options the
 * config leaves unset (explicit values always win).
 */
export const ALGORITHM_PRESETS: Record<string, Partial<Record<OptionPath, unknown>>> = {
  arpo: { 'rollout.mode': 'arpo', 'algorithm.estimator': 'grpo' },
  grpo: { 'rollout.mode': 'trajectory', 'algorithm.estimator': 'grpo' },
  // DAPO-style: clip-higher, token-mean aggregation, dynamic sampling of zero-variance groups.
  dapo: { 'rollout.mode': 'trajectory', 'algorithm.estimator': 'grpo', 'loss.clipHigh': 0.28, 'loss.aggregation': 'token-mean', 'algorithm.dynamicSampling': true },
  'reinforce++': { 'rollout.mode': 'trajectory', 'algorithm.estimator': 'reinforce++' },
};

/** The defaults as a RunConfig. */
export function defaultConfig(): RunConfig {
  return validateConfig({});
}

/**
 * Validates a partial nested config against OPTIONS: unknown keys and bad
 * values throw ArpoError('BAD_CONFIG') naming the option path and value.
 */
export function validateConfig(input: unknown, source = 'config'): RunConfig {
  if (input === null || typeof input !== 'object' || Array.isArray(input)) {
    throw new ArpoError('BAD_CONFIG', `${source}: expected an object of options but received ${describeValue(input)}`);
  }
  for (const p of leafPaths(input)) {
    if (!(p in OPTIONS)) {
      const near = Object.keys(OPTIONS).filter((k) => k.split('.').pop() === p.split('.').pop());
      throw new ArpoError('BAD_CONFIG', `${source}: unknown option ${p}${near.length ? ` (did you mean ${near.join(' or ')}?)` : ''}`);
    }
  }
  const out: Record<string, unknown> = {};
  const algo = getPath(input, 'algorithm.name');
  const preset = ALGORITHM_PRESETS[typeof algo.value === 'string' ? algo.value : 'arpo'] ?? {};
  for (const [p, spec] of Object.entries(OPTIONS) as [string, OptionSpec][]) {
    const { found, value } = getPath(input, p);
    const v = found && value !== undefined ? value : p in preset ? preset[p as OptionPath] : spec.default;
    const r = spec.schema.safeParse(v);
    if (!r.success) {
      const issue = r.error.issues[0];
      throw new ArpoError('BAD_CONFIG', `${source}: invalid ${p}: ${issue ? issue.message : 'invalid value'} (received ${describeValue(v)})`);
    }
    setPath(out, p, r.data);
  }
  const cfg = out as unknown as RunConfig;
  checkRelations(cfg, source);
  return deepFreeze(cfg);
}

function checkRelations(cfg: RunConfig, source: string): void {
  if (cfg.rollout.initialSamples > cfg.rollout.budget) {
    throw new ArpoError('BAD_CONFIG', `${source}: invalid rollout.initialSamples: ${cfg.rollout.initialSamples} exceeds rollout.budget ${cfg.rollout.budget}`);
  }
  if (cfg.train.miniBatchPrompts > cfg.train.batchPrompts) {
    throw new ArpoError('BAD_CONFIG', `${source}: invalid train.miniBatchPrompts: ${cfg.train.miniBatchPrompts} exceeds train.batchPrompts ${cfg.train.batchPrompts}`);
  }
}

/** Parses the text of a `--set key=value` value by the option's schema (numbers, booleans, null, JSON). */
export function parseOverride(assignment: string): { path: string; value: unknown } {
  const eq = assignment.indexOf('=');
  if (eq <= 0) throw new ArpoError('BAD_CONFIG', `--set expects key=value but received ${JSON.stringify(assignment)}`);
  const p = assignment.slice(0, eq).trim();
  const raw = assignment.slice(eq + 1).trim();
  if (!(p in OPTIONS)) throw new ArpoError('BAD_CONFIG', `--set: unknown option ${p}`);
  const spec = (OPTIONS as Record<string, OptionSpec>)[p]!;
  let value: unknown = raw;
  if (raw === 'null') value = null;
  else if (raw === 'true' || raw === 'false') value = raw === 'true';
  else if (raw !== '' && !Number.isNaN(Number(raw)) && !spec.schema.safeParse(raw).success) value = Number(raw);
  else if (/^[[{"]/.test(raw)) {
    try {
      value = JSON.parse(raw);
    } catch {
      value = raw;
    }
  }
  return { path: p, value };
}

/** Reads a JSON or YAML config file, applies `--set` overrides, validates. */
export function loadConfig(file: string | null, overrides: readonly string[] = [], base: object = {}): RunConfig {
  let input: Record<string, unknown> = JSON.parse(JSON.stringify(base)) as Record<string, unknown>;
  let source = 'config';
  if (file) {
    source = path.basename(file);
    let text: string;
    try {
      text = fs.readFileSync(file, 'utf8');
    } catch (e) {
      throw new ArpoError('BAD_CONFIG', `cannot read config file ${file}: ${(e as Error).message}`);
    }
    let parsed: unknown;
    try {
      parsed = /\.ya?ml$/i.test(file) ? YAML.parse(text) : JSON.parse(text);
    } catch (e) {
      throw new ArpoError('BAD_CONFIG', `${source}: not valid ${/\.ya?ml$/i.test(file) ? 'YAML' : 'JSON'}: ${(e as Error).message}`);
    }
    if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
      throw new ArpoError('BAD_CONFIG', `${source}: expected an object of options but received ${describeValue(parsed)}`);
    }
    for (const p of leafPaths(parsed)) {
      const { value } = getPath(parsed, p);
      setPath(input, p, value);
    }
  }
  for (const o of overrides) {
    const { path: p, value } = parseOverride(o);
    setPath(input, p, value);
  }
  input = input ?? {};
  return validateConfig(input, source);
}

/** One line per option with its default and doc, for `--help`. */
export function describeOptions(): string {
  const rows = Object.entries(OPTIONS as Record<string, OptionSpec>).map(([p, s]) => [p, JSON.stringify(s.default), s.doc] as const);
  const w0 = Math.max(...rows.map((r) => r[0].length));
  const w1 = Math.min(24, Math.max(...rows.map((r) => r[1].length)));
  return rows.map(([p, d, doc]) => `  ${p.padEnd(w0)}  ${d.padEnd(w1)}  ${doc}`).join('\n');
}
