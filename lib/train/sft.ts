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
import { eosTokenIds, optimizerSettings } from './setup';

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
  steps: number;
  firstLoss: number;
  lastLoss: number;
}

/** Trains `model` in place on the SFT data for cfg.sft.epochs; logs `phase: 'sft'` metrics into <runDir>/metrics.jsonl. */
export async function runSft(
  model: PolicyModel,
  data: readonly TrainSequence[],
  cfg: RunConfig,
  runDir: string,
  progressOut: { write(s: string): boolean; isTTY?: boolean } = process.stderr,
): Promise<SftSummary> {
  const perStep = cfg.sft.batchSequences;
  const stepsPerEpoch = Math.max(1, Math.ceil(data.length / perStep));
  const total = stepsPerEpoch * cfg.sft.epochs;
  const log = new MetricsLog(runDir, 'sft-metrics.jsonl');
  const progress = new Progress(total, progressOut, 'sft');
  const started = Date.now();
  let step = 0;
  let firstLoss = NaN;
  let lastLoss = NaN;
  for (let epoch = 0; epoch < cfg.sft.epochs; epoch++) {
    const order = Array.from(epochPermutation(data.length, cfg.train.seed, epoch));
    for (let b = 0; b < order.length; b += perStep) {
      const batch = order.slice(b, b + perStep).map((i) => data[i]!);
      const m = await model.trainStep(microBatches(batch, cfg.train.microBatchTokens), {
        mode: 'sft',
        optimizer: optimizerSettings(cfg, cfg.sft.lr, total),
      });
      step++;
      if (step === 1) firstLoss = m.loss;
      lastLoss = m.loss;
      const metrics: StepMetrics = { 'sft/loss': m.loss, 'actor/loss': m.loss, 'actor/grad_norm': m.gradNorm, 'actor/lr': m.lr, 'sft/tokens': m.tokens, 'sft/epoch': epoch };
      log.append({ step, phase: 'sft', time: (Date.now() - started) / 1000, metrics });
      progress.step(step, metrics);
    }
  }
  return { steps: step, firstLoss, lastLoss };
}
