// Lockstep for the e2e bench's runs of one seed: each run is its own process
// (its peak RSS is its own), and the processes take turns one training step
// at a time (rollout + update), so a drift of the shared machine's speed
// within minutes hits ARPO's and GRPO's steps alike, where run-after-run it
// hit whichever ran during the slow minutes. The turn is a counter in a file
// of a directory the parent made for the seed; every run also marks itself
// ready (no step starts before every process has loaded its model), done
// (the others stop waiting for it) or failed (the others stop with an error).
import * as fs from 'fs';
import * as path from 'path';

export interface LockstepSpec {
  /** The seed's directory (made empty by the parent). */
  readonly dir: string;
  /** This run's place in the turn order, 0 .. count - 1. */
  readonly index: number;
  readonly count: number;
}

const POLL_MS = 5;
const TIMEOUT_MS = 20 * 60 * 1000;

export class Lockstep {
  constructor(private readonly s: LockstepSpec) {
    if (!Number.isInteger(s.count) || s.count < 1 || !Number.isInteger(s.index) || s.index < 0 || s.index >= s.count)
      throw new Error(`lockstep: index ${s.index} of count ${s.count} (expected an integer in [0, count))`);
  }

  private file(name: string): string {
    return path.join(this.s.dir, name);
  }

  private turn(): number {
    const f = this.file('turn');
    return fs.existsSync(f) ? Number(fs.readFileSync(f, 'utf8')) || 0 : 0;
  }

  private has(what: 'ready' | 'done' | 'failed', i: number): boolean {
    return fs.existsSync(this.file(`${what}-${i}`));
  }

  /** Whose turn it is: the first run from turn % count on that is not done. */
  private owner(): number {
    const t = this.turn();
    for (let k = 0; k < this.s.count; k++) {
      const i = (t + k) % this.s.count;
      if (!this.has('done', i)) return i;
    }
    return -1;
  }

  private async waitFor(what: string, ok: () => boolean): Promise<void> {
    const until = Date.now() + TIMEOUT_MS;
    for (;;) {
      for (let i = 0; i < this.s.count; i++)
        if (i !== this.s.index && this.has('failed', i)) throw new Error(`lockstep: run ${i} of ${this.s.dir} failed while run ${this.s.index} waited for ${what}`);
      if (ok()) return;
      if (Date.now() > until) throw new Error(`lockstep: run ${this.s.index} waited ${TIMEOUT_MS / 60000} minutes for ${what} in ${this.s.dir}`);
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  }

  /** Before a step: wait until every run is ready and it is this run's turn. */
  async begin(): Promise<void> {
    fs.writeFileSync(this.file(`ready-${this.s.index}`), '');
    await this.waitFor('its turn', () => {
      for (let i = 0; i < this.s.count; i++) if (!this.has('ready', i) && !this.has('done', i)) return false;
      return this.owner() === this.s.index;
    });
  }

  /** After a step: the next run's turn. */
  end(): void {
    fs.writeFileSync(this.file('turn'), String(this.turn() + 1));
  }

  /** After the last step: stop taking turns, then wait until every run is done (the held-out evaluation afterwards must not overlap another run's steps). */
  async finish(): Promise<void> {
    fs.writeFileSync(this.file(`done-${this.s.index}`), '');
    await this.waitFor('the other runs to finish', () => {
      for (let i = 0; i < this.s.count; i++) if (!this.has('done', i)) return false;
      return true;
    });
  }

  /** On an error: the others stop waiting. */
  fail(): void {
    fs.writeFileSync(this.file(`failed-${this.s.index}`), '');
  }
}
