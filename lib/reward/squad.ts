// SQuAD answer normalisation and token-level F1, ported from the ARPO reference
// (RUC-NLPIR/ARPO, ARPO/verl_arpo_entropy/verl/utils/reward_score/deep_research.py:
// normalize_answer, get_f1_score), with Python's string semantics reproduced exactly.

/** string.punctuation of Python: the 32 ASCII punctuation characters. */
const PY_PUNCTUATION = new Set('!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~');

/**
 * Whitespace as Python's str.split() sees it (Py_UNICODE_ISSPACE): JS's \s
 * differs (it has U+FEFF, lacks U+001C..U+001F and U+0085).
 */
const PY_WHITESPACE = /[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+/u;

/**
 * `\b(a|an|the)\b` under Python's Unicode `re`: a word character is a letter,
 * a number or `_` in any script (JS's \b is ASCII-only, so it is spelt out).
 */
const ARTICLES = /(?<![\p{L}\p{N}_])(?:a|an|the)(?![\p{L}\p{N}_])/gu;

/** Python `" ".join(s.split())`. */
export function pythonSplitWhitespace(text: string): string[] {
  return text.split(PY_WHITESPACE).filter((t) => t.length > 0);
}

/** SQuAD normalisation: lower case, drop ASCII punctuation, drop articles, collapse whitespace. */
export function normalizeAnswer(s: string): string {
  const lower = s.toLowerCase();
  let noPunct = '';
  for (const ch of lower) if (!PY_PUNCTUATION.has(ch)) noPunct += ch;
  const noArticles = noPunct.replace(ARTICLES, ' ');
  return pythonSplitWhitespace(noArticles).join(' ');
}

const YES_NO = new Set(['yes', 'no', 'noanswer']);

/**
 * Token F1 of a prediction against one or more ground truths (the best one).
 * The yes/no/noanswer rule: if either side normalises to one of those words
 * and the sides differ, that ground truth scores 0 (no partial credit).
 * precision = same / |pred|, recall = same / |gt|, F1 = 2pr / (p + r) with
 * `same` the size of the multiset intersection of the tokens.
 */
export function tokenF1(prediction: string, groundTruths: string | readonly string[]): number {
  const truths = typeof groundTruths === 'string' ? [groundTruths] : groundTruths;
  let best = 0;
  const pred = normalizeAnswer(prediction);
  for (const truth of truths) {
    const gt = normalizeAnswer(truth);
    if (YES_NO.has(pred) && pred !== gt) continue;
    if (YES_NO.has(gt) && pred !== gt) continue;
    const predTokens = pred.split(' ').filter((t) => t.length > 0);
    const gtTokens = gt.split(' ').filter((t) => t.length > 0);
    const gtCounts = new Map<string, number>();
    for (const t of gtTokens) gtCounts.set(t, (gtCounts.get(t) ?? 0) + 1);
    let same = 0;
    for (const t of predTokens) {
      const left = gtCounts.get(t) ?? 0;
      if (left > 0) {
        same++;
        gtCounts.set(t, left - 1);
      }
    }
    if (same === 0) continue;
    const precision = (1.0 * same) / predTokens.length;
    const recall = (1.0 * same) / gtTokens.length;
    const f1 = (2 * precision * recall) / (precision + recall);
    if (f1 > best) best = f1;
  }
  return best;
}
