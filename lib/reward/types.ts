// The shape every reward shares: one decoded response (plus its ground truth)
// in, a score with the parts that explain it out.

/** What a reward sees for one trajectory (verl's compute_score arguments). */
export interface RewardInput {
  /** The decoded response (the reference decodes with skip_special_tokens). */
  readonly response: string;
  /** The ground truth answer, or several acceptable ones. */
  readonly groundTruth: string | readonly string[];
  /** Dataset tag (`data_source`), e.g. `DR_grpo_mix`. */
  readonly dataSource?: string;
  /** Task kind (`ability`): `math`, `qa`, or absent. */
  readonly ability?: string | null;
  /** Anything else a custom reward wants (the row's extra_info, tool stats, ...). */
  readonly extraInfo?: Readonly<Record<string, unknown>>;
}

/** A reward's verdict. `score` is what the advantage estimator consumes. */
export interface RewardResult {
  readonly score: number;
  /** Whether the format check passed (false means the -1 branch). */
  readonly formatOk: boolean;
  /** The accuracy part (F1, 0/1 equivalence, ...) before any bonus; 0 on bad format. */
  readonly accuracy: number;
  /** The extracted final answer ('' when none). */
  readonly answer: string;
  /** Human-readable reason, as the reference logs it. */
  readonly reason: string;
}

/** A reward function. Built-ins are synchronous; user rewards may be async. */
export type RewardFn = (input: RewardInput) => RewardResult | number | Promise<RewardResult | number>;

/** Format checker: ok plus the reason when not. */
export interface FormatVerdict {
  readonly ok: boolean;
  readonly reason: string;
}
