// One dataset row in the ARPO / verl RL format, checked field by field: a
// malformed row becomes a DatasetIssue naming the file, row and field.
import { describeType, describeValue } from '../errors';

export interface ChatMessage {
  readonly role: string;
  readonly content: string;
}

/** A validated question with everything a rollout and a reward need. */
export interface DatasetExample {
  /** Row index in its file (0-based, counting malformed rows too). */
  readonly row: number;
  /** The file it came from. */
  readonly file: string;
  /** `data_source` (default: the file's base name). */
  readonly dataSource: string;
  /** `ability` (`math`, `qa`) or null. */
  readonly ability: string | null;
  /** The question text (`extra_info.question`, else the last user message, else `question`). */
  readonly question: string;
  /** `reward_model.ground_truth` (or `ground_truth` / `answer` in flat JSONL). */
  readonly groundTruth: string | readonly string[];
  /** The row's chat messages (`prompt`), or null when the row has only a question. */
  readonly messages: readonly ChatMessage[] | null;
  /** `extra_info`, with integer BigInts turned into numbers. */
  readonly extraInfo: Readonly<Record<string, unknown>>;
}

/** Why a row was rejected. */
export interface DatasetIssue {
  readonly file: string;
  readonly row: number;
  readonly field: string;
  readonly message: string;
}

/** BigInt -> number (parquet INT64), recursively; other values unchanged. */
export function plainValue(value: unknown): unknown {
  if (typeof value === 'bigint') return Number.isSafeInteger(Number(value)) ? Number(value) : value.toString();
  if (Array.isArray(value)) return value.map(plainValue);
  if (value !== null && typeof value === 'object' && !ArrayBuffer.isView(value) && !(value instanceof Date)) {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) out[k] = plainValue(v);
    return out;
  }
  return value;
}

function isRecord(x: unknown): x is Record<string, unknown> {
  return x !== null && typeof x === 'object' && !Array.isArray(x);
}

class RowError extends Error {
  constructor(
    readonly field: string,
    what: string,
    value: unknown,
  ) {
    super(`expected ${what} for ${field} but received ${describeValue(value)} of type ${describeType(value)}`);
  }
}

function parseMessages(value: unknown): ChatMessage[] {
  if (!Array.isArray(value) || value.length === 0) throw new RowError('prompt', 'a non-empty list of {role, content} messages', value);
  return value.map((m, i) => {
    if (!isRecord(m)) throw new RowError(`prompt[${i}]`, 'a {role, content} message', m);
    if (typeof m.role !== 'string' || m.role.length === 0) throw new RowError(`prompt[${i}].role`, 'a non-empty string', m.role);
    if (typeof m.content !== 'string') throw new RowError(`prompt[${i}].content`, 'a string', m.content);
    return { role: m.role, content: m.content };
  });
}

function parseGroundTruth(raw: Record<string, unknown>): string | string[] {
  // Name the field the row's own form would hold it in (verl rows vs flat JSONL).
  let field = raw.prompt !== undefined || raw.reward_model !== undefined ? 'reward_model.ground_truth' : 'ground_truth';
  let value: unknown;
  if (raw.reward_model !== undefined && raw.reward_model !== null) {
    if (!isRecord(raw.reward_model)) throw new RowError('reward_model', 'an object { ground_truth }', raw.reward_model);
    value = raw.reward_model.ground_truth;
  } else if (raw.ground_truth !== undefined) {
    field = 'ground_truth';
    value = raw.ground_truth;
  } else if (raw.answer !== undefined) {
    field = 'answer';
    value = raw.answer;
  }
  value = plainValue(value);
  if (typeof value === 'number' && Number.isFinite(value)) value = String(value); // numeric answers in JSONL
  if (typeof value === 'string' && value.trim().length > 0) return value;
  if (Array.isArray(value) && value.length > 0 && value.every((v) => typeof v === 'string' && v.trim().length > 0)) return value as string[];
  throw new RowError(field, 'a non-empty string (or list of strings) as the ground truth', value);
}

/** Checks one raw row (parquet object or JSONL line) and builds the example, or the issue. */
export function parseRow(raw: unknown, file: string, row: number, defaultDataSource: string): DatasetExample | DatasetIssue {
  try {
    if (!isRecord(raw)) throw new RowError('(row)', 'an object', raw);
    const messages = raw.prompt === undefined || raw.prompt === null ? null : parseMessages(raw.prompt);
    const extraRaw = plainValue(raw.extra_info ?? {});
    if (!isRecord(extraRaw)) throw new RowError('extra_info', 'an object', raw.extra_info);
    let question: unknown = extraRaw.question ?? raw.question;
    let questionField = extraRaw.question !== undefined ? 'extra_info.question' : 'question';
    if ((question === undefined || question === null) && messages) {
      question = [...messages].reverse().find((m) => m.role === 'user')?.content;
      questionField = 'prompt (user message)';
    }
    if (typeof question !== 'string' || question.trim().length === 0) throw new RowError(questionField, 'a non-empty question string', question);
    const groundTruth = parseGroundTruth(raw);
    const dataSource = raw.data_source ?? defaultDataSource;
    if (typeof dataSource !== 'string') throw new RowError('data_source', 'a string', dataSource);
    const ability = raw.ability ?? null;
    if (ability !== null && typeof ability !== 'string') throw new RowError('ability', 'a string or null', ability);
    return { row, file, dataSource, ability, question, groundTruth, messages, extraInfo: extraRaw };
  } catch (e) {
    if (e instanceof RowError) return { file, row, field: e.field, message: e.message };
    throw e;
  }
}

export function isIssue(x: DatasetExample | DatasetIssue): x is DatasetIssue {
  return (x as DatasetIssue).message !== undefined && (x as DatasetExample).question === undefined;
}
