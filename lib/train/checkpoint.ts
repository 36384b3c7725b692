// Run checkpoints: <run>/checkpoints/step-NNNNNN/ holds the model (HF
// directory with optimizer state, written by the model) and
// trainer_state.json (step, data cursor, seeds). Every checkpoint is built
// aside and renamed into place, and `latest` is replaced atomically after it,
// so a process killed mid-write leaves the previous checkpoint intact and
// the partial one is removed at the next start.
import * as fs from 'fs';
import * as path from 'path';
import { ArpoError } from '../errors';

export interface TrainerState {
  version: 1;
  step: number; // optimiser steps completed
  dataCursor: unknown; // the dataset sampler's saved cursor
  seed: number;
  configHash: string;
  extra?: Record<string, unknown>;
}

const STEP_DIR = /^step-(\d{6,})$/;

export class CheckpointManager {
  readonly dir: string;
  /** `subdir`: 'checkpoints' for RL; SFT keeps its own ('sft-checkpoints') so the two never resume each other's. */
  constructor(runDir: string, private readonly keep = 2, subdir = 'checkpoints') {
    this.dir = path.join(runDir, subdir);
  }

  private latestFile(): string {
    return path.join(this.dir, 'latest');
  }

  stepDir(step: number): string {
    return path.join(this.dir, `step-${String(step).padStart(6, '0')}`);
  }

  /** Removes partial checkpoints left by a killed process (anything not a complete step dir). */
  cleanPartial(): string[] {
    if (!fs.existsSync(this.dir)) return [];
    const removed: string[] = [];
    for (const name of fs.readdirSync(this.dir)) {
      if (name.includes('.tmp-') || name.includes('.old-')) {
        fs.rmSync(path.join(this.dir, name), { recursive: true, force: true });
        removed.push(name);
      }
    }
    return removed;
  }

  /** The newest complete checkpoint, or null. `latest` is trusted only if its directory is complete. */
  latest(): { dir: string; state: TrainerState } | null {
    const candidates: string[] = [];
    if (fs.existsSync(this.latestFile())) candidates.push(fs.readFileSync(this.latestFile(), 'utf8').trim());
    if (fs.existsSync(this.dir)) {
      candidates.push(
        ...fs
          .readdirSync(this.dir)
          .filter((n) => STEP_DIR.test(n))
          .sort()
          .reverse(),
      );
    }
    for (const name of candidates) {
      if (!STEP_DIR.test(name)) continue;
      const dir = path.join(this.dir, name);
      try {
        return { dir, state: readTrainerState(dir) };
      } catch {
        /* incomplete or corrupt: try the next */
      }
    }
    return null;
  }

  /**
   * Writes checkpoint `state.step`: `writeModel(modelDir)` saves the model
   * into a fresh directory; then trainer_state.json; then the whole step
   * directory is renamed into place and `latest` updated.
   */
  async save(state: TrainerState, writeModel: (modelDir: string) => Promise<void>): Promise<string> {
    fs.mkdirSync(this.dir, { recursive: true });
    const final = this.stepDir(state.step);
    const tmp = `${final}.tmp-${process.pid}-${Date.now()}`;
    fs.mkdirSync(tmp, { recursive: true });
    try {
      await writeModel(path.join(tmp, 'model'));
      writeFileSynced(path.join(tmp, 'trainer_state.json'), `${JSON.stringify(state, null, 2)}\n`);
      if (fs.existsSync(final)) {
        const old = `${final}.old-${process.pid}-${Date.now()}`;
        fs.renameSync(final, old);
        fs.renameSync(tmp, final);
        fs.rmSync(old, { recursive: true, force: true });
      } else {
        fs.renameSync(tmp, final);
      }
    } catch (e) {
      fs.rmSync(tmp, { recursive: true, force: true });
      throw e;
    }
    const latestTmp = `${this.latestFile()}.tmp-${process.pid}`;
    writeFileSynced(latestTmp, `${path.basename(final)}\n`);
    fs.renameSync(latestTmp, this.latestFile());
    this.prune(state.step);
    return final;
  }

  private prune(current: number): void {
    const steps = fs
      .readdirSync(this.dir)
      .map((n) => STEP_DIR.exec(n))
      .filter((m): m is RegExpExecArray => m !== null)
      .map((m) => Number(m[1]))
      .filter((s) => s !== current)
      .sort((a, b) => b - a);
    for (const s of steps.slice(Math.max(0, this.keep - 1))) fs.rmSync(this.stepDir(s), { recursive: true, force: true });
  }
}

function writeFileSynced(file: string, text: string): void {
  const fd = fs.openSync(file, 'w');
  try {
    fs.writeSync(fd, text);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * A run's checkpoints at start: partial ones removed, and with `resume` the
 * newest complete one, which must exist and carry this configuration's hash.
 * `kind` names them in errors ('' for RL, 'SFT ' for SFT's own folder).
 */
export function openRunCheckpoints(runDir: string, hash: string, resume: boolean, subdir = 'checkpoints', kind = ''): { ckpt: CheckpointManager; latest: { dir: string; state: TrainerState } | null } {
  const ckpt = new CheckpointManager(runDir, 2, subdir);
  ckpt.cleanPartial();
  const latest = resume ? ckpt.latest() : null;
  if (resume && !latest) throw new ArpoError('BAD_CHECKPOINT', `--resume: no complete ${kind}checkpoint in ${ckpt.dir}`);
  if (latest && latest.state.configHash !== hash) {
    throw new ArpoError('BAD_CONFIG', `--resume: the ${kind}checkpoint was made with a different configuration (hash ${latest.state.configHash}, now ${hash})`);
  }
  return { ckpt, latest };
}

/** Reads and checks <dir>/trainer_state.json (and that the model directory is there). */
export function readTrainerState(dir: string): TrainerState {
  const file = path.join(dir, 'trainer_state.json');
  let parsed: unknown;
  try {
    parsed = JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (e) {
    throw new ArpoError('BAD_CHECKPOINT', `${file}: cannot read trainer state: ${(e as Error).message}`);
  }
  const s = parsed as Partial<TrainerState>;
  if (s === null || typeof s !== 'object') throw new ArpoError('BAD_CHECKPOINT', `${file}: expected an object`);
  if (s.version !== 1) throw new ArpoError('BAD_CHECKPOINT', `${file}: unsupported version ${JSON.stringify(s.version)}`);
  if (!Number.isInteger(s.step) || (s.step as number) < 0) throw new ArpoError('BAD_CHECKPOINT', `${file}: invalid step ${JSON.stringify(s.step)}`);
  if (!Number.isInteger(s.seed)) throw new ArpoError('BAD_CHECKPOINT', `${file}: invalid seed ${JSON.stringify(s.seed)}`);
  if (typeof s.configHash !== 'string') throw new ArpoError('BAD_CHECKPOINT', `${file}: invalid configHash`);
  if (!fs.existsSync(path.join(dir, 'model', 'config.json'))) throw new ArpoError('BAD_CHECKPOINT', `${dir}: model/config.json is missing`);
  return s as TrainerState;
}
