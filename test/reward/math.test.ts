// The math reward on ground truths from the real ARPO data (ability "math"):
// every ground truth is equivalent to itself when wrapped in a response, to
// re-written forms (decimals, \dfrac, spacing, units, `x =`), and not to
// other values; plus hand cases for the LaTeX forms the data uses.
import * as fs from 'fs';
import * as path from 'path';
import { PromptDataset } from '../../lib/data';
import { computeReward, mathEquivalent, mathReward, normalizeMathAnswer } from '../../lib/reward';

const DATA = '/work/shared/data/arpo';
const haveData = fs.existsSync(path.join(DATA, 'train_10k.parquet'));
const dataTest = haveData ? test : test.skip;

let truths: string[] = [];
beforeAll(async () => {
  if (!haveData) return;
  const files = [path.join(DATA, 'train_10k.parquet'), path.join(DATA, 'valid.parquet')];
  const ds = await PromptDataset.load(files);
  truths = ds.examples.filter((e) => e.ability === 'math').map((e) => e.groundTruth as string);
});

const wrap = (answer: string) => `<think>work</think>\n<answer>The final answer is \\[ \\boxed{${answer}} \\]</answer>`;

describe('math reward on the ARPO math ground truths', () => {
  dataTest('every ground truth, boxed in a response, scores 1 against itself', () => {
    expect(truths.length).toBe(5099); // 5000 + 100, less train row 5274 (blank ground truth)
    // A few ground truths are fragments with unbalanced braces (e.g. "1}^N"): no \boxed{} can hold them.
    const balanced = truths.filter((gt) => {
      let depth = 0;
      for (const ch of gt) if ((depth += ch === '{' ? 1 : ch === '}' ? -1 : 0) < 0) return false;
      return depth === 0;
    });
    expect(truths.length - balanced.length).toBeLessThan(20);
    const failed = balanced.filter((gt) => mathReward({ response: wrap(gt), groundTruth: gt }).score !== 1);
    expect(failed.slice(0, 10)).toEqual([]);
  });

  dataTest('integers: written forms are equivalent, neighbours are not', () => {
    const ints = [...new Set(truths.filter((t) => /^-?\d+$/.test(t)))];
    expect(ints.length).toBeGreaterThan(700);
    const bad: string[] = [];
    for (const t of ints) {
      const n = BigInt(t);
      const forms = [`x = ${t}`, `${t}.0`, `\\$${t}`, `${t} \\text{ cm}`, `\\text{${t}}`, `${t}^\\circ`, ` ${t} `, `{${t}}`];
      if (n >= 1000n) forms.push(n.toLocaleString('en-US'));
      for (const f of forms) if (!mathEquivalent(f, t)) bad.push(`${f} !~ ${t}`);
      for (const f of [`${n + 1n}`, `${n * 10n + 1n}`, `-${t}`.replace('--', '')]) if (f !== t && BigInt(f) !== n && mathEquivalent(f, t)) bad.push(`${f} ~ ${t}`);
    }
    expect(bad.slice(0, 10)).toEqual([]);
  });

  dataTest('fractions: decimals, \\dfrac, a/b and spacing are equivalent; off-by-one numerators are not', () => {
    const fracs = truths.map((t) => /^(-?)\\d?frac\{(\d+)\}\{(\d+)\}$/.exec(t)).filter((m): m is RegExpExecArray => m !== null);
    expect(fracs.length).toBeGreaterThan(200);
    const bad: string[] = [];
    for (const m of fracs) {
      const [gt, sign, a, b] = [m[0], m[1] ?? '', Number(m[2]), Number(m[3])];
      const value = (sign === '-' ? -1 : 1) * (a / b);
      for (const f of [value.toPrecision(10), `${sign}\\dfrac{${a}}{${b}}`, `${sign}${a}/${b}`, `${sign} \\frac { ${a} } { ${b} }`, `${sign}\\tfrac{${a}}{${b}}`]) {
        if (!mathEquivalent(f, gt)) bad.push(`${f} !~ ${gt}`);
      }
      // Exact forms compare exactly; a decimal is compared to 1e-4 relative (prime_math), so only far-off decimals must differ.
      if (mathEquivalent(`${sign}\\frac{${a + 1}}{${b}}`, gt)) bad.push(`${sign}(${a + 1})/${b} ~ ${gt}`);
      const other = (sign === '-' ? -1 : 1) * ((a + 1) / b);
      if (1 / a > 1e-3 && mathEquivalent(other.toPrecision(10), gt)) bad.push(`${other} ~ ${gt}`);
    }
    expect(bad.slice(0, 10)).toEqual([]);
  });

  dataTest('distinct numeric ground truths are never equivalent to each other', () => {
    const nums = [...new Set(truths.filter((t) => /^-?\d+(\.\d+)?$/.test(t)))];
    let compared = 0;
    const bad: string[] = [];
    for (let i = 0; i < nums.length; i += 7) {
      for (let j = i + 1; j < nums.length; j += 53) {
        const [x, y] = [nums[i] as string, nums[j] as string];
        if (Number(x) === Number(y)) continue;
        compared++;
        if (mathEquivalent(x, y)) bad.push(`${x} ~ ${y}`);
      }
    }
    expect(compared).toBeGreaterThan(1000);
    expect(bad.slice(0, 10)).toEqual([]);
  });
});

describe('math equivalence by hand (forms seen in the data)', () => {
  test.each([
    ['0.5', '\\frac{1}{2}'],
    ['\\frac12', '\\dfrac{1}{2}'],
    ['10', '10\\%'],
    ['0.1', '10\\%'],
    ['(5, \\infty)', '(5,\\infty)'],
    ['\\left( 8, -2 \\right)', '(8,-2)'],
    ['\\{2, 1, 8, 7\\}', '\\{1, 2, 7, 8\\}'],
    ['-1, 0, -2', '0, -2, -1'],
    ['2(k+1)', '2k+2'],
    ['-6 + 3\\sqrt{3}', '3\\sqrt{3} - 6'],
    ['\\sqrt{27} - 6', '3\\sqrt{3} - 6'],
    ['B', '\\text{(B)}'],
    ['864', '864 \\mbox{ inches}^2'],
    ['518400', '518,\\!400'],
    ['1.65', '\\$1.65'],
    ['120', '120^\\circ'],
    ['9.8', '9.80'],
    ['25', '025'],
    ['2\\pi\\sqrt{3}', '2\\sqrt{3}\\pi'],
    ['\\frac{\\sqrt{649}}{13}', '1.959683'],
    ['x^2 + (y-2)^2 = 18', 'x^2 + (y - 2)^2 = 18'],
    ['\\binom{5}{2}', '10'],
    ['1.3 \\times 10^{-8}', '1.3e-8'],
    ['\\frac{2}{4}', '0.5'],
    ['C', 'The final answer is \\( \\boxed{C} \\)'],
  ])('%s ~ %s', (a, b) => {
    expect(mathEquivalent(a, b)).toBe(true);
    expect(mathEquivalent(b, a)).toBe(true);
  });

  test.each([
    ['1207.1', '1207'],
    ['778556334111889667445224', '778556334111889667445223'],
    ['[5, \\infty)', '(5,\\infty)'],
    ['(2, 8)', '(8, 2)'],
    ['2k+3', '2k+2'],
    ['0.33', '\\frac{1}{3}'],
    ['C', '\\text{(B)}'],
    ['', '0'],
    ['SaleLaw', 'LawSale'],
    ['\\sqrt{3}', '\\sqrt{2}'],
    ['\\frac{51230}{99990}', '\\frac{51229}{99990}'],
    ['1.4e-8', '1.3e-8'],
  ])('%s !~ %s', (a, b) => {
    expect(mathEquivalent(a, b)).toBe(false);
  });

  test('normalisation strips what MATH strip_string strips', () => {
    expect(normalizeMathAnswer('\\left( \\dfrac{1}{2}, 3 \\right)')).toBe('(\\frac{1}{2},3)');
    expect(normalizeMathAnswer('k = \\frac12')).toBe('\\frac{1}{2}');
    expect(normalizeMathAnswer('.5')).toBe('0.5');
  });

  test('the registered math reward takes the last boxed answer and the best of several ground truths', async () => {
    expect((await computeReward('math', { response: wrap('\\frac{2}{4}'), groundTruth: ['7', '0.5'] })).score).toBe(1);
    expect((await computeReward('math', { response: 'so \\boxed{3} then \\boxed{4}', groundTruth: '4' })).score).toBe(1);
    expect((await computeReward('math', { response: 'no box: 4', groundTruth: '4' })).score).toBe(0);
  });
});
