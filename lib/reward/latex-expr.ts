// A small evaluator for the arithmetic in LaTeX answers (numbers, \frac, \sqrt,
// \pi, powers, implicit products, single-letter variables), so the math reward
// can compare `\frac{\sqrt{3}}{2}` with `0.866` or `2(k+1)` with `2k+2`.

/** An evaluable expression: its value at a variable assignment, and the variables it uses. */
export interface Expression {
  readonly evaluate: (vars: ReadonlyMap<string, number>) => number;
  readonly variables: ReadonlySet<string>;
}

type Node = (vars: ReadonlyMap<string, number>) => number;

const FUNCTIONS: Readonly<Record<string, (x: number) => number>> = {
  sin: Math.sin,
  cos: Math.cos,
  tan: Math.tan,
  ln: Math.log,
  log: Math.log10,
  exp: Math.exp,
  arcsin: Math.asin,
  arccos: Math.acos,
  arctan: Math.atan,
};

const CONSTANTS: Readonly<Record<string, number>> = { pi: Math.PI };

const MULTIPLY = new Set(['\\cdot', '\\times', '*']);
const DIVIDE = new Set(['\\div', '/']);

class ParseError extends Error {}

function tokenize(text: string): string[] {
  const tokens: string[] = [];
  let i = 0;
  while (i < text.length) {
    const ch = text[i] as string;
    if (/\s/.test(ch)) {
      i++;
    } else if (/[0-9.]/.test(ch)) {
      const m = /^(?:\d+(?:\.\d*)?|\.\d+)/.exec(text.slice(i));
      if (!m) throw new ParseError(`bad number at ${i}`);
      tokens.push(m[0]);
      i += m[0].length;
    } else if (ch === '\\') {
      const m = /^\\(?:[A-Za-z]+|.)/.exec(text.slice(i));
      if (!m) throw new ParseError('dangling backslash');
      tokens.push(m[0]);
      i += m[0].length;
    } else {
      tokens.push(ch);
      i++;
    }
  }
  return tokens;
}

/** Recursive-descent parser: expr := term (+|- term)*; term := unary ((*|/|implicit) unary)*; unary := -unary | power. */
class Parser {
  private pos = 0;
  readonly variables = new Set<string>();
  constructor(private readonly tokens: string[]) {}

  parse(): Node {
    const node = this.expr();
    if (this.pos !== this.tokens.length) throw new ParseError(`unexpected ${this.tokens[this.pos]}`);
    return node;
  }

  private peek(): string | undefined {
    return this.tokens[this.pos];
  }

  private take(expected?: string): string {
    const t = this.tokens[this.pos];
    if (t === undefined || (expected !== undefined && t !== expected)) throw new ParseError(`expected ${expected ?? 'a token'}`);
    this.pos++;
    return t;
  }

  private expr(): Node {
    let left = this.term();
    for (;;) {
      const t = this.peek();
      if (t !== '+' && t !== '-') return left;
      this.pos++;
      const right = this.term();
      const l = left;
      left = t === '+' ? (v) => l(v) + right(v) : (v) => l(v) - right(v);
    }
  }

  private startsPrimary(t: string | undefined): boolean {
    if (t === undefined) return false;
    return /^[0-9.(A-Za-z{]/.test(t) || t === '\\frac' || t === '\\sqrt' || t === '\\binom' || Object.hasOwn(CONSTANTS, t.slice(1)) || Object.hasOwn(FUNCTIONS, t.slice(1));
  }

  private term(): Node {
    let left = this.unary();
    for (;;) {
      const t = this.peek();
      let op: 'mul' | 'div';
      if (t !== undefined && MULTIPLY.has(t)) {
        this.pos++;
        op = 'mul';
      } else if (t !== undefined && DIVIDE.has(t)) {
        this.pos++;
        op = 'div';
      } else if (this.startsPrimary(t) && !/^[0-9.]/.test(t ?? '')) {
        op = 'mul'; // implicit product: 2\sqrt{3}, 3x, (a)(b); never "2" "3" (one number)
      } else return left;
      const right = this.unary();
      const l = left;
      left = op === 'mul' ? (v) => l(v) * right(v) : (v) => l(v) / right(v);
    }
  }

  private unary(): Node {
    const t = this.peek();
    if (t === '-' || t === '+') {
      this.pos++;
      const inner = this.unary();
      return t === '-' ? (v) => -inner(v) : inner;
    }
    return this.power();
  }

  private power(): Node {
    const base = this.primary();
    if (this.peek() !== '^') return base;
    this.pos++;
    const exponent = this.peek() === '{' ? this.group() : this.unary();
    return (v) => Math.pow(base(v), exponent(v));
  }

  private group(): Node {
    this.take('{');
    const inner = this.expr();
    this.take('}');
    return inner;
  }

  private primary(): Node {
    const t = this.take();
    if (/^[0-9.]/.test(t)) {
      const value = Number(t);
      return () => value;
    }
    if (t === '(') {
      const inner = this.expr();
      this.take(')');
      return inner;
    }
    if (t === '{') {
      this.pos--;
      return this.group();
    }
    if (/^[A-Za-z]$/.test(t)) {
      this.variables.add(t);
      return (v) => v.get(t) ?? NaN;
    }
    if (t === '\\frac') {
      const num = this.group();
      const den = this.group();
      return (v) => num(v) / den(v);
    }
    if (t === '\\binom') {
      const n = this.group();
      const k = this.group();
      return (v) => binomial(n(v), k(v));
    }
    if (t === '\\sqrt') {
      let degree: Node = () => 2;
      if (this.peek() === '[') {
        this.pos++;
        degree = this.expr();
        this.take(']');
      }
      const radicand = this.peek() === '{' ? this.group() : this.primary();
      return (v) => nthRoot(radicand(v), degree(v));
    }
    const name = t.slice(1);
    if (t.startsWith('\\') && Object.hasOwn(CONSTANTS, name)) {
      const value = CONSTANTS[name] as number;
      return () => value;
    }
    if (t.startsWith('\\') && Object.hasOwn(FUNCTIONS, name)) {
      const f = FUNCTIONS[name] as (x: number) => number;
      const arg = this.power();
      return (v) => f(arg(v));
    }
    throw new ParseError(`unsupported ${t}`);
  }
}

function nthRoot(x: number, n: number): number {
  if (x < 0 && Number.isInteger(n) && n % 2 === 1) return -Math.pow(-x, 1 / n);
  return Math.pow(x, 1 / n);
}

function binomial(n: number, k: number): number {
  if (!Number.isInteger(n) || !Number.isInteger(k) || k < 0 || k > n) return NaN;
  let r = 1;
  for (let i = 1; i <= Math.min(k, n - k); i++) r = (r * (n - k + i)) / i;
  return r;
}

/**
 * Parses a normalised LaTeX answer into an Expression, or null when it is not
 * plain arithmetic. Words (runs of 3+ letters) are refused so text answers are
 * never compared as products of variables.
 */
export function parseLatexExpression(text: string): Expression | null {
  if (text.length === 0 || /(^|[^\\A-Za-z])[A-Za-z]{3,}/.test(text)) return null;
  try {
    const parser = new Parser(tokenize(text));
    const node = parser.parse();
    return { evaluate: node, variables: parser.variables };
  } catch (e) {
    if (e instanceof ParseError) return null;
    throw e;
  }
}
