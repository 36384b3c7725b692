// RL datasets: ARPO parquet or JSONL files loaded into validated examples,
// and a seeded sampler (a fresh permutation per epoch) whose cursor can be
// saved and restored so a resumed run sees exactly the batches it would have.
import * as path from 'path';
import { ArpoError, invalidArgument } from '../errors';
import { mulberry32 } from '../random';
import { readJsonlRows, readParquetRows, type RawRow } from './readers';
import { isIssue, parseRow, type DatasetExample, type DatasetIssue } from './rows';

export interface DatasetOptions {
  /**
   * What a malformed row does: `skip` (default) drops it and records the issue
   * in `issues` (the reference train_10k has one: row 5274's ground truth is
   * " "); `fail` throws naming file, row and field.
   */
  readonly onMalformed?: 'skip' | 'fail';
  /** Keep at most this many valid examples per file (for quick runs). */
  readonly limit?: number;
  /** `parquet` or `jsonl`; default from the extension (.parquet, .jsonl / .json / .ndjson). */
  readonly format?: 'parquet' | 'jsonl';
}

function formatOf(file: string, format: DatasetOptions['format']): 'parquet' | 'jsonl' {
  if (format !== undefined) {
    if (format !== 'parquet' && format !== 'jsonl') throw invalidArgument('"parquet" or "jsonl"', 'format', format);
    return format;
  }
  const ext = path.extname(file).toLowerCase();
  if (ext === '.parquet') return 'parquet';
  if (ext === '.jsonl' || ext === '.json' || ext === '.ndjson') return 'jsonl';
  throw invalidArgument('a .parquet or .jsonl file (or options.format)', 'file', file);
}

/** A loaded dataset: its examples in file order, and the rows it skipped. */
export class PromptDataset {
  private constructor(
    readonly examples: readonly DatasetExample[],
    readonly issues: readonly DatasetIssue[],
    readonly files: readonly string[],
  ) {}

  /** Loads one or more files (rows of several files are concatenated in order). */
  static async load(files: string | readonly string[], options: DatasetOptions = {}): Promise<PromptDataset> {
    const list = typeof files === 'string' ? [files] : files;
    if (!Array.isArray(list) || list.length === 0 || !list.every((f) => typeof f === 'string' && f.length > 0)) {
      throw invalidArgument('a file path or a non-empty list of file paths', 'files', files);
    }
    const onMalformed = options.onMalformed ?? 'skip';
    if (onMalformed !== 'skip' && onMalformed !== 'fail') throw invalidArgument('"skip" or "fail"', 'onMalformed', onMalformed);
    const limit = options.limit ?? Infinity;
    if (limit !== Infinity && (!Number.isInteger(limit) || limit < 1)) throw invalidArgument('a positive integer', 'limit', limit);
    const examples: DatasetExample[] = [];
    const issues: DatasetIssue[] = [];
    for (const file of list) {
      const format = formatOf(file, options.format);
      const raw: RawRow[] = format === 'parquet' ? await readParquetRows(file) : readJsonlRows(file);
      const defaultSource = path.basename(file).replace(/\.[^.]+$/, '');
      let kept = 0;
      for (let row = 0; row < raw.length && kept < limit; row++) {
        const r = raw[row] as RawRow;
        const parsed: DatasetExample | DatasetIssue = r.ok ? parseRow(r.value, file, row, defaultSource) : { file, row, field: r.field, message: r.message };
        if (isIssue(parsed)) {
          if (onMalformed === 'fail') {
            throw new ArpoError('BAD_DATA', `Malformed row ${parsed.row} of ${parsed.file}, field ${parsed.field}: ${parsed.message} (to skip such rows: data.onBadRow: skip in a run config, onMalformed: "skip" for PromptDataset.load)`);
          }
          issues.push(parsed);
        } else {
          examples.push(parsed);
          kept++;
        }
      }
    }
    return new PromptDataset(examples, issues, list.slice());
  }

  /** Wraps examples built elsewhere (tests, embedded environments). */
  static fromExamples(examples: readonly DatasetExample[]): PromptDataset {
    return new PromptDataset(examples.slice(), [], []);
  }

  get size(): number {
    return this.examples.length;
  }

  /** A seeded sampler over this dataset. */
  sampler(options: SamplerOptions): DatasetSampler {
    return new DatasetSampler(this, options);
  }
}

export interface SamplerOptions {
  /** Prompts per batch. */
  readonly batchSize: number;
  /** Seed of the per-epoch permutations. */
  readonly seed?: number;
  /** Shuffle each epoch (default true); false keeps file order. */
  readonly shuffle?: boolean;
  /** Drop an epoch's last incomplete batch (default true, as verl's train loader). */
  readonly dropLast?: boolean;
}

/** Where a sampler stands: enough to resume it exactly. */
export interface SamplerState {
  readonly seed: number;
  readonly epoch: number;
  /** Index into this epoch's permutation of the next example to hand out. */
  readonly position: number;
  readonly batchSize: number;
  readonly shuffle: boolean;
  readonly dropLast: boolean;
  /** Dataset size when saved; restoring onto a different size fails. */
  readonly size: number;
}

/** 32-bit mix of (seed, epoch) (murmur3 finaliser) so each epoch has its own stream. */
function epochSeed(seed: number, epoch: number): number {
  let h = (Math.imul(seed >>> 0, 0x9e3779b1) ^ Math.imul(epoch + 1, 0x85ebca6b)) >>> 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/** The order of epoch `epoch`: Fisher-Yates under the epoch's seed (identity when not shuffling). */
export function epochPermutation(size: number, seed: number, epoch: number, shuffle = true): Uint32Array {
  const order = new Uint32Array(size);
  for (let i = 0; i < size; i++) order[i] = i;
  if (!shuffle) return order;
  const rand = mulberry32(epochSeed(seed, epoch));
  for (let i = size - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    const t = order[i] as number;
    order[i] = order[j] as number;
    order[j] = t;
  }
  return order;
}

/** Hands out batches epoch after epoch; `state()` / `restore()` save and resume the cursor. */
export class DatasetSampler {
  private epochValue = 0;
  private positionValue = 0;
  private order: Uint32Array;
  readonly batchSize: number;
  readonly seed: number;
  readonly shuffle: boolean;
  readonly dropLast: boolean;

  constructor(
    private readonly dataset: PromptDataset,
    options: SamplerOptions,
  ) {
    if (options === null || typeof options !== 'object') throw invalidArgument('an object { batchSize, seed? }', 'options', options);
    const { batchSize, seed = 0, shuffle = true, dropLast = true } = options;
    if (!Number.isInteger(batchSize) || batchSize < 1) throw invalidArgument('a positive integer', 'batchSize', batchSize);
    if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) throw invalidArgument('an integer in [0, 2^32)', 'seed', seed);
    if (typeof shuffle !== 'boolean') throw invalidArgument('a boolean', 'shuffle', shuffle);
    if (typeof dropLast !== 'boolean') throw invalidArgument('a boolean', 'dropLast', dropLast);
    if (dataset.size === 0) throw new ArpoError('BAD_DATA', 'Cannot sample from an empty dataset');
    if (dropLast && batchSize > dataset.size) {
      throw invalidArgument(`a batch size <= the dataset size (${dataset.size}) when dropLast is set`, 'batchSize', batchSize);
    }
    this.batchSize = batchSize;
    this.seed = seed;
    this.shuffle = shuffle;
    this.dropLast = dropLast;
    this.order = epochPermutation(dataset.size, seed, 0, shuffle);
  }

  get epoch(): number {
    return this.epochValue;
  }

  /** Batches per epoch. */
  get batchesPerEpoch(): number {
    const n = this.dataset.size / this.batchSize;
    return this.dropLast ? Math.floor(n) : Math.ceil(n);
  }

  /** The next batch; a batch never spans two epochs. */
  next(): DatasetExample[] {
    const size = this.dataset.size;
    const left = size - this.positionValue;
    if (left <= 0 || (this.dropLast && left < this.batchSize)) this.startEpoch(this.epochValue + 1);
    const end = Math.min(size, this.positionValue + this.batchSize);
    const batch: DatasetExample[] = [];
    for (let i = this.positionValue; i < end; i++) batch.push(this.dataset.examples[this.order[i] as number] as DatasetExample);
    this.positionValue = end;
    return batch;
  }

  private startEpoch(epoch: number): void {
    this.epochValue = epoch;
    this.positionValue = 0;
    this.order = epochPermutation(this.dataset.size, this.seed, epoch, this.shuffle);
  }

  state(): SamplerState {
    return { seed: this.seed, epoch: this.epochValue, position: this.positionValue, batchSize: this.batchSize, shuffle: this.shuffle, dropLast: this.dropLast, size: this.dataset.size };
  }

  /** Resumes from a saved state (same dataset size and settings). */
  restore(state: SamplerState): void {
    if (state === null || typeof state !== 'object') throw invalidArgument('a sampler state object', 'state', state);
    if (state.size !== this.dataset.size) throw invalidArgument(`a state saved for a dataset of ${this.dataset.size} examples`, 'state.size', state.size);
    for (const key of ['seed', 'batchSize', 'shuffle', 'dropLast'] as const) {
      if (state[key] !== this[key]) throw invalidArgument(`${JSON.stringify(this[key])} (this sampler's setting)`, `state.${key}`, state[key]);
    }
    if (!Number.isInteger(state.epoch) || state.epoch < 0) throw invalidArgument('a non-negative integer', 'state.epoch', state.epoch);
    if (!Number.isInteger(state.position) || state.position < 0 || state.position > this.dataset.size) {
      throw invalidArgument(`an integer in [0, ${this.dataset.size}]`, 'state.position', state.position);
    }
    this.startEpoch(state.epoch);
    this.positionValue = state.position;
  }
}
