// The ARPO reference's deep-research reward, ported line by line from
// RUC-NLPIR/ARPO ARPO/verl_arpo_entropy/verl/utils/reward_score/deep_research.py
// (validate_format, extract_answer, compute_score; commit a95cd08): -1 on bad
// format, 0 on a wrong answer, F1 (+0.1 when both </search> and </python> occur).
import { BoxError, lastBoxedOnlyString, removeBoxed } from './boxed';
import { tokenF1 } from './squad';
import type { FormatVerdict, RewardInput, RewardResult } from './types';

/** Python's str.count (non-overlapping occurrences). */
function countOf(text: string, sub: string): number {
  return text.split(sub).length - 1;
}

/** Python's str.find(sub, start): a negative start counts from the end. */
function pyFind(text: string, sub: string, start: number): number {
  const from = start < 0 ? Math.max(0, text.length + start) : start;
  return text.indexOf(sub, from);
}

/**
 * Every `<tool>` must be followed, in order, by its `</tool>`, then `<result>`,
 * then `</result>`; the scan resumes after that `</result>`.
 */
function checkToolResultOrder(text: string, tool: string): FormatVerdict | null {
  let current = 0;
  for (;;) {
    const callPos = pyFind(text, `<${tool}>`, current);
    if (callPos === -1) return null;
    const resultPos = pyFind(text, '<result>', callPos);
    const callEndPos = pyFind(text, `</${tool}>`, callPos);
    const resultEndPos = pyFind(text, '</result>', resultPos);
    if (resultPos === -1 || callEndPos === -1 || resultEndPos === -1) {
      return { ok: false, reason: `${tool}/result tags are incomplete` };
    }
    if (!(callPos < callEndPos && callEndPos < resultPos && resultPos < resultEndPos)) {
      return { ok: false, reason: `${tool}/result tags are nested in the wrong order` };
    }
    current = resultEndPos;
  }
}

/**
 * The reference format check (validate_format): paired and present
 * `<think>`, exactly one `<answer>` and `</answer>`, each `<search>` and
 * `<python>` followed by its result, and `\boxed{` plus a `}` in the answer.
 */
export function validateDeepResearchFormat(text: string): FormatVerdict {
  if (countOf(text, '<think>') !== countOf(text, '</think>')) return { ok: false, reason: '<think> </think> not paired' };
  if (countOf(text, '<think>') === 0 || countOf(text, '</think>') === 0) {
    return { ok: false, reason: '<think> or </think> not found' };
  }
  if (countOf(text, '<answer>') !== 1 || countOf(text, '</answer>') !== 1) {
    return { ok: false, reason: '<answer> or </answer> not found' };
  }
  const search = checkToolResultOrder(text, 'search');
  if (search) return search;
  const python = checkToolResultOrder(text, 'python');
  if (python) return python;
  const answerStart = text.indexOf('<answer>');
  const answerEnd = text.indexOf('</answer>');
  if (answerStart > answerEnd) return { ok: false, reason: '<answer> must be before </answer>' };
  const answerContent = text.slice(answerStart, answerEnd);
  if (!answerContent.includes('\\boxed{') || !answerContent.includes('}')) {
    return { ok: false, reason: 'answer is missing \\boxed{} format' };
  }
  return { ok: true, reason: 'format is correct' };
}

/** The first `<answer>...</answer>` body (non-greedy, across lines), or null. */
export function extractAnswerTag(text: string): string | null {
  const m = /<answer>([\s\S]*?)<\/answer>/.exec(text);
  return m ? (m[1] ?? '') : null;
}

/** True when the response closed both a search and a python call (the reference's multi-tool test). */
export function usedSearchAndPython(response: string): boolean {
  return response.includes('</search>') && response.includes('</python>');
}

export interface DeepResearchOptions {
  /** Stripped from the end of the response before extraction (the reference's tokenizer.eos_token). */
  readonly eosToken?: string;
  /** Bonus for a right answer that used both tools (reference: 0.1). */
  readonly multiToolBonus?: number;
  /** Score of a response that fails the format check or has no extractable answer (reference: -1). */
  readonly badFormatScore?: number;
}

/** The reference compute_score: -1 bad format (`badFormatScore`), 0 wrong answer, F1 (+ bonus). */
export function deepResearchReward(input: RewardInput, options: DeepResearchOptions = {}): RewardResult {
  const bonus = options.multiToolBonus ?? 0.1;
  const bad = options.badFormatScore ?? -1;
  let response = input.response;
  const format = validateDeepResearchFormat(response);
  if (!format.ok) return { score: bad, formatOk: false, accuracy: 0, answer: '', reason: `bad format: ${format.reason}` };
  const eos = options.eosToken;
  if (eos && response.endsWith(eos)) response = response.slice(0, -eos.length);
  const answerPart = extractAnswerTag(response);
  if (answerPart === null) return { score: bad, formatOk: false, accuracy: 0, answer: '', reason: 'cannot extract answer' };
  let answer: string;
  try {
    answer = removeBoxed(lastBoxedOnlyString(answerPart));
  } catch (e) {
    if (!(e instanceof BoxError)) throw e;
    return { score: bad, formatOk: false, accuracy: 0, answer: '', reason: `find box error: ${e.message}` };
  }
  const f1 = tokenF1(answer, input.groundTruth);
  if (f1 > 0 && usedSearchAndPython(response)) {
    return { score: f1 + bonus, formatOk: true, accuracy: f1, answer, reason: `correct answer and calling search and python at the same time, get score: ${f1 + bonus}` };
  }
  if (f1 > 0) return { score: f1, formatOk: true, accuracy: f1, answer, reason: `correct answer, get f1 score: ${f1}` };
  return { score: 0, formatOk: true, accuracy: 0, answer, reason: `wrong answer but good format: ${answer}` };
}
