// TEST HELPER, not the product's tools: an in-process stand-in for the search engine (term
// lookup over the corpus) and the python sandbox (an exact integer-arithmetic evaluator).
// The demo and training use the real tools of lib/tools through the same `RunTool` callback.
import { ArpoError } from '../../errors';
import type { CorpusDoc } from './corpus';

/** A tool runner: the text to put between ` <result>\n` and `\n</result>` for a call `<tag> content </tag>`. */
export type RunTool = (tag: string, content: string) => Promise<string>;

function words(text: string): string[] {
  return text.toLowerCase().match(/[a-z0-9]+/g) ?? [];
}

/**
 * Search stand-in: ranks documents by the summed inverse document frequency of
 * the query words they contain (rare words such as invented names dominate),
 * then by how many of its words are query words, then by corpus order; returns the top `topK` as
 * `Page i: [<title>] <text>` lines, the shape of lib/tools' search results.
 */
export function localSearch(docs: readonly CorpusDoc[], topK = 3): (query: string) => string {
  const docTokens = docs.map((d) => words(`${d.title} ${d.text}`));
  const docWords = docTokens.map((ws) => new Set(ws));
  const df = new Map<string, number>();
  for (const ws of docWords) for (const w of ws) df.set(w, (df.get(w) ?? 0) + 1);
  return (query: string) => {
    const terms = [...new Set(words(query))];
    const scored: { i: number; score: number; density: number }[] = [];
    docWords.forEach((ws, i) => {
      let score = 0;
      for (const t of terms) if (ws.has(t)) score += Math.log(docs.length / (df.get(t) ?? 1)) + 1e-3;
      const toks = docTokens[i] as string[];
      const density = toks.filter((t) => terms.includes(t)).length / toks.length;
      if (score > 0) scored.push({ i, score, density });
    });
    scored.sort((a, b) => b.score - a.score || b.density - a.density || a.i - b.i);
    const top = scored.slice(0, topK).map(({ i }, rank) => `Page ${rank + 1}: [${(docs[i] as CorpusDoc).title}] ${(docs[i] as CorpusDoc).text}`);
    return top.length > 0 ? top.join('\n') : 'No search results found.';
  };
}

// ---- python stand-in: `print(<integer expression>)` with + - * // % ** and parentheses ----------

type Tok = { kind: 'num'; value: bigint } | { kind: 'op'; value: string };

function tokenize(src: string): Tok[] {
  const out: Tok[] = [];
  const re = /\s*(?:(\d+)|(\*\*|\/\/|[-+*%()]))/y;
  let pos = 0;
  while (pos < src.length) {
    if (/^\s*$/.test(src.slice(pos))) break;
    re.lastIndex = pos;
    const m = re.exec(src);
    if (!m) throw new ArpoError('TOOL_FAILED', `SyntaxError: invalid syntax at ${JSON.stringify(src.slice(pos, pos + 10))}`);
    if (m[1] !== undefined && /^0+[1-9]/.test(m[1])) {
      throw new ArpoError('TOOL_FAILED', 'SyntaxError: leading zeros in decimal integer literals are not permitted; use an 0o prefix for octal integers');
    }
    out.push(m[1] !== undefined ? { kind: 'num', value: BigInt(m[1]) } : { kind: 'op', value: m[2] as string });
    pos = re.lastIndex;
  }
  return out;
}

/** Python semantics for integers: floor division and a modulo with the divisor's sign. */
function floorDiv(a: bigint, b: bigint): bigint {
  if (b === 0n) throw new ArpoError('TOOL_FAILED', 'ZeroDivisionError: integer division or modulo by zero');
  const q = a / b;
  return (a % b !== 0n && (a < 0n) !== (b < 0n)) ? q - 1n : q;
}

/**
 * Recursive descent over Python's precedence: `+ -` < `* // %` < unary `-` < `**`
 * (right-associative, and binding tighter than a unary minus on its left).
 */
function evaluate(tokens: Tok[]): bigint {
  let i = 0;
  const peek = (): Tok | undefined => tokens[i];
  const isOp = (v: string) => peek()?.kind === 'op' && peek()?.value === v;
  const sum = (): bigint => {
    let v = product();
    while (isOp('+') || isOp('-')) v = (tokens[i++] as Tok).value === '+' ? v + product() : v - product();
    return v;
  };
  const product = (): bigint => {
    let v = unary();
    while (isOp('*') || isOp('//') || isOp('%')) {
      const op = (tokens[i++] as Tok).value;
      const r = unary();
      v = op === '*' ? v * r : op === '//' ? floorDiv(v, r) : v - floorDiv(v, r) * r;
    }
    return v;
  };
  const unary = (): bigint => {
    if (isOp('-')) { i++; return -unary(); }
    if (isOp('+')) { i++; return unary(); }
    return power();
  };
  const power = (): bigint => {
    const base = atom();
    if (!isOp('**')) return base;
    i++;
    const exp = unary();
    if (exp < 0n || exp > 10000n) throw new ArpoError('TOOL_FAILED', 'ValueError: exponent out of the range this evaluator supports');
    return base ** exp;
  };
  const atom = (): bigint => {
    const t = tokens[i++];
    if (!t) throw new ArpoError('TOOL_FAILED', 'SyntaxError: unexpected end of expression');
    if (t.kind === 'num') return t.value;
    if (t.value === '(') {
      const v = sum();
      if (!isOp(')')) throw new ArpoError('TOOL_FAILED', "SyntaxError: '(' was never closed");
      i++;
      return v;
    }
    throw new ArpoError('TOOL_FAILED', `SyntaxError: unexpected ${JSON.stringify(t.value)}`);
  };
  const v = sum();
  if (i !== tokens.length) throw new ArpoError('TOOL_FAILED', 'SyntaxError: invalid syntax');
  return v;
}

/** Runs `print(expr)` lines (one per line) and returns their stdout, trailing newline removed; errors read like Python's. */
export function localPython(code: string): string {
  const lines: string[] = [];
  for (const raw of code.split('\n')) {
    const line = raw.trim();
    if (line === '') continue;
    const m = /^print\((.*)\)$/.exec(line);
    try {
      if (!m) throw new ArpoError('TOOL_FAILED', 'NameError: this test evaluator only runs print(<integer expression>)');
      lines.push(evaluate(tokenize(m[1] as string)).toString());
    } catch (e) {
      lines.push(e instanceof Error ? e.message : String(e));
      break;
    }
  }
  return lines.join('\n');
}

/** The pair as one `RunTool`. */
export function localRunTool(docs: readonly CorpusDoc[], topK = 3): RunTool {
  const search = localSearch(docs, topK);
  return async (tag: string, content: string) => {
    if (tag === 'search') return search(content);
    if (tag === 'python') return localPython(content);
    throw new ArpoError('UNKNOWN_NAME', `Unknown tool ${JSON.stringify(tag)}; known: python, search`);
  };
}
