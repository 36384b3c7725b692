// Equivalence of math answers: LaTeX normalisation (after Hendrycks et al.'s
// MATH `strip_string`, as in verl's reward_score/math.py) plus exact rational
// comparison of literals, tolerant numeric comparison of expressions
// (rel 1e-4, as prime_math's grader), element-wise lists, intervals and sets,
// and symbolic identity checked at sample points.
import { extractBoxedAnswer } from './boxed';
import { parseLatexExpression } from './latex-expr';

/** Wrappers whose content is kept (`\text{(B)}` -> `(B)`). */
const TEXT_WRAPPERS = ['\\text', '\\textbf', '\\textit', '\\textrm', '\\mathrm', '\\mathbf', '\\mbox', '\\mathit', '\\operatorname', '\\boxed'];

/** Unit words dropped after a number (`5 cm`, `12 \text{ inches}`). */
const UNITS = new Set(
  'cm mm m km in inch inches ft foot feet yd yard yards mi mile miles meter meters metre metres centimeter centimeters kg g gram grams mg lb lbs pound pounds oz s sec second seconds min minute minutes h hr hour hours day days week weeks month months year years degree degrees deg rad radian radians unit units sq square cubic dollar dollars cent cents people students mph l liter liters ml'.split(' '),
);

/** Index just past the `{...}` group opening at `open` (text[open] === '{'), or -1. */
function groupEnd(text: string, open: number): number {
  let depth = 0;
  for (let i = open; i < text.length; i++) {
    if (text[i] === '{') depth++;
    else if (text[i] === '}' && --depth === 0) return i + 1;
  }
  return -1;
}

/** Replaces every `\wrapper{content}` by `content` (balanced braces). */
function unwrap(text: string, wrapper: string): string {
  let out = text;
  for (let at = out.indexOf(wrapper + '{'); at >= 0; at = out.indexOf(wrapper + '{', at)) {
    const open = at + wrapper.length;
    const end = groupEnd(out, open);
    if (end < 0) break;
    out = out.slice(0, at) + out.slice(open + 1, end - 1) + out.slice(end);
  }
  return out;
}

/** `\sqrt3` -> `\sqrt{3}`, `\frac12` -> `\frac{1}{2}`, `\frac1{2}` -> `\frac{1}{2}`. */
function fixShorthand(text: string): string {
  let s = text.replace(/\\sqrt(\w)/g, '\\sqrt{$1}');
  s = s.replace(/\\frac(\w)(\w)/g, '\\frac{$1}{$2}').replace(/\\frac(\w)\{/g, '\\frac{$1}{');
  s = s.replace(/\\frac\{([^{}]*)\}(\w)/g, '\\frac{$1}{$2}');
  return s;
}

/** Whether the original answer is a percentage (`19\%`, `19%`). */
function hasPercent(text: string): boolean {
  return /\\?%\s*$/.test(text.trim());
}

/**
 * Canonical text of a math answer: no spacing commands, `\left`/`\right`,
 * degrees, dollars, percent signs, trailing units or text wrappers; `\dfrac` and
 * `\tfrac` as `\frac`; a leading `x =` dropped; thousands separators removed;
 * whitespace removed.
 */
export function normalizeMathAnswer(answer: string): string {
  let s = answer.trim();
  s = s.replace(/\n/g, ' ').replace(/\\[!,;: ]/g, ' ').replace(/~/g, ' ');
  s = s.replace(/\\[dt]frac/g, '\\frac').replace(/\\left|\\right|\\bigl|\\bigr|\\Bigl|\\Bigr/g, '');
  s = s.replace(/\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\circ/g, '');
  s = s.replace(/\\\$|\$/g, '').replace(/\\?%/g, '');
  // Trailing unit text: `864 \mbox{ inches}^2`, `10 \text{ cm}` (the reference's _remove_right_units).
  s = s.replace(/(\S)\s*\\(?:text|mbox|mathrm)\{\s+[^{}]*\}(\^\{?\d\}?)?\s*$/, '$1');
  for (const w of TEXT_WRAPPERS) s = unwrap(s, w);
  // Plain unit words after a number: `5 cm`, `12 square feet`.
  const unit = /^(-?[\d.,]+(?:\/\d+)?)\s+([A-Za-z]+(?:\s+[A-Za-z]+)?)(\^\{?\d\}?)?$/.exec(s);
  if (unit && (unit[2] ?? '').split(/\s+/).every((w) => UNITS.has(w.toLowerCase()))) s = unit[1] ?? s;
  s = s.replace(/\s+/g, '');
  s = s.replace(/^(-?\d+(?:\.\d+)?)(?:\\times|\\cdot)10\^\{?(-?\d+)\}?$/, '$1e$2'); // 1.3\times10^{-8}
  s = fixShorthand(s);
  s = s.replace(/^\./, '0.').replace(/\{\./g, '{0.').replace(/([(\[{,=+\-*/])\.(\d)/g, (_m, before: string, digit: string) => `${before}0.${digit}`);
  if (s.endsWith('.') && !s.endsWith('..')) s = s.slice(0, -1);
  // `x=5`, `k=\frac12`: a short variable name on the left (MATH's strip_string).
  const eq = s.split('=');
  if (eq.length === 2 && /^[A-Za-z](_\{?\w+\}?)?$/.test(eq[0] ?? '')) s = eq[1] ?? '';
  if (/^-?\d{1,3}(,\d{3})+(\.\d+)?$/.test(s)) s = s.replace(/,/g, '');
  // A multiple-choice letter in parentheses: `(B)` -> `B`.
  const choice = /^\(([A-Z])\)$/.exec(s);
  if (choice) s = choice[1] ?? s;
  return s;
}

/** An exact rational (numerator, denominator > 0): a decimal literal (`-1.25`, `1.3e-8`) or `\frac{p}{q}` / `p/q` of such literals. */
function exactRational(s: string): [bigint, bigint] | null {
  const frac = /^(-?)(?:\\frac\{([^{}]+)\}\{([^{}]+)\}|([^/{}]+)\/([^/{}]+))$/.exec(s);
  if (frac) {
    const p = decimalLiteral(frac[2] ?? frac[4] ?? '');
    const q = decimalLiteral(frac[3] ?? frac[5] ?? '');
    if (!p || !q || q[0] === 0n) return null;
    // (p0/p1) / (q0/q1) = p0 q1 / (p1 q0), sign moved to the numerator.
    let num = p[0] * q[1] * (frac[1] === '-' ? -1n : 1n);
    let den = p[1] * q[0];
    if (den < 0n) [num, den] = [-num, -den];
    return [num, den];
  }
  return decimalLiteral(s);
}

/** A decimal literal, optionally in scientific notation, as a rational. */
function decimalLiteral(s: string): [bigint, bigint] | null {
  const m = /^(-?)(\d*)(?:\.(\d*))?(?:e([+-]?\d{1,4}))?$/i.exec(s);
  if (!m || ((m[2] ?? '') === '' && (m[3] ?? '') === '')) return null;
  const frac = m[3] ?? '';
  let num = BigInt((m[2] || '0') + frac) * (m[1] === '-' ? -1n : 1n);
  let den = 10n ** BigInt(frac.length);
  const exp = Number(m[4] ?? 0);
  if (exp > 0) num *= 10n ** BigInt(exp);
  else if (exp < 0) den *= 10n ** BigInt(-exp);
  return [num, den];
}

/** |a - b| <= 1e-4 * max(|a|, |b|) (+1e-12 so exact zeros match), prime_math's rel_tol. */
function close(a: number, b: number): boolean {
  return Math.abs(a - b) <= 1e-4 * Math.max(Math.abs(a), Math.abs(b)) + 1e-12;
}

/** Splits at top-level commas (outside (), [], {}). */
function splitTopLevel(s: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const ch = s[i];
    if (ch === '(' || ch === '[' || ch === '{') depth++;
    else if (ch === ')' || ch === ']' || ch === '}') depth--;
    else if (ch === ',' && depth === 0) {
      parts.push(s.slice(start, i));
      start = i + 1;
    }
  }
  parts.push(s.slice(start));
  return parts;
}

/** Deterministic sample points for symbolic identity checks. */
const SAMPLE_POINTS = [0.37, 1.91, 2.53, 0.61, 3.17];

/** Equivalence of two single (non-list) normalised answers. */
function scalarEquivalent(a: string, b: string, percent: boolean): boolean {
  if (a === b) return true;
  const la = exactRational(a);
  const lb = exactRational(b);
  if (la && lb) {
    // Exact rational equality of literals and fractions (1207 != 1207.1, 025 == 25, \frac{2}{4} == 0.5);
    // `10\%` against `0.1` either way round.
    if (la[0] * lb[1] === lb[0] * la[1]) return true;
    if (percent && (la[0] * lb[1] * 100n === lb[0] * la[1] || lb[0] * la[1] * 100n === la[0] * lb[1])) return true;
    // Only a rounded decimal against a fraction (0.6667 vs \frac{2}{3}) falls through to the tolerance below.
    const roundedDecimal = (x: string, y: string) => /^-?\d*\.\d+(e[+-]?\d+)?$/i.test(x) && /\/|\\frac/.test(y);
    if (!roundedDecimal(a, b) && !roundedDecimal(b, a)) return false;
    return close(Number(la[0]) / Number(la[1]), Number(lb[0]) / Number(lb[1]));
  }
  const ea = parseLatexExpression(a);
  const eb = parseLatexExpression(b);
  if (ea && eb) {
    const vars = [...new Set([...ea.variables, ...eb.variables])];
    if (vars.length === 0) {
      const va = ea.evaluate(new Map());
      const vb = eb.evaluate(new Map());
      if (!Number.isFinite(va) || !Number.isFinite(vb)) return false;
      return close(va, vb) || (percent && (close(va, vb / 100) || close(vb, va / 100)));
    }
    if (vars.length > 3 || ea.variables.size !== eb.variables.size) return false;
    for (const v of ea.variables) if (!eb.variables.has(v)) return false;
    let compared = 0;
    for (let p = 0; p < SAMPLE_POINTS.length; p++) {
      const assignment = new Map(vars.map((v, i) => [v, (SAMPLE_POINTS[(p + i) % SAMPLE_POINTS.length] as number) + i]));
      const va = ea.evaluate(assignment);
      const vb = eb.evaluate(assignment);
      if (Number.isNaN(va) && Number.isNaN(vb)) continue;
      if (!close(va, vb)) return false;
      compared++;
    }
    return compared >= 3;
  }
  return a.toLowerCase() === b.toLowerCase() && /^[^\\]*$/.test(a) && /[A-Za-z]{2,}/.test(a);
}

const BRACKETS: Readonly<Record<string, string>> = { '(': ')', '[': ']' };

/**
 * Whether `prediction` and `groundTruth` denote the same math answer:
 * `\frac{1}{2}` = `0.5` = `\dfrac12`, `x = 5` = `5`, `10\%` = `10`,
 * `(1, 2)` = `(1,2)`, `\{1, 2\}` = `\{2, 1\}`, `2(k+1)` = `2k+2`.
 */
export function mathEquivalent(prediction: string, groundTruth: string): boolean {
  const a = normalizeMathAnswer(extractBoxedAnswer(prediction) ?? prediction);
  const b = normalizeMathAnswer(extractBoxedAnswer(groundTruth) ?? groundTruth); // a few ground truths are whole sentences ending in \boxed{C}
  if (a.length === 0 || b.length === 0) return false;
  if (a === b) return true;
  const percent = hasPercent(prediction) || hasPercent(groundTruth);
  // Sets: order-free. Tuples and intervals: same brackets, element-wise.
  const setA = /^\\\{(.*)\\\}$/.exec(a);
  const setB = /^\\\{(.*)\\\}$/.exec(b);
  if (setA && setB) return unorderedEquivalent(splitTopLevel(setA[1] ?? ''), splitTopLevel(setB[1] ?? ''), percent);
  const open = a[0] ?? '';
  if (open in BRACKETS && (b[0] ?? '') in BRACKETS) {
    const inner = (s: string) => s.slice(1, -1);
    const closeA = a[a.length - 1] ?? '';
    const closeB = b[b.length - 1] ?? '';
    if ((closeA === ')' || closeA === ']') && (closeB === ')' || closeB === ']')) {
      const pa = splitTopLevel(inner(a));
      const pb = splitTopLevel(inner(b));
      if (pa.length > 1 || pb.length > 1) {
        if (open !== b[0] || closeA !== closeB || pa.length !== pb.length) return false;
        return pa.every((x, i) => scalarEquivalent(x, pb[i] ?? '', percent));
      }
    }
  }
  const pa = splitTopLevel(a);
  const pb = splitTopLevel(b);
  if (pa.length > 1 || pb.length > 1) return unorderedEquivalent(pa, pb, percent);
  return scalarEquivalent(a, b, percent);
}

/** Bare lists and sets: each element matches a distinct element of the other side. */
function unorderedEquivalent(pa: string[], pb: string[], percent: boolean): boolean {
  if (pa.length !== pb.length) return false;
  const used = new Array<boolean>(pb.length).fill(false);
  for (const x of pa) {
    const j = pb.findIndex((y, k) => !used[k] && scalarEquivalent(x, y, percent));
    if (j < 0) return false;
    used[j] = true;
  }
  return true;
}
