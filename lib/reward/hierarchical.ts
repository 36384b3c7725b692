// The paper's hierarchical reward (ARPO.md section 3) over any accuracy reward
// and format check: R = max(Acc + r_M, Acc) if the format is right and Acc > 0,
// 0 if the format is right and Acc = 0, -1 if the format is wrong.
import { invalidArgument } from '../errors';
import { BoxError, lastBoxedOnlyString, removeBoxed } from './boxed';
import { extractAnswerTag, usedSearchAndPython, validateDeepResearchFormat } from './deep-research';
import { mathEquivalent } from './math';
import { tokenF1 } from './squad';
import type { FormatVerdict, RewardInput, RewardResult } from './types';

export interface HierarchicalRewardOptions {
  /** Acc in [0, 1] of an extracted answer (default: math equivalence for `ability: "math"`, else token F1). */
  readonly accuracy?: (answer: string, input: RewardInput) => number;
  /** Format check (default: the reference deep-research check). */
  readonly format?: (response: string) => FormatVerdict;
  /** The final answer, or null when it cannot be extracted (-1). Default: the last \boxed{} inside <answer>. */
  readonly extractAnswer?: (response: string) => string | null;
  /** r_M, the multi-tool bonus (paper and reference: 0.1). */
  readonly multiToolBonus?: number;
  /** Score of a wrong format or an answer that cannot be extracted (paper and reference: -1). */
  readonly badFormatScore?: number;
  /** When r_M applies (default: the response closed both a search and a python call). */
  readonly bonusApplies?: (response: string, input: RewardInput) => boolean;
  /** Stripped from the end of the response before extraction (e.g. `<|im_end|>`). */
  readonly eosToken?: string;
}

/** The last `\boxed{}` inside the first `<answer>...</answer>`, as the reference extracts it. */
export function extractBoxedFromAnswerTag(response: string): string | null {
  const part = extractAnswerTag(response);
  if (part === null) return null;
  try {
    return removeBoxed(lastBoxedOnlyString(part));
  } catch (e) {
    if (e instanceof BoxError) return null;
    throw e;
  }
}

/** Default accuracy: 0/1 math equivalence for math rows, SQuAD token F1 otherwise. */
export function defaultAccuracy(answer: string, input: RewardInput): number {
  const truths = typeof input.groundTruth === 'string' ? [input.groundTruth] : input.groundTruth;
  if (input.ability === 'math') return truths.some((t) => mathEquivalent(answer, t)) ? 1 : 0;
  return tokenF1(answer, truths);
}

/** Builds a hierarchical reward from its parts (all optional). */
export function hierarchicalReward(options: HierarchicalRewardOptions = {}): (input: RewardInput) => RewardResult {
  const bonus = options.multiToolBonus ?? 0.1;
  if (typeof bonus !== 'number' || !Number.isFinite(bonus)) throw invalidArgument('a finite number', 'multiToolBonus', bonus);
  const bad = options.badFormatScore ?? -1;
  if (typeof bad !== 'number' || !Number.isFinite(bad)) throw invalidArgument('a finite number', 'badFormatScore', bad);
  const accuracyOf = options.accuracy ?? defaultAccuracy;
  const formatOf = options.format ?? validateDeepResearchFormat;
  const extract = options.extractAnswer ?? extractBoxedFromAnswerTag;
  const bonusApplies = options.bonusApplies ?? ((response: string) => usedSearchAndPython(response));
  return (input: RewardInput): RewardResult => {
    let response = input.response;
    const format = formatOf(response);
    if (!format.ok) return { score: bad, formatOk: false, accuracy: 0, answer: '', reason: `bad format: ${format.reason}` };
    if (options.eosToken && response.endsWith(options.eosToken)) response = response.slice(0, -options.eosToken.length);
    const answer = extract(response);
    if (answer === null) return { score: bad, formatOk: false, accuracy: 0, answer: '', reason: 'cannot extract answer' };
    const acc = accuracyOf(answer, input);
    if (!Number.isFinite(acc)) throw invalidArgument('a finite accuracy', 'accuracy(answer)', acc);
    if (acc <= 0) return { score: 0, formatOk: true, accuracy: acc, answer, reason: 'wrong answer but good format' };
    const rM = bonusApplies(response, input) ? bonus : 0;
    return { score: Math.max(acc + rM, acc), formatOk: true, accuracy: acc, answer, reason: rM !== 0 ? 'correct answer with multi-tool bonus' : 'correct answer' };
  };
}
