// Outcome advantage estimators, a registry keyed by name (verl core_algos
// semantics: compute_grpo_outcome_advantage, compute_rloo_outcome_advantage,
// compute_reinforce_plus_plus_outcome_advantage, ..._baseline_...): one scalar
// reward per trajectory in, one advantage per trajectory out, in float64.
import { ArpoError, invalidArgument, unknownName } from '../errors';

/** Group key of a trajectory: the prompt it answers (verl's `uid` / index). */
export type GroupKey = number | string | bigint;

/** One batch of finished trajectories. */
export interface OutcomeBatch {
  /** (B) scalar outcome reward of each trajectory. */
  readonly rewards: ArrayLike<number>;
  /** (B) group (prompt) of each trajectory; GRPO-style statistics are per group. */
  readonly groups: ArrayLike<GroupKey>;
  /**
   * (B) number of loss tokens (response mask sum) of each trajectory. Only the
   * batch-whitened estimators use it: verl whitens over tokens, so a
   * trajectory weighs as many times as it has tokens. Default: 1 each.
   */
  readonly responseLengths?: ArrayLike<number>;
}

export interface EstimatorOptions {
  /** ε in (r - mean) / (std + ε) (verl: 1e-6). */
  readonly epsilon?: number;
}

/** An estimator: (B) advantages from a batch. */
export type AdvantageEstimator = (batch: OutcomeBatch, options: EstimatorOptions) => Float64Array;

/** Checks the batch and returns its rewards (finite) and group keys. */
export function validateOutcomeBatch(batch: OutcomeBatch): { rewards: Float64Array; groups: GroupKey[]; lengths: Float64Array | null } {
  if (batch === null || typeof batch !== 'object') throw invalidArgument('an object { rewards, groups }', 'batch', batch);
  const { rewards, groups, responseLengths } = batch;
  if (!isArrayLike(rewards)) throw invalidArgument('an array of numbers', 'rewards', rewards);
  if (!isArrayLike(groups) || groups.length !== rewards.length) {
    throw invalidArgument(`an array of ${rewards.length} group keys (one per reward)`, 'groups', groups);
  }
  const out = new Float64Array(rewards.length);
  for (let i = 0; i < rewards.length; i++) {
    const r = rewards[i];
    if (typeof r !== 'number' || !Number.isFinite(r)) throw invalidArgument('a finite number', `rewards[${i}]`, r);
    out[i] = r;
  }
  const keys: GroupKey[] = [];
  for (let i = 0; i < groups.length; i++) {
    const g = groups[i];
    if (typeof g !== 'number' && typeof g !== 'string' && typeof g !== 'bigint') throw invalidArgument('a number, string or bigint', `groups[${i}]`, g);
    keys.push(g);
  }
  let lengths: Float64Array | null = null;
  if (responseLengths !== undefined) {
    if (!isArrayLike(responseLengths) || responseLengths.length !== rewards.length) {
      throw invalidArgument(`an array of ${rewards.length} token counts`, 'responseLengths', responseLengths);
    }
    lengths = new Float64Array(rewards.length);
    for (let i = 0; i < rewards.length; i++) {
      const n = responseLengths[i];
      if (typeof n !== 'number' || !Number.isInteger(n) || n < 0) throw invalidArgument('a non-negative integer', `responseLengths[${i}]`, n);
      lengths[i] = n;
    }
  }
  return { rewards: out, groups: keys, lengths };
}

function isArrayLike(x: unknown): x is ArrayLike<unknown> {
  return Array.isArray(x) || (ArrayBuffer.isView(x) && !(x instanceof DataView));
}

function epsilonOf(options: EstimatorOptions): number {
  const eps = options.epsilon ?? 1e-6;
  if (typeof eps !== 'number' || !Number.isFinite(eps) || eps < 0) throw invalidArgument('a finite number >= 0', 'epsilon', eps);
  return eps;
}

interface GroupStats {
  count: number;
  mean: number;
  std: number; // unbiased (n - 1)
}

/** Per-group count, mean and unbiased std; a group of one has mean 0 and std 1 (verl). */
function groupStats(rewards: Float64Array, groups: GroupKey[]): Map<GroupKey, GroupStats> {
  const members = new Map<GroupKey, number[]>();
  for (let i = 0; i < rewards.length; i++) {
    const g = groups[i] as GroupKey;
    let list = members.get(g);
    if (!list) members.set(g, (list = []));
    list.push(rewards[i] as number);
  }
  const stats = new Map<GroupKey, GroupStats>();
  for (const [g, list] of members) {
    if (list.length === 1) {
      stats.set(g, { count: 1, mean: 0, std: 1 });
      continue;
    }
    let sum = 0;
    for (const r of list) sum += r;
    const mean = sum / list.length;
    let sq = 0;
    for (const r of list) sq += (r - mean) * (r - mean);
    stats.set(g, { count: list.length, mean, std: Math.sqrt(sq / (list.length - 1)) });
  }
  return stats;
}

/** GRPO: Â_i = (r_i - mean_g) / (std_g + ε). */
export const grpo: AdvantageEstimator = (batch, options) => {
  const { rewards, groups } = validateOutcomeBatch(batch);
  const eps = epsilonOf(options);
  const stats = groupStats(rewards, groups);
  return rewards.map((r, i) => {
    const s = stats.get(groups[i] as GroupKey) as GroupStats;
    return (r - s.mean) / (s.std + eps);
  });
};

/** Dr. GRPO (Liu et al. 2025): Â_i = r_i - mean_g, no std scaling. */
export const drGrpo: AdvantageEstimator = (batch) => {
  const { rewards, groups } = validateOutcomeBatch(batch);
  const stats = groupStats(rewards, groups);
  return rewards.map((r, i) => r - (stats.get(groups[i] as GroupKey) as GroupStats).mean);
};

/** RLOO (Ahmadian et al. 2024): Â_i = n/(n-1) (r_i - mean_g) = r_i - mean of the others; a group of one keeps r_i. */
export const rloo: AdvantageEstimator = (batch) => {
  const { rewards, groups } = validateOutcomeBatch(batch);
  const stats = groupStats(rewards, groups);
  return rewards.map((r, i) => {
    const s = stats.get(groups[i] as GroupKey) as GroupStats;
    if (s.count <= 1) return r;
    return (r * s.count) / (s.count - 1) - (s.mean * s.count) / (s.count - 1);
  });
};

/**
 * verl's masked_whiten over the batch's loss tokens, with every token of
 * trajectory i holding value v_i: mean = Σ L_i v_i / (Σ L_i + 1e-8), unbiased
 * variance (× N/(N-1), N = Σ L_i), out = (v - mean) / sqrt(var + 1e-8).
 */
function whitenOverTokens(values: Float64Array, lengths: Float64Array | null): Float64Array {
  const weight = (i: number) => (lengths ? (lengths[i] as number) : 1);
  let n = 0;
  let sum = 0;
  for (let i = 0; i < values.length; i++) {
    n += weight(i);
    sum += weight(i) * (values[i] as number);
  }
  if (n <= 1) {
    throw new ArpoError('INVALID_ARGUMENT', `Expected at least 2 loss tokens in the batch to whiten advantages but received ${n}`);
  }
  const mean = sum / (n + 1e-8);
  let sq = 0;
  for (let i = 0; i < values.length; i++) sq += weight(i) * ((values[i] as number) - mean) ** 2;
  const variance = (sq / (n + 1e-8)) * (n / (n - 1));
  const scale = 1 / Math.sqrt(variance + 1e-8);
  return values.map((v) => (v - mean) * scale);
}

/**
 * REINFORCE++ (Hu 2025) with an outcome reward and γ = 1: every token's
 * return is the trajectory's reward, whitened over all loss tokens of the batch.
 */
export const reinforcePlusPlus: AdvantageEstimator = (batch) => {
  const { rewards, lengths } = validateOutcomeBatch(batch);
  return whitenOverTokens(rewards, lengths);
};

/** REINFORCE++-baseline: subtract the group mean (a group of one: 0), then whiten over the batch's tokens. */
export const reinforcePlusPlusBaseline: AdvantageEstimator = (batch) => {
  const { rewards, groups, lengths } = validateOutcomeBatch(batch);
  const stats = groupStats(rewards, groups);
  return whitenOverTokens(rewards.map((r, i) => r - (stats.get(groups[i] as GroupKey) as GroupStats).mean), lengths);
};

const estimators = new Map<string, AdvantageEstimator>([
  ['grpo', grpo],
  ['dr-grpo', drGrpo],
  ['rloo', rloo],
  ['reinforce++', reinforcePlusPlus],
  ['reinforce++-baseline', reinforcePlusPlusBaseline],
]);

/** Adds a user estimator (an existing name needs `{ replace: true }`). */
export function registerAdvantageEstimator(name: string, fn: AdvantageEstimator, options: { replace?: boolean } = {}): void {
  if (typeof name !== 'string' || name.length === 0) throw invalidArgument('a non-empty estimator name', 'name', name);
  if (typeof fn !== 'function') throw invalidArgument('a function (batch, options) => Float64Array', 'fn', fn);
  if (estimators.has(name) && options.replace !== true) {
    throw new ArpoError('BAD_CONFIG', `An advantage estimator named ${JSON.stringify(name)} is already registered; pass { replace: true } to replace it`);
  }
  estimators.set(name, fn);
}

/** The estimator registered under `name`; unknown names list the known ones. */
export function getAdvantageEstimator(name: string): AdvantageEstimator {
  const fn = estimators.get(name);
  if (!fn) throw unknownName('advantage estimator', String(name), [...estimators.keys()]);
  return fn;
}

/**
 * Estimators whose advantage of a trajectory depends only on its own group's
 * rewards, so a data-parallel rank can compute them from its prompts alone.
 * Any other (reinforce++ whitens over the whole batch; a user estimator may
 * too) is computed over the gathered global batch.
 */
export const PER_GROUP_ESTIMATORS: ReadonlySet<string> = new Set(['grpo', 'dr-grpo', 'rloo']);

export function advantageEstimatorNames(): string[] {
  return [...estimators.keys()].sort();
}

/** Runs the named estimator: (B) advantages. */
export function computeAdvantages(name: string, batch: OutcomeBatch, options: EstimatorOptions = {}): Float64Array {
  const out = getAdvantageEstimator(name)(batch, options);
  if (!(out instanceof Float64Array) || out.length !== batch.rewards.length) {
    throw invalidArgument(`a Float64Array of ${batch.rewards.length} advantages`, `the result of estimator ${JSON.stringify(name)}`, out);
  }
  return out;
}
