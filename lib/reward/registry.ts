// The rewards registry, keyed by name: the built-ins plus any a user registers
// (registerReward) or loads from their own module (loadRewardModule).
import * as path from 'path';
import { ArpoError, invalidArgument, unknownName } from '../errors';
import { deepResearchReward } from './deep-research';
import { hierarchicalReward } from './hierarchical';
import { mathReward } from './math-reward';
import type { RewardFn, RewardInput, RewardResult } from './types';

/** What a run's `reward.*` options set on the built-ins that take them (the reference's values by default). */
export interface BuiltinRewardOptions {
  /** r_M, the multi-tool bonus (reference: 0.1). */
  readonly multiToolBonus?: number;
  /** Score of a badly formatted response (reference: -1). */
  readonly badFormatScore?: number;
}

/** The built-ins that take options, by name. */
const CONFIGURABLE: ReadonlyMap<string, (o: BuiltinRewardOptions) => RewardFn> = new Map<string, (o: BuiltinRewardOptions) => RewardFn>([
  ['arpo-deep-research', (o) => (input) => deepResearchReward(input, o)],
  ['hierarchical', (o) => hierarchicalReward(o)],
]);
const BUILTIN_DEFAULTS = new Map<string, RewardFn>([...CONFIGURABLE].map(([name, make]) => [name, make({})]));

/** The built-ins: the reference's reward, math equivalence, and the paper's hierarchical reward. */
const registry = new Map<string, RewardFn>([...BUILTIN_DEFAULTS, ['math', mathReward]]);

const NAME = /^[A-Za-z0-9][A-Za-z0-9_.:-]*$/;

/** Adds (or, with `{ replace: true }`, replaces) a reward under `name`. */
export function registerReward(name: string, fn: RewardFn, options: { replace?: boolean } = {}): void {
  if (typeof name !== 'string' || !NAME.test(name)) throw invalidArgument('a reward name of letters, digits, "_", ".", ":" or "-"', 'name', name);
  if (typeof fn !== 'function') throw invalidArgument('a function (input) => score | RewardResult', 'fn', fn);
  if (registry.has(name) && options.replace !== true) {
    throw new ArpoError('BAD_CONFIG', `A reward named ${JSON.stringify(name)} is already registered; pass { replace: true } to replace it`);
  }
  registry.set(name, fn);
}

/**
 * The reward registered under `name`; unknown names list the known ones. With `options`, a
 * built-in that takes them (arpo-deep-research, hierarchical) is built with them, unless a
 * user replaced it (a replacement is returned as registered).
 */
export function getReward(name: string, options?: BuiltinRewardOptions): RewardFn {
  const fn = registry.get(name);
  if (!fn) throw unknownName('reward', name, [...registry.keys()]);
  const make = CONFIGURABLE.get(name);
  if (options && make && fn === BUILTIN_DEFAULTS.get(name)) return make(options);
  return fn;
}

/** Names of every registered reward, sorted. */
export function rewardNames(): string[] {
  return [...registry.keys()].sort();
}

/** Turns whatever a reward returned into a RewardResult, rejecting non-finite scores. */
export function toRewardResult(name: string, value: RewardResult | number): RewardResult {
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw invalidArgument('a finite number', `the score of reward ${JSON.stringify(name)}`, value);
    return { score: value, formatOk: true, accuracy: value, answer: '', reason: '' };
  }
  if (value === null || typeof value !== 'object' || typeof value.score !== 'number' || !Number.isFinite(value.score)) {
    throw invalidArgument('a finite number or { score: number, ... }', `the result of reward ${JSON.stringify(name)}`, value);
  }
  return {
    score: value.score,
    formatOk: value.formatOk ?? true,
    accuracy: value.accuracy ?? value.score,
    answer: value.answer ?? '',
    reason: value.reason ?? '',
  };
}

/** Scores one response with the named reward (awaits async user rewards). */
export async function computeReward(name: string, input: RewardInput): Promise<RewardResult> {
  const fn = getReward(name);
  return toRewardResult(name, await fn(input));
}

/**
 * Loads a user's reward module (a .js file, or .ts when ts-node is registered)
 * and registers what it exports: either one function (`module.exports`, `default` or `reward`)
 * (registered under `name`, default the file's base name), or an object
 * `rewards: { name: fn, ... }`. Returns the names it registered.
 */
export function loadRewardModule(file: string, options: { name?: string; replace?: boolean } = {}): string[] {
  if (typeof file !== 'string' || file.length === 0) throw invalidArgument('a path to a reward module', 'file', file);
  const resolved = path.resolve(file);
  let mod: Record<string, unknown>;
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    mod = require(resolved) as Record<string, unknown>;
  } catch (e) {
    throw new ArpoError('BAD_CONFIG', `Cannot load reward module ${resolved}: ${(e as Error).message.split('\n')[0]}`, { cause: e });
  }
  const registered: string[] = [];
  const table = mod.rewards;
  if (table !== undefined) {
    if (table === null || typeof table !== 'object') throw invalidArgument('an object of reward functions', `rewards in ${resolved}`, table);
    for (const [key, fn] of Object.entries(table as Record<string, unknown>)) {
      if (typeof fn !== 'function') throw invalidArgument('a function', `rewards.${key} in ${resolved}`, fn);
      registerReward(key, fn as RewardFn, options);
      registered.push(key);
    }
  }
  // `module.exports = fn`, `export default fn` or `export const reward = fn`.
  const single = typeof (mod as unknown) === 'function' ? mod : typeof mod.default === 'function' ? mod.default : typeof mod.reward === 'function' ? mod.reward : undefined;
  if (single) {
    const name = options.name ?? path.basename(resolved).replace(/\.[cm]?[jt]s$/, '');
    registerReward(name, single as RewardFn, options);
    registered.push(name);
  }
  if (registered.length === 0) {
    throw new ArpoError('BAD_CONFIG', `Reward module ${resolved} exports no reward: export a function as default or "reward", or an object "rewards"`);
  }
  return registered;
}
