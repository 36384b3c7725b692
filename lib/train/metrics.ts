// Per-step metrics: appended as one JSON line per step to <run>/metrics.jsonl
// (never rewritten, so a killed run keeps every finished step), and shown as
// a live progress bar on a TTY or one plain line per step otherwise.
import * as fs from 'fs';
import * as path from 'path';

/** One step's metrics: flat, namespaced keys (e.g. `reward/mean`, `actor/pg_clipfrac`). */
export type StepMetrics = Record<string, number>;

export interface MetricsRecord {
  step: number;
  phase: string; // 'train' | 'valid' | 'sft' | 'eval'
  time: number; // seconds since the run started
  metrics: StepMetrics;
}

export class MetricsLog {
  readonly file: string;
  constructor(runDir: string, name = 'metrics.jsonl') {
    fs.mkdirSync(runDir, { recursive: true });
    this.file = path.join(runDir, name);
  }

  /** Appends one record (a single write of one line: atomic for O_APPEND at these sizes). */
  append(record: MetricsRecord): void {
    fs.appendFileSync(this.file, `${JSON.stringify(record)}\n`);
  }

  /** Drops records of steps after `step` (used by --resume so a replayed step is not logged twice). */
  truncateAfter(step: number): void {
    const kept = readMetrics(this.file).filter((r) => r.step <= step);
    const tmp = `${this.file}.tmp-${process.pid}`;
    fs.writeFileSync(tmp, kept.map((r) => `${JSON.stringify(r)}\n`).join(''));
    fs.renameSync(tmp, this.file);
  }
}

/**
 * Keeps the lines of a JSONL file whose `step` is <= `step` (atomically; a torn
 * or unreadable line is dropped): a resumed run's side files (the rollout
 * trace) lose the steps after its checkpoint, as metrics.jsonl does.
 */
export function truncateJsonlAfter(file: string, step: number): void {
  if (!fs.existsSync(file)) return;
  const kept = fs.readFileSync(file, 'utf8').split('\n').filter((line) => {
    try {
      const r = JSON.parse(line) as { step?: unknown };
      return typeof r.step === 'number' && r.step <= step;
    } catch {
      return false;
    }
  });
  const tmp = `${file}.tmp-${process.pid}`;
  fs.writeFileSync(tmp, kept.map((l) => `${l}\n`).join(''));
  fs.renameSync(tmp, file);
}

/** Reads a metrics.jsonl file; a torn last line (killed mid-write) is ignored. */
export function readMetrics(file: string): MetricsRecord[] {
  if (!fs.existsSync(file)) return [];
  const out: MetricsRecord[] = [];
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (!line.trim()) continue;
    try {
      const r = JSON.parse(line) as MetricsRecord;
      if (typeof r.step === 'number' && r.metrics && typeof r.metrics === 'object') out.push(r);
    } catch {
      /* torn line */
    }
  }
  return out;
}

function fmt(v: number | undefined, digits = 3): string {
  if (v === undefined || !Number.isFinite(v)) return '-';
  return Math.abs(v) >= 1000 ? v.toFixed(0) : v.toFixed(digits);
}

function fmtDuration(sec: number): string {
  if (!Number.isFinite(sec) || sec < 0) return '--:--';
  const s = Math.round(sec);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const r = s % 60;
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${String(r).padStart(2, '0')}` : `${m}:${String(r).padStart(2, '0')}`;
}

/** The one log line of a step: `step i/N | reward | acc | tool calls | ...`. */
export function formatStepLine(step: number, total: number, m: StepMetrics, elapsedSec: number, stepsTimed = step): string {
  const eta = stepsTimed > 0 ? (elapsedSec / stepsTimed) * (total - step) : NaN;
  // The fields a phase has (SFT has no reward or tool calls): absent ones are left out.
  const fields: [string, string, number][] = [
    ['reward', 'reward/mean', 3], ['acc', 'acc/mean', 3], ['tool calls', 'tools/calls_per_traj', 2], ['len', 'response/length_mean', 1], ['loss', 'actor/loss', 4],
  ];
  return [
    `step ${step}/${total}`,
    ...fields.filter(([, key]) => m[key] !== undefined).map(([label, key, digits]) => `${label} ${fmt(m[key], digits)}`),
    `eta ${fmtDuration(eta)}`,
  ].join(' | ');
}

/** Progress display: a redrawn bar on a TTY, plain lines elsewhere (CI, pipes). */
export class Progress {
  private readonly started = Date.now();
  constructor(
    private readonly total: number,
    private readonly out: NodeJS.WriteStream | { write(s: string): boolean; isTTY?: boolean } = process.stderr,
    private readonly label = 'train',
    /** Steps done before this process started timing (a resumed run's); default: the step before the first one shown. */
    private readonly startStep: number | null = null,
  ) {}

  get elapsedSec(): number {
    return (Date.now() - this.started) / 1000;
  }

  /** The step before the first one shown: a resumed run's ETA counts only the steps timed here. */
  private before: number | null = null;

  step(step: number, metrics: StepMetrics): void {
    // A caller that shows every n-th step says where it started; otherwise the step before the first one shown.
    if (this.before === null) this.before = this.startStep ?? step - 1;
    const line = formatStepLine(step, this.total, metrics, this.elapsedSec, step - this.before);
    if (this.out.isTTY) {
      const width = 24;
      const filled = Math.round((width * step) / Math.max(1, this.total));
      const bar = `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}]`;
      this.out.write(`\r\x1b[2K${this.label} ${bar} ${line}${step >= this.total ? '\n' : ''}`);
    } else {
      this.out.write(`${this.label} ${line}\n`);
    }
  }

  message(text: string): void {
    this.out.write(this.out.isTTY ? `\r\x1b[2K${text}\n` : `${text}\n`);
  }
}
