// Extraction of the final `\boxed{...}` answer, ported from the ARPO reference
// (RUC-NLPIR/ARPO, verl_arpo_entropy/verl/utils/reward_score/deep_research.py:
// last_boxed_only_string, remove_boxed), itself the Hendrycks MATH convention.

/**
 * The last `\boxed{...}` (or `\fbox{...}`) in `text` with its braces matched,
 * or null. Reference quirks kept on purpose: if `\boxed ` (with a space)
 * occurs anywhere, the result is `\boxed ` plus what follows its last
 * occurrence up to the first `$`; brace counting starts at the `\boxed` token
 * and a `}` seen before any `{` drives the count negative (so it never closes).
 */
export function lastBoxedOnlyString(text: string): string | null {
  let idx = text.lastIndexOf('\\boxed');
  if (text.includes('\\boxed ')) {
    const parts = text.split('\\boxed ');
    return '\\boxed ' + (parts[parts.length - 1] ?? '').split('$')[0];
  }
  if (idx < 0) {
    idx = text.lastIndexOf('\\fbox');
    if (idx < 0) return null;
  }
  let open = 0;
  for (let i = idx; i < text.length; i++) {
    const ch = text[i];
    if (ch === '{') open++;
    if (ch === '}') {
      open--;
      if (open === 0) return text.slice(idx, i + 1);
    }
  }
  return null;
}

/** Why an answer could not be unboxed (the reference raises an assertion there). */
export class BoxError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BoxError';
  }
}

/**
 * Strips the `\boxed{` ... `}` (or `\boxed `) wrapper. Throws BoxError on
 * null or on anything else (e.g. an `\fbox{...}`), as the reference does.
 */
export function removeBoxed(s: string | null): string {
  if (s === null) throw new BoxError("argument of type 'NoneType' is not iterable");
  if (s.includes('\\boxed ')) {
    if (!s.startsWith('\\boxed ')) throw new BoxError('expected the answer to start with "\\boxed "');
    return s.slice('\\boxed '.length);
  }
  if (!s.startsWith('\\boxed{')) throw new BoxError('expected the answer to start with "\\boxed{"');
  if (!s.endsWith('}')) throw new BoxError('expected the answer to end with "}"');
  return s.slice('\\boxed{'.length, -1);
}

/** The content of the last boxed answer, or null when there is none (no throw). */
export function extractBoxedAnswer(text: string): string | null {
  try {
    return removeBoxed(lastBoxedOnlyString(text));
  } catch (e) {
    if (e instanceof BoxError) return null;
    throw e;
  }
}
