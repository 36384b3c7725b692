// Independent references for the demo-environment tests: a deep-research format checker written
// from ARPO.md §3 (not the library's), and a batch evaluator that asks Debian's python3.
import { execFileSync } from 'child_process';

/**
 * The deep-research format rules of ARPO.md §3, re-derived: paired and present
 * <think>, exactly one <answer> ... </answer> in that order, every <search> /
 * <python> closed and followed by a <result> ... </result> before the next call,
 * and `\boxed{` ... `}` inside the answer. Returns the broken rule or null.
 */
export function formatViolation(text: string): string | null {
  const occurrences = (s: string) => {
    const out: number[] = [];
    for (let i = text.indexOf(s); i >= 0; i = text.indexOf(s, i + s.length)) out.push(i);
    return out;
  };
  const opens = occurrences('<think>');
  const closes = occurrences('</think>');
  if (opens.length === 0) return 'no <think>';
  if (opens.length !== closes.length) return 'unpaired <think>';
  if (opens.some((o, i) => o > (closes[i] as number))) return '</think> before <think>';
  const a = occurrences('<answer>');
  const b = occurrences('</answer>');
  if (a.length !== 1 || b.length !== 1) return 'not exactly one answer';
  if ((a[0] as number) > (b[0] as number)) return '</answer> before <answer>';
  // Calls in order of appearance, each must be closed and answered before anything else happens.
  const calls = [...text.matchAll(/<(search|python)>/g)];
  for (const m of calls) {
    const tag = m[1] as string;
    const start = m.index as number;
    const close = text.indexOf(`</${tag}>`, start);
    const res = text.indexOf('<result>', start);
    const resEnd = text.indexOf('</result>', start);
    if (close < 0 || res < 0 || resEnd < 0) return `<${tag}> without its result`;
    if (!(close < res && res < resEnd)) return `<${tag}> result out of order`;
  }
  const answer = text.slice(a[0] as number, b[0] as number);
  const box = answer.indexOf('\\boxed{');
  if (box < 0 || answer.indexOf('}', box) < 0) return 'no \\boxed{} in the answer';
  return null;
}

/** The content of the last `\boxed{...}` in the answer (balanced braces), or null. */
export function boxedAnswer(text: string): string | null {
  const m = /<answer>([\s\S]*)<\/answer>/.exec(text);
  if (!m) return null;
  const body = m[1] as string;
  const start = body.lastIndexOf('\\boxed{');
  if (start < 0) return null;
  let depth = 0;
  for (let i = start + '\\boxed'.length; i < body.length; i++) {
    if (body[i] === '{') depth++;
    else if (body[i] === '}' && --depth === 0) return body.slice(start + '\\boxed{'.length, i);
  }
  return null;
}

/** Evaluates python expressions with /usr/bin/python3 in one process; returns repr-free str() of each. */
export function pythonEval(expressions: readonly string[]): string[] {
  const program = 'import json,sys\nprint(json.dumps([str(eval(e)) for e in json.load(sys.stdin)]))\n';
  const out = execFileSync('/usr/bin/python3', ['-I', '-c', program], { input: JSON.stringify(expressions), encoding: 'utf8' });
  return JSON.parse(out) as string[];
}

/** Runs python programs with /usr/bin/python3 in one process; returns each one's stdout (trailing newline removed), or `Error: message`. */
export function pythonRun(programs: readonly string[]): string[] {
  const program = [
    'import json,sys,io,contextlib',
    'outs=[]',
    'for src in json.load(sys.stdin):',
    '    buf=io.StringIO()',
    '    try:',
    '        with contextlib.redirect_stdout(buf):',
    '            exec(src, {})',
    '    except SyntaxError as e:',
    '        buf.write(f"SyntaxError: {e.msg}")',
    '    except Exception as e:',
    '        buf.write(f"{type(e).__name__}: {e}")',
    '    outs.append(buf.getvalue().rstrip("\\n"))',
    'print(json.dumps(outs))',
  ].join('\n');
  const out = execFileSync('/usr/bin/python3', ['-I', '-c', program], { input: JSON.stringify(programs), encoding: 'utf8' });
  return JSON.parse(out) as string[];
}
