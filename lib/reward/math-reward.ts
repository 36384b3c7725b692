// The `math` reward: 0/1 equivalence of the last boxed answer with a ground truth.
import { extractBoxedFromAnswerTag } from './hierarchical';
import { mathEquivalent } from './math';
import type { RewardInput, RewardResult } from './types';

/**
 * 1 when the last boxed answer (inside <answer> when there is one, else
 * anywhere) is equivalent to one of the ground truths, else 0. No format
 * penalty: wrap it in `hierarchicalReward` for one.
 */
export function mathReward(input: RewardInput): RewardResult {
  const answer = extractBoxedFromAnswerTag(input.response) ?? extractBoxedFromAnswerTag(`<answer>${input.response}</answer>`);
  if (answer === null) return { score: 0, formatOk: false, accuracy: 0, answer: '', reason: 'no \\boxed{} answer' };
  const truths = typeof input.groundTruth === 'string' ? [input.groundTruth] : input.groundTruth;
  const ok = truths.some((t) => mathEquivalent(answer, t));
  return { score: ok ? 1 : 0, formatOk: true, accuracy: ok ? 1 : 0, answer, reason: ok ? 'equivalent' : 'not equivalent' };
}
