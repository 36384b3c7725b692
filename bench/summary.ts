// Small helpers shared by the benchmark runner: median and spread of repeated
// measurements, number formatting, markdown tables, and the child-process
// calls that keep every measurement in a fresh process.
import { spawn } from 'child_process';

/** Median and spread (min, max) of repeated measurements; NaNs are dropped. */
export interface Spread {
  median: number;
  min: number;
  max: number;
  n: number;
}

export function spread(values: readonly number[]): Spread {
  const xs = values.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
  const n = xs.length;
  if (n === 0) return { median: NaN, min: NaN, max: NaN, n: 0 };
  const median = n % 2 ? xs[(n - 1) / 2]! : (xs[n / 2 - 1]! + xs[n / 2]!) / 2;
  return { median, min: xs[0]!, max: xs[n - 1]!, n };
}

/** A number with `digits` significant decimals; '-' for NaN / undefined. */
/** The q-quantile of xs by rank: the element at floor(q * n) of the sorted values (the last one for q = 1). */
export function quantile(xs: readonly number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))] as number;
}

export function num(v: number | undefined, digits = 2): string {
  if (v === undefined || !Number.isFinite(v)) return '-';
  const a = Math.abs(v);
  if (a !== 0 && a < 10 ** -digits) return v.toExponential(1);
  return v.toFixed(a >= 1000 ? 0 : digits);
}

/** "median [min, max]" (just the median when there is one value). */
export function withSpread(s: Spread, digits = 2): string {
  if (s.n <= 1) return num(s.median, digits);
  return `${num(s.median, digits)} [${num(s.min, digits)}, ${num(s.max, digits)}]`;
}

/** Milliseconds in the unit that reads best (µs below 1 ms, s above 10 s). */
export function ms(v: number): string {
  if (!Number.isFinite(v)) return '-';
  if (v < 1) return `${(v * 1000).toFixed(1)} µs`;
  if (v >= 10000) return `${(v / 1000).toFixed(1)} s`;
  return `${v.toFixed(v >= 100 ? 0 : 2)} ms`;
}

export function mib(bytes: number): string {
  return Number.isFinite(bytes) ? `${(bytes / 2 ** 20).toFixed(bytes >= 2 ** 30 ? 0 : 1)} MiB` : '-';
}

/** A GitHub markdown table. */
export function table(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const lines = [`| ${header.join(' | ')} |`, `| ${header.map(() => '---').join(' | ')} |`];
  for (const r of rows) lines.push(`| ${r.join(' | ')} |`);
  return lines.join('\n');
}

export interface ChildResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs a command to completion, collecting stdout (the JSON result) and
 * passing stderr through to ours when `echo` is set (progress lines).
 */
export function runChild(cmd: string, args: readonly string[], options: { env?: NodeJS.ProcessEnv; echo?: boolean; cwd?: string } = {}): Promise<ChildResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env: options.env ?? process.env, cwd: options.cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      stderr += d;
      if (options.echo) process.stderr.write(d);
    });
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** The last line of stdout that parses as a JSON object (children may print other lines first). */
export function lastJson<T>(stdout: string, what: string): T {
  const lines = stdout.trim().split('\n').reverse();
  for (const line of lines) {
    const t = line.trim();
    if (!t.startsWith('{')) continue;
    try {
      return JSON.parse(t) as T;
    } catch {
      /* not this line */
    }
  }
  throw new Error(`${what}: no JSON result on stdout (got ${JSON.stringify(stdout.slice(-300))})`);
}

/**
 * The main of a bench child process (`bench/<name>-run.ts '<json spec>'`): parses
 * the spec, runs it and prints the result as one JSON line (exit 0), or the
 * usage (exit 2) or the error (exit 1).
 */
export function childMain<S, R>(name: string, usage: string, valid: (spec: S) => boolean, run: (spec: S) => Promise<R>): void {
  let spec: S | null = null;
  try {
    spec = JSON.parse(process.argv[2] ?? 'null') as S | null;
  } catch {
    spec = null;
  }
  if (!spec || typeof spec !== 'object' || !valid(spec)) {
    process.stderr.write(`usage: ${usage}\n`);
    process.exit(2);
  }
  run(spec).then(
    (r) => {
      process.stdout.write(`${JSON.stringify(r)}\n`);
      process.exit(0);
    },
    (e: Error) => {
      process.stderr.write(`${name}: ${e.stack ?? e.message}\n`);
      process.exit(1);
    },
  );
}
