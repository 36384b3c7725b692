// Advantage estimators against loop-based references written from verl's
// core_algos (token-level tensors, response masks, masked_whiten) in float64.
import { advantageEstimatorNames, computeAdvantages, getAdvantageEstimator, registerAdvantageEstimator } from '../../lib/algo';
import { mulberry32 as rng } from '../../lib/random';


interface Batch {
  rewards: number[];
  groups: number[];
  lengths: number[];
}

/** Random batch: groups of 1..8 trajectories, rewards from the deep-research reward's support, lengths 1..40. */
function randomBatch(seed: number): Batch {
  const r = rng(seed);
  const b: Batch = { rewards: [], groups: [], lengths: [] };
  const nGroups = 1 + Math.floor(r() * 6);
  for (let g = 0; g < nGroups; g++) {
    const size = 1 + Math.floor(r() * 8);
    for (let k = 0; k < size; k++) {
      const u = r();
      b.rewards.push(u < 0.2 ? -1 : u < 0.4 ? 0 : u < 0.5 ? 1.1 : Math.round(r() * 100) / 100);
      b.groups.push(g * 7 + 3); // non-contiguous ids, as verl's uids are
      b.lengths.push(1 + Math.floor(r() * 40));
    }
  }
  // Interleave groups as a real batch does.
  const order = b.rewards.map((_, i) => i).sort((i, j) => ((i * 7919) % 13) - ((j * 7919) % 13) || i - j);
  return { rewards: order.map((i) => b.rewards[i] as number), groups: order.map((i) => b.groups[i] as number), lengths: order.map((i) => b.lengths[i] as number) };
}

/** verl's token_level_rewards (reward on the last valid token) and response_mask, right-padded. */
function tokenTensors(b: Batch): { rewards: number[][]; mask: number[][] } {
  const width = Math.max(...b.lengths) + 3;
  const rewards = b.lengths.map((len, i) => Array.from({ length: width }, (_, t) => (t === len - 1 ? (b.rewards[i] as number) : 0)));
  const mask = b.lengths.map((len) => Array.from({ length: width }, (_, t) => (t < len ? 1 : 0)));
  return { rewards, mask };
}

/** compute_grpo_outcome_advantage (norm_adv_by_std_in_grpo true/false), per trajectory. */
function refGrpo(b: Batch, normByStd: boolean, eps = 1e-6): number[] {
  const { rewards } = tokenTensors(b);
  const scores = rewards.map((row) => row.reduce((s, x) => s + x, 0));
  const id2score = new Map<number, number[]>();
  scores.forEach((s, i) => id2score.set(b.groups[i] as number, [...(id2score.get(b.groups[i] as number) ?? []), s]));
  const mean = new Map<number, number>();
  const std = new Map<number, number>();
  for (const [id, list] of id2score) {
    if (list.length === 1) {
      mean.set(id, 0);
      std.set(id, 1);
    } else {
      const m = list.reduce((s, x) => s + x, 0) / list.length;
      mean.set(id, m);
      std.set(id, Math.sqrt(list.reduce((s, x) => s + (x - m) ** 2, 0) / (list.length - 1))); // torch.std: unbiased
    }
  }
  return scores.map((s, i) => {
    const id = b.groups[i] as number;
    return normByStd ? (s - (mean.get(id) as number)) / ((std.get(id) as number) + eps) : s - (mean.get(id) as number);
  });
}

/** compute_rloo_outcome_advantage. */
function refRloo(b: Batch): number[] {
  const scores = b.rewards.slice();
  const id2score = new Map<number, number[]>();
  scores.forEach((s, i) => id2score.set(b.groups[i] as number, [...(id2score.get(b.groups[i] as number) ?? []), s]));
  return scores.map((s, i) => {
    const list = id2score.get(b.groups[i] as number) as number[];
    const n = list.length;
    if (n <= 1) return s;
    const m = list.reduce((x, y) => x + y, 0) / n;
    return (s * n) / (n - 1) - (m * n) / (n - 1);
  });
}

/** verl_F.masked_whiten over a (B, T) matrix. */
function maskedWhiten(values: number[][], mask: number[][]): number[][] {
  let sum = 0;
  let n = 0;
  values.forEach((row, i) => row.forEach((v, t) => ((sum += v * (mask[i]?.[t] ?? 0)), (n += mask[i]?.[t] ?? 0))));
  const mean = sum / (n + 1e-8);
  let sq = 0;
  values.forEach((row, i) => row.forEach((v, t) => (sq += (v - mean) ** 2 * (mask[i]?.[t] ?? 0))));
  const variance = (sq / (n + 1e-8)) * (n / (n - 1));
  return values.map((row) => row.map((v) => (v - mean) / Math.sqrt(variance + 1e-8)));
}

/** compute_reinforce_plus_plus_outcome_advantage (γ = 1): per-token returns, whitened; token 0 of each row. */
function refReinforcePP(b: Batch, gamma = 1): number[] {
  const { rewards, mask } = tokenTensors(b);
  const width = rewards[0]?.length ?? 0;
  const returns = rewards.map((row) => row.map(() => 0));
  let running = rewards.map(() => 0);
  for (let t = width - 1; t >= 0; t--) {
    running = running.map((r, i) => (rewards[i]?.[t] ?? 0) + gamma * r);
    running.forEach((r, i) => ((returns[i] as number[])[t] = r));
    running = running.map((r, i) => r * (mask[i]?.[t] ?? 0));
  }
  const adv = maskedWhiten(returns, mask).map((row, i) => row.map((v, t) => v * (mask[i]?.[t] ?? 0)));
  // Every valid token of a trajectory carries the same advantage; check that, then return it.
  adv.forEach((row, i) => row.forEach((v, t) => t < (b.lengths[i] as number) && expect(v).toBeCloseTo(row[0] as number, 12)));
  return adv.map((row) => row[0] as number);
}

/** compute_reinforce_plus_plus_baseline_outcome_advantage. */
function refReinforcePPBaseline(b: Batch): number[] {
  const { mask } = tokenTensors(b);
  const centred = refGrpo(b, false);
  const tiled = centred.map((s, i) => (mask[i] as number[]).map((m) => s * m));
  return maskedWhiten(tiled, mask).map((row) => row[0] as number);
}

function expectClose(got: Float64Array, want: number[]): void {
  expect(got.length).toBe(want.length);
  const bad: string[] = [];
  want.forEach((w, i) => {
    const g = got[i] as number;
    if (!(Math.abs(g - w) <= 1e-9 + 1e-9 * Math.abs(w))) bad.push(`[${i}] got ${g} want ${w}`);
  });
  expect(bad.slice(0, 5)).toEqual([]);
}

describe('advantage estimators match verl core_algos loops', () => {
  const seeds = Array.from({ length: 25 }, (_, i) => 1000 + i);
  test.each(seeds)('seed %i', (seed) => {
    const b = randomBatch(seed);
    const batch = { rewards: b.rewards, groups: b.groups, responseLengths: b.lengths };
    expectClose(computeAdvantages('grpo', batch), refGrpo(b, true));
    expectClose(computeAdvantages('dr-grpo', batch), refGrpo(b, false));
    expectClose(computeAdvantages('rloo', batch), refRloo(b));
    expectClose(computeAdvantages('reinforce++', batch), refReinforcePP(b));
    expectClose(computeAdvantages('reinforce++-baseline', batch), refReinforcePPBaseline(b));
  });

  test('GRPO by hand: group [1, 0, 0, 1] and a group of one', () => {
    // mean 0.5, unbiased std sqrt(1/3); the lone trajectory gets r / (1 + ε).
    const adv = computeAdvantages('grpo', { rewards: [1, 0, 0, 1, 0.7], groups: ['a', 'a', 'a', 'a', 'b'] });
    const s = Math.sqrt(1 / 3);
    expectClose(adv, [0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6), 0.7 / (1 + 1e-6)]);
    // Equal rewards: std 0, advantage 0 (not NaN).
    expectClose(computeAdvantages('grpo', { rewards: [1, 1, 1], groups: [0, 0, 0] }), [0, 0, 0]);
  });

  test('RLOO is the reward minus the mean of the other trajectories', () => {
    const r = [0.2, 1, -1, 0.5];
    const adv = computeAdvantages('rloo', { rewards: r, groups: [0, 0, 0, 0] });
    expectClose(adv, r.map((x, i) => x - (r.reduce((s, y) => s + y, 0) - x) / 3));
  });

  test('bad input names the field and value', () => {
    expect(() => computeAdvantages('grpo', { rewards: [1, NaN], groups: [0, 0] })).toThrow('Expected a finite number for rewards[1] but received NaN of type number');
    expect(() => computeAdvantages('grpo', { rewards: [1, 2], groups: [0] })).toThrow(/for groups but received Array\(1\)/);
    expect(() => computeAdvantages('reinforce++', { rewards: [1], groups: [0] })).toThrow(/at least 2 loss tokens/);
    expect(() => computeAdvantages('gae', { rewards: [1], groups: [0] })).toThrow('Unknown advantage estimator "gae"; known: dr-grpo, grpo, reinforce++, reinforce++-baseline, rloo');
  });

  test('a user estimator can be registered, not silently replaced', () => {
    registerAdvantageEstimator('sign', (b) => Float64Array.from(Array.from(b.rewards, (x) => Math.sign(x))));
    expect(Array.from(computeAdvantages('sign', { rewards: [-2, 0, 3], groups: [0, 0, 0] }))).toEqual([-1, 0, 1]);
    expect(advantageEstimatorNames()).toContain('sign');
    expect(() => registerAdvantageEstimator('grpo', getAdvantageEstimator('rloo'))).toThrow(/already registered/);
  });
});
