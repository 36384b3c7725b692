// Supervised cold start (`arpo sft`): token cross-entropy on conversations with
// tool calls, masking tool results exactly as RL does. A row is JSONL
// `{messages: [...]}`; its last assistant message is the target, either with
// `segments` ([{type: 'text' | 'tool_result', text}]) or as flat text whose
// ` <result>\n...\n</result>` blocks are the tool results. Segments are
// tokenised one by one and concatenated, as a rollout builds the sequence.
import * as fs from 'fs';
import * as path from 'path';
import { epochPermutation } from '../data';
import { ArpoError, describeValue } from '../errors';
import type { PolicyModel, TrainSequence } from '../model/policy-model';
import type { Tokenizer } from '../model/tokenizer';
import { microBatches } from './batch';
import type { RunConfig } from './config';
import { MetricsLog, Progress, type StepMetrics } from './metrics';
import { openRunCheckpoints } from './checkpoint';
import { eosTokenIds, loadPolicy, optimizerSettings } from './setup';
import { configHash } from './trainer';
import { Dist } from './dist';
import { modelDevice, modelThreads, readLaunchEnv, type LaunchEnv } from './launch';

export interface SftSegment {
  type: 'text' | 'tool_result';
  text: string;
}

const RESULT_BLOCK = / ?<result>\n[\s\S]*?\n<\/result>/g;

/** Splits flat assistant text into generated text and tool-result blocks. */
export function splitToolResults(content: string): SftSegment[] {
  const out: SftSegment[] = [];
  let last = 0;
  for (const m of content.matchAll(RESULT_BLOCK)) {
    if (m.index! > last) out.push({ type: 'text', text: content.slice(last, m.index) });
    out.push({ type: 'tool_result', text: m[0] });
    last = m.index! + m[0].length;
  }
  if (last < content.length) out.push({ type: 'text', text: content.slice(last) });
  return out;
}

/** Tokens and loss mask of one conversation: prompt (mask 0), text segments (1), tool results (0), EOS (1). */
export function encodeConversation(row: unknown, tokenizer: Tokenizer, eos: number, where: string, systemPrompt: string | null = null): TrainSequence {
  const r = row as { messages?: unknown };
  if (r === null || typeof r !== 'object' || !Array.isArray(r.messages) || r.messages.length < 2) {
    throw new ArpoError('BAD_DATA', `${where}: expected {messages: [...]} with at least two messages but received ${describeValue(row)}`);
  }
  let messages = r.messages as { role?: unknown; content?: unknown; segments?: unknown }[];
  messages.forEach((m, i) => {
    if (m === null || typeof m !== 'object' || typeof m.role !== 'string' || typeof m.content !== 'string') {
      throw new ArpoError('BAD_DATA', `${where}: messages[${i}] must be {role: string, content: string} but received ${describeValue(m)}`);
    }
  });
  // data.systemPrompt, when set, replaces the rows' system message ('' drops it), as for RL prompts.
  if (systemPrompt !== null) {
    messages = [...(systemPrompt ? [{ role: 'system', content: systemPrompt }] : []), ...messages.filter((m) => m.role !== 'system')];
  }
  const lastIdx = messages.length - 1;
  const target = messages[lastIdx]!;
  if (target.role !== 'assistant') throw new ArpoError('BAD_DATA', `${where}: the last message must be the assistant's, not ${JSON.stringify(target.role)}`);
  let segments: SftSegment[];
  if (target.segments !== undefined) {
    if (!Array.isArray(target.segments)) throw new ArpoError('BAD_DATA', `${where}: messages[${lastIdx}].segments must be an array`);
    segments = (target.segments as unknown[]).map((s, i) => {
      const seg = s as SftSegment;
      if (seg === null || typeof seg !== 'object' || (seg.type !== 'text' && seg.type !== 'tool_result') || typeof seg.text !== 'string') {
        throw new ArpoError('BAD_DATA', `${where}: messages[${lastIdx}].segments[${i}] must be {type: 'text' | 'tool_result', text} but received ${describeValue(s)}`);
      }
      return seg;
    });
  } else {
    segments = splitToolResults(target.content as string);
  }
  const prompt = tokenizer.applyChatTemplate(
    messages.slice(0, lastIdx).map((m) => ({ role: m.role as string, content: m.content as string })),
    { addGenerationPrompt: true },
  ).ids;
  const parts: { ids: ArrayLike<number>; mask: number }[] = [{ ids: prompt, mask: 0 }];
  for (const seg of segments) {
    // Tool-result tokens get mask 0: they are context written by the environment, not actions.
    if (seg.type === 'tool_result') parts.push({ ids: tokenizer.encodeToolResult(seg.text), mask: 0 });
    else parts.push({ ids: tokenizer.encode(seg.text, { addSpecialTokens: false }), mask: 1 });
  }
  parts.push({ ids: [eos], mask: 1 });
  const n = parts.reduce((a, p) => a + p.ids.length, 0);
  const tokens = new Int32Array(n);
  const mask = new Float32Array(n);
  let o = 0;
  for (const p of parts) {
    for (let i = 0; i < p.ids.length; i++, o++) {
      tokens[o] = p.ids[i] as number;
      mask[o] = p.mask;
    }
  }
  return { tokens, mask };
}

/** Reads and encodes an SFT file; malformed lines are errors naming file and line. */
export function readSftData(file: string, tokenizer: Tokenizer, options: { skipUngrounded?: boolean; eos?: number; systemPrompt?: string | null } = {}): TrainSequence[] {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new ArpoError('BAD_DATA', `cannot read SFT data ${file}: ${(e as Error).message}`);
  }
  const eos = options.eos ?? eosTokenIds(tokenizer)[0];
  if (eos === undefined) throw new ArpoError('BAD_DATA', `${tokenizer.source}: the tokenizer has no EOS token for SFT`);
  const out: TrainSequence[] = [];
  text.split('\n').forEach((line, i) => {
    if (!line.trim()) return;
    const where = `${path.basename(file)} line ${i + 1}`;
    let row: unknown;
    try {
      row = JSON.parse(line);
    } catch (e) {
      throw new ArpoError('BAD_DATA', `${where}: not valid JSON (${(e as Error).message})`);
    }
    if (options.skipUngrounded && (row as { grounded?: unknown }).grounded === false) return;
    out.push(encodeConversation(row, tokenizer, eos, where, options.systemPrompt ?? null));
  });
  if (out.length === 0) throw new ArpoError('BAD_DATA', `${file}: no SFT conversations`);
  return out;
}

export interface SftSummary {
  /** Steps done in all (a resumed run counts the earlier ones). */
  steps: number;
  /** Steps of the whole run (epochs x batches per epoch). */
  total: number;
  firstLoss: number;
  lastLoss: number;
}

export interface SftRunOptions {
  /** Steps already done (a resumed run): the schedule and the data order continue from there. */
  startStep?: number;
  /** Stop after this many steps in total (a partial run; for tests). */
  lastStep?: number;
  /** Called after each step's metrics are logged (the CLI checkpoints here). */
  afterStep?: (step: number, total: number) => Promise<void>;
  /** Data parallel: this rank trains its block of each batch (the model sums the gradients); rank 0 alone logs. */
  dist?: Dist;
}

/**
 * Trains `model` in place on the SFT data for cfg.sft.epochs; logs `phase: 'sft'`
 * metrics into <runDir>/sft-metrics.jsonl. Step s (1-based) of the run is batch
 * (s - 1) mod stepsPerEpoch of epoch floor((s - 1) / stepsPerEpoch) in that
 * epoch's seeded permutation, so a run resumed at any step sees the same data.
 */
export async function runSft(
  model: PolicyModel,
  data: readonly TrainSequence[],
  cfg: RunConfig,
  runDir: string,
  progressOut: { write(s: string): boolean; isTTY?: boolean } = process.stderr,
  options: SftRunOptions = {},
): Promise<SftSummary> {
  const perStep = cfg.sft.batchSequences;
  const stepsPerEpoch = Math.max(1, Math.ceil(data.length / perStep));
  const total = stepsPerEpoch * cfg.sft.epochs;
  const startStep = options.startStep ?? 0;
  const lastStep = Math.min(total, options.lastStep ?? total);
  const dist = options.dist ?? Dist.single();
  const log = new MetricsLog(runDir, 'sft-metrics.jsonl');
  if (startStep > 0 && dist.isRoot) log.truncateAfter(startStep);
  const progress = new Progress(total, dist.isRoot ? progressOut : { write: () => true }, 'sft', startStep);
  const started = Date.now();
  let firstLoss = NaN;
  let lastLoss = NaN;
  let order: number[] = [];
  for (let step = startStep + 1; step <= lastStep; step++) {
    const epoch = Math.floor((step - 1) / stepsPerEpoch);
    const b = ((step - 1) % stepsPerEpoch) * perStep;
    if (b === 0 || order.length === 0) order = Array.from(epochPermutation(data.length, cfg.train.seed, epoch));
    const batch = order.slice(b, b + perStep).map((i) => data[i]!);
    const { lo, hi } = dist.shard(batch.length);
    const m = await model.trainStep(microBatches(batch.slice(lo, hi), cfg.train.microBatchTokens), {
      mode: 'sft',
      optimizer: optimizerSettings(cfg, cfg.sft.lr, total),
    });
    if (step === startStep + 1) firstLoss = m.loss;
    lastLoss = m.loss;
    const metrics: StepMetrics = { 'sft/loss': m.loss, 'actor/loss': m.loss, 'actor/grad_norm': m.gradNorm, 'actor/lr': m.lr, 'sft/tokens': m.tokens, 'sft/epoch': epoch };
    if (dist.isRoot) log.append({ step, phase: 'sft', time: (Date.now() - started) / 1000, metrics });
    progress.step(step, metrics);
    if (options.afterStep) await options.afterStep(step, total);
  }
  return { steps: lastStep, total, firstLoss, lastLoss };
}

export interface SftOptions {
  /** Where the fine-tuned model is written (an HF directory). */
  out: string;
  /** Continue from the newest checkpoint in <train.outDir>/sft-checkpoints. */
  resume?: boolean;
  /** Stop after this many steps in this process (tests). */
  stopAfter?: number;
  progress?: { write(s: string): boolean; isTTY?: boolean };
  /** This process's place in a data-parallel run (default: from the environment). */
  launch?: LaunchEnv;
}

/**
 * `arpo sft`: loads the model and data, trains with a checkpoint every
 * sft.checkpointEvery steps (and after the last), and writes the model to
 * `out`. With `resume` it continues from the newest complete checkpoint made
 * with the same configuration, to the same weights and metrics as an
 * uninterrupted run.
 */
export async function sft(cfg: RunConfig, options: SftOptions): Promise<SftSummary & { out: string }> {
  if (!cfg.model.path) throw new ArpoError('BAD_CONFIG', 'sft: model.path is required (--set model.path=<dir>)');
  if (!cfg.sft.data) throw new ArpoError('BAD_CONFIG', 'sft: sft.data is required (--set sft.data=<file.jsonl>)');
  const launch = options.launch ?? readLaunchEnv();
  if (launch.world > cfg.sft.batchSequences) {
    throw new ArpoError('BAD_CONFIG', `sft.batchSequences: ${cfg.sft.batchSequences} sequences cannot be shared by ${launch.world} ranks (every rank needs at least one)`);
  }
  return Dist.run(launch, cfg.train.distTimeoutS * 1000, (dist) => sftRanks(cfg, options, dist, launch));
}

async function sftRanks(cfg: RunConfig, options: SftOptions, dist: Dist, launch: LaunchEnv): Promise<SftSummary & { out: string }> {
  const modelPath = cfg.model.path!;
  const sftData = cfg.sft.data!;
  const runDir = path.resolve(cfg.train.outDir);
  const hash = configHash(cfg);
  const { ckpt, latest } = await dist.rootFirst(() => {
    fs.mkdirSync(runDir, { recursive: true });
    const opened = openRunCheckpoints(runDir, hash, options.resume === true, 'sft-checkpoints', 'SFT ');
    if (!options.resume && dist.isRoot) fs.rmSync(path.join(runDir, 'sft-metrics.jsonl'), { force: true });
    return opened;
  });
  const tokenizerDir = cfg.model.tokenizer ?? modelPath;
  const threads = modelThreads(cfg.model.threads, launch);
  const { model, tokenizer } = await loadPolicy(latest ? path.join(latest.dir, 'model') : modelPath, { ...cfg, model: { ...cfg.model, threads, device: modelDevice(cfg.model.device, launch), tokenizer: tokenizerDir } });
  try {
    await dist.attach(model);
    const data = readSftData(sftData, tokenizer, { skipUngrounded: cfg.sft.skipUngrounded, systemPrompt: cfg.data.systemPrompt });
    const startStep = latest ? latest.state.step : 0;
    const every = cfg.sft.checkpointEvery;
    const s = await runSft(model, data, cfg, runDir, options.progress ?? process.stderr, {
      startStep,
      lastStep: options.stopAfter ? startStep + options.stopAfter : undefined,
      dist,
      afterStep: async (step, total) => {
        if ((every > 0 && step % every === 0) || step === total || step === startStep + (options.stopAfter ?? Infinity)) {
          if (dist.isRoot) {
            await ckpt.save({ version: 1, step, dataCursor: { epochStep: step }, seed: cfg.train.seed, configHash: hash }, (dir) =>
              model.save(dir, { optimizer: true, tokenizerDir }),
            );
          }
          await dist.barrier();
        }
      },
    });
    if (s.steps === s.total && dist.isRoot) {
      await model.save(options.out, { tokenizerDir });
    }
    return { ...s, out: options.out };
  } finally {
    model.dispose();
  }
}
