// Synthetic pretraining for the demo's tiny model: copy and recall sequences
// that teach the induction a from-scratch decoder needs before SFT, and no
// facts of the world.
//
// Why: every demo answer is copied — an entity name from the question into a
// search query, digits from the question into python, a number from a
// search result into the answer. A 4-layer model trained from random weights
// on a few hundred SFT traces memorises the trace templates and the training
// names instead, and never copies (held-out accuracy 0). Induction heads form
// in about a thousand steps of sequences whose second half repeats the first
// (the phase transition of Olsson et al. 2022); a real LLM brings them from
// its pretraining, which this stage stands in for.
//
// Three tasks, each `context | <eos> | target` with the loss on the target only:
// - copy-tokens: a span of random ordinary tokens, repeated (pure induction);
// - copy-text: invented names, numbers, arithmetic and words as text,
//   repeated with a leading space (how names and numbers recur in the traces);
// - recall: `K1 is V1. K2 is V2. ... Kj is` -> ` Vj.` (picking the value bound
//   to one key among several, as in reading a search result).
// Keys and values are random: nothing here states a fact of the world.
import { invalidArgument } from '../../errors';
import type { TrainSequence } from '../../model/policy-model';
import type { Tokenizer } from '../../model/tokenizer';
import { Rng } from './rng';
import { SYLLABLES } from './world';

export type PretrainTask = 'copy-tokens' | 'copy-text' | 'recall';
export const PRETRAIN_TASKS: readonly PretrainTask[] = ['copy-tokens', 'copy-text', 'recall'];

export interface PretrainSequence extends TrainSequence {
  readonly tokens: Int32Array;
  readonly mask: Float32Array;
  readonly task: PretrainTask;
  /** The text of the target (empty for copy-tokens), for tests and inspection. */
  readonly target: string;
}

/** Share of each task in a batch (drawn per sequence). */
export const PRETRAIN_MIX: Readonly<Record<PretrainTask, number>> = Object.freeze({ 'copy-tokens': 0.25, 'copy-text': 0.35, recall: 0.4 });

/** Words of the demo's questions and corpus, so the copy-text spans look like what gets copied later. */
const WORDS = ['the', 'population', 'of', 'is', 'was', 'born', 'in', 'founded', 'city', 'height', 'metres', 'year', 'by', 'makes', 'employees', 'country', 'Mount', 'Works', 'Trading', 'painter', 'glass'];
const OPERATORS = ['+', '-', '*', '%'];

/**
 * An endless, seeded stream of pretraining batches over a tokenizer. Each
 * sequence is `context tokens, eos, target tokens` with mask 1 exactly on the
 * target tokens (the eos separator itself carries no loss).
 */
export class PretrainCurriculum {
  private readonly rng: Rng;
  private readonly ordinary: number[];
  private readonly separator: number;

  constructor(private readonly tokenizer: Tokenizer, seed: number) {
    if (!Number.isInteger(seed)) throw invalidArgument('an integer', 'seed', seed);
    const eos = tokenizer.eosTokenId;
    if (eos === null) throw invalidArgument('a tokenizer with an EOS token', 'tokenizer', tokenizer.source);
    this.separator = eos;
    this.ordinary = [];
    for (let id = 0; id < tokenizer.vocabSize; id++) if (!tokenizer.specialTokenIds.has(id)) this.ordinary.push(id);
    if (this.ordinary.length < 2) throw invalidArgument('a tokenizer with ordinary tokens', 'tokenizer', tokenizer.source);
    this.rng = Rng.forStream(seed, 'pretrain');
  }

  /** `size` fresh sequences. */
  batch(size: number): PretrainSequence[] {
    if (!Number.isInteger(size) || size < 1) throw invalidArgument('a positive integer', 'size', size);
    return Array.from({ length: size }, () => this.sequence());
  }

  /** One sequence of a task drawn from PRETRAIN_MIX (or of the given task). */
  sequence(task: PretrainTask = this.drawTask()): PretrainSequence {
    switch (task) {
      case 'copy-tokens': {
        const span = Array.from({ length: this.rng.int(4, 20) }, () => this.rng.pick(this.ordinary));
        return this.assemble(task, span, span, '');
      }
      case 'copy-text': {
        const text = Array.from({ length: this.rng.int(1, 4) }, () => this.item()).join(' ');
        return this.assemble(task, this.encode(text), this.encode(` ${text}`), ` ${text}`);
      }
      case 'recall': {
        const n = this.rng.int(2, 5);
        const keys = new Set<string>();
        while (keys.size < n) keys.add(this.name());
        const ks = [...keys];
        const vs = ks.map(() => (this.rng.chance(0.7) ? this.number() : this.name()));
        const j = this.rng.int(0, n - 1);
        const context = `${ks.map((k, i) => `${k} is ${vs[i]}.`).join(' ')} ${ks[j]} is`;
        const target = ` ${vs[j]}.`;
        return this.assemble(task, this.encode(context), this.encode(target), target);
      }
    }
  }

  private drawTask(): PretrainTask {
    let u = this.rng.next();
    for (const t of PRETRAIN_TASKS) {
      u -= PRETRAIN_MIX[t];
      if (u < 0) return t;
    }
    return 'recall';
  }

  private assemble(task: PretrainTask, context: readonly number[], target: readonly number[], text: string): PretrainSequence {
    const tokens = Int32Array.from([...context, this.separator, ...target]);
    const mask = new Float32Array(tokens.length);
    mask.fill(1, context.length + 1);
    return { tokens, mask, task, target: text };
  }

  private encode(text: string): number[] {
    return Array.from(this.tokenizer.encode(text));
  }

  /** An invented name of one or two words, built like the world's names. */
  private name(): string {
    const word = (): string => {
      let s = '';
      for (let i = this.rng.int(1, 3); i > 0; i--) s += this.rng.pick(SYLLABLES);
      return s.charAt(0).toUpperCase() + s.slice(1);
    };
    return this.rng.chance(0.3) ? `${word()} ${word()}` : word();
  }

  /** An integer of 1 to 7 digits. */
  private number(): string {
    return String(this.rng.int(0, 10 ** this.rng.int(1, 7) - 1));
  }

  private item(): string {
    const u = this.rng.next();
    if (u < 0.35) return this.name();
    if (u < 0.7) return this.number();
    if (u < 0.85) return `${this.number()} ${this.rng.pick(OPERATORS)} ${this.number()}`;
    return this.rng.pick(WORDS);
  }
}
