// Policy-loss settings (ARPO.md section 4; verl actor config semantics),
// validated once and frozen. Field names match the kernel wrapper's camelCase
// names so a settings object can be passed straight to the fused loss.
import { invalidArgument, unknownName } from '../errors';

/** KL estimators to the reference policy (Schulman's k1/k2/k3, and |log ratio|). */
export const KL_TYPES = ['k1', 'k2', 'k3', 'abs'] as const;
export type KLType = (typeof KL_TYPES)[number];

/** verl's names for the same estimators. */
const KL_ALIASES: Readonly<Record<string, KLType>> = { kl: 'k1', mse: 'k2', low_var_kl: 'k3' };

/** Loss aggregation over tokens (verl agg_loss). */
export const AGGREGATIONS = ['token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum', 'seq-mean-token-sum-norm'] as const;
export type Aggregation = (typeof AGGREGATIONS)[number];

export interface PolicyLossSettings {
  /** ε_low: the ratio is clipped below at 1 - clipLow (verl clip_ratio_low; 0.2). */
  readonly clipLow: number;
  /** ε_high: the ratio is clipped above at 1 + clipHigh (verl clip_ratio_high; 0.2, DAPO 0.28). */
  readonly clipHigh: number;
  /** Dual-clip bound c for Â < 0 (Ye et al. 2020; verl clip_ratio_c = 3); 0 disables it. */
  readonly dualClipC: number;
  /** KL estimator to the reference policy (reference scripts: k3 = low_var_kl). */
  readonly klType: KLType;
  /** KL coefficient (reference scripts: 0, so no reference policy is needed). */
  readonly klCoef: number;
  /** Entropy bonus coefficient: loss -= entropyCoef · H (verl entropy_coeff; 0). */
  readonly entropyCoef: number;
  /** How per-token losses become one number (verl loss_agg_mode; token-mean). */
  readonly aggregation: Aggregation;
  /** Sampling temperature the logits are divided by (must match the rollout's). */
  readonly temperature: number;
  /** Divisor of seq-mean-token-sum-norm (Dr. GRPO: the maximum response length); required (> 0) there, else unused. */
  readonly normConstant: number;
}

export const DEFAULT_POLICY_LOSS: PolicyLossSettings = Object.freeze({
  clipLow: 0.2,
  clipHigh: 0.2,
  dualClipC: 3,
  klType: 'k3',
  klCoef: 0,
  entropyCoef: 0,
  aggregation: 'token-mean',
  temperature: 1,
  normConstant: 0,
});

const FIELDS = Object.keys(DEFAULT_POLICY_LOSS) as (keyof PolicyLossSettings)[];

function finite(value: unknown, name: string, what: string, ok: (x: number) => boolean): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || !ok(value)) throw invalidArgument(what, name, value);
  return value;
}

/**
 * Validates partial settings over the defaults and returns a frozen object.
 * Unknown fields, KL types and aggregations fail with the list of known names.
 */
export function policyLossSettings(input: Partial<Record<keyof PolicyLossSettings, unknown>> = {}): PolicyLossSettings {
  if (input === null || typeof input !== 'object' || Array.isArray(input)) throw invalidArgument('an object of policy-loss settings', 'settings', input);
  for (const key of Object.keys(input)) {
    if (!(FIELDS as string[]).includes(key)) throw unknownName('policy-loss setting', key, FIELDS);
  }
  const v = { ...DEFAULT_POLICY_LOSS, ...input } as Record<keyof PolicyLossSettings, unknown>;
  const clipLow = finite(v.clipLow, 'clipLow', 'a number in [0, 1)', (x) => x >= 0 && x < 1);
  const clipHigh = finite(v.clipHigh, 'clipHigh', 'a number >= 0', (x) => x >= 0);
  const dualClipC = finite(v.dualClipC, 'dualClipC', 'a number > 1, or 0 to disable the dual clip', (x) => x === 0 || x > 1);
  const klCoef = finite(v.klCoef, 'klCoef', 'a number >= 0', (x) => x >= 0);
  const entropyCoef = finite(v.entropyCoef, 'entropyCoef', 'a finite number', () => true);
  const temperature = finite(v.temperature, 'temperature', 'a number > 0', (x) => x > 0);
  const normConstant = finite(v.normConstant, 'normConstant', 'a number >= 0', (x) => x >= 0);
  if (typeof v.klType !== 'string') throw invalidArgument(`one of ${KL_TYPES.join(', ')}`, 'klType', v.klType);
  const klType = (KL_TYPES as readonly string[]).includes(v.klType) ? (v.klType as KLType) : KL_ALIASES[v.klType];
  if (!klType) throw unknownName('KL type', v.klType, [...KL_TYPES, ...Object.keys(KL_ALIASES)]);
  if (typeof v.aggregation !== 'string') throw invalidArgument(`one of ${AGGREGATIONS.join(', ')}`, 'aggregation', v.aggregation);
  if (!(AGGREGATIONS as readonly string[]).includes(v.aggregation)) throw unknownName('loss aggregation', v.aggregation, AGGREGATIONS);
  const aggregation = v.aggregation as Aggregation;
  if (aggregation === 'seq-mean-token-sum-norm' && normConstant === 0) {
    throw invalidArgument('a number > 0 with seq-mean-token-sum-norm (e.g. the maximum response length)', 'normConstant', v.normConstant);
  }
  return Object.freeze({ clipLow, clipHigh, dualClipC, klType, klCoef, entropyCoef, aggregation, temperature, normConstant });
}
