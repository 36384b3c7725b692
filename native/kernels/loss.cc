// CPU fused clipped-ratio policy loss, forward + backward (verl core_algos
// compute_policy_loss + agg_loss + kl_penalty, and the actor's entropy
// bonus). Fuses log_softmax -> gather -> ratio -> clip -> aggregation ->
// backward into two reads of each row; never materialises softmax, log-probs
// or a second (T, V) gradient buffer (grad may alias the float32 logits).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/parallel.h"
#include "kernels/row_stats.h"

namespace arpo {
namespace kernels {
namespace {

using detail::kNegInf;

std::string num(double v) { return std::to_string(v); }

void check_config(const PolicyLossConfig& c) {
  auto finite = [](double v) { return std::isfinite(v); };
  if (!finite(c.clip_low) || c.clip_low < 0) throw Error("policy_loss: clip_low must be finite and >= 0, got " + num(c.clip_low));
  if (!finite(c.clip_high) || c.clip_high < 0) throw Error("policy_loss: clip_high must be finite and >= 0, got " + num(c.clip_high));
  if (!finite(c.dual_clip_c)) throw Error("policy_loss: dual_clip_c must be finite (<= 1 disables), got " + num(c.dual_clip_c));
  if (!finite(c.kl_coef)) throw Error("policy_loss: kl_coef must be finite, got " + num(c.kl_coef));
  if (!finite(c.entropy_coef)) throw Error("policy_loss: entropy_coef must be finite, got " + num(c.entropy_coef));
  if (!finite(c.temperature) || !(c.temperature > 0))
    throw Error("policy_loss: temperature must be finite and > 0, got " + num(c.temperature));
  if (!finite(c.denominator) || c.denominator < 0)
    throw Error("policy_loss: denominator must be finite and >= 0 (0 = from the batch), got " + num(c.denominator));
  if (!finite(c.norm_constant) || c.norm_constant < 0)
    throw Error("policy_loss: norm_constant must be finite and >= 0, got " + num(c.norm_constant));
  if (!finite(c.grad_scale)) throw Error("policy_loss: grad_scale must be finite, got " + num(c.grad_scale));
  const int kl = static_cast<int>(c.kl_type), agg = static_cast<int>(c.aggregation);
  if (kl < 0 || kl > 3) throw Error("policy_loss: kl_type must be 0 (k1), 1 (k2), 2 (k3) or 3 (abs), got " + std::to_string(kl));
  if (agg < 0 || agg > 3) throw Error("policy_loss: aggregation must be 0..3, got " + std::to_string(agg));
}

// kl_penalty(logp, ref) of verl core_algos and its derivative d kl / d logp.
// torch.clamp passes the gradient on the closed interval, so do we.
inline void kl_penalty(KLType type, double logp, double ref, double* kl, double* dkl) {
  const double d = logp - ref;
  switch (type) {
    case KLType::K1: *kl = d; *dkl = 1; return;
    case KLType::K2: *kl = 0.5 * d * d; *dkl = d; return;
    case KLType::ABS: *kl = std::fabs(d); *dkl = d > 0 ? 1 : (d < 0 ? -1 : 0); return;
    case KLType::K3: {
      // low_var_kl (Schulman's k3): x = clamp(ref - logp, -20, 20); kld = exp(x) - x - 1, clamped to [-10, 10].
      const double x0 = -d, x = std::min(20.0, std::max(-20.0, x0));
      const double ex = std::exp(x), kld = ex - x - 1;
      *kl = std::min(10.0, std::max(-10.0, kld));
      const bool pass = x0 >= -20 && x0 <= 20 && kld >= -10 && kld <= 10;
      *dkl = pass ? -(ex - 1) : 0;  // d kld / d logp = (exp(x) - 1) * dx/dlogp, dx/dlogp = -1
      return;
    }
  }
  *kl = 0;
  *dkl = 0;
}

// One token of verl compute_policy_loss (vanilla + dual clip) at advantage A,
// with its autograd derivative d pg / d logp. torch.maximum / minimum split
// the gradient in half on ties; torch.clamp passes it on the closed interval.
struct PgTerm {
  double pg = 0, dpg = 0;
  double clip = 0;        // pg2 > pg1 (the ratio was clipped)
  double clip_lower = 0;  // A < 0 and the dual clip bound won
  double neg_kl = 0;      // clamp(logp - old_logp, -20, 20)
};
inline PgTerm pg_term(double A, double logp, double old_logp, const PolicyLossConfig& cfg) {
  PgTerm out;
  const double raw = logp - old_logp;
  const double neg_kl = std::min(20.0, std::max(-20.0, raw));
  const double dneg = (raw >= -20 && raw <= 20) ? 1.0 : 0.0;
  const double ratio = std::exp(neg_kl);
  const double lo = 1.0 - cfg.clip_low, hi = 1.0 + cfg.clip_high;
  const double pg1 = -A * ratio, pg2 = -A * std::min(hi, std::max(lo, ratio));
  const double d1 = -A * ratio * dneg, d2 = (ratio >= lo && ratio <= hi) ? d1 : 0.0;
  const double clipped = std::max(pg1, pg2);
  const double dclipped = pg1 > pg2 ? d1 : (pg1 < pg2 ? d2 : 0.5 * (d1 + d2));
  out.pg = clipped;
  out.dpg = dclipped;
  if (cfg.dual_clip_c > 1.0f && A < 0) {
    const double pg3 = -A * cfg.dual_clip_c;
    out.pg = std::min(pg3, clipped);
    out.dpg = clipped < pg3 ? dclipped : (clipped > pg3 ? 0.0 : 0.5 * dclipped);
    out.clip_lower = clipped > pg3 ? 1.0 : 0.0;
  }
  out.clip = pg2 > pg1 ? 1.0 : 0.0;
  out.neg_kl = neg_kl;
  return out;
}

// Per-token results kept in O(T) arrays so the final reduction runs in row
// order: the result is bit-identical for any thread count.
struct TokenTerms {
  std::vector<double> pg, kl, loss, clip, clip_lower, ppo_kl, ent;
  explicit TokenTerms(int64_t T) {
    for (auto* v : {&pg, &kl, &loss, &clip, &clip_lower, &ppo_kl, &ent}) v->assign(static_cast<size_t>(T), 0.0);
  }
};

// The result's sums in row order (deterministic), then the metrics as means
// over `tokens` (0 when there are none).
struct Totals {
  double loss = 0, pg_loss = 0, clip = 0, clip_lower = 0, ppo_kl = 0, ent = 0, kl = 0;
  void write(PolicyLossResult* result, double tokens, double grad_scale) const {
    result->loss = loss * grad_scale;
    result->pg_loss = pg_loss;
    result->tokens = tokens;
    if (tokens != 0) {
      result->pg_clipfrac = clip / tokens;
      result->pg_clipfrac_lower = clip_lower / tokens;
      result->ppo_kl = ppo_kl / tokens;
      result->entropy = ent / tokens;
      result->kl = kl / tokens;
    }
  }
};

// What one row contributes: d loss / d logp and d loss / d H (both already
// weighted and scaled), computed by the caller from the row's stats.
struct RowCoeffs {
  double logp = 0, dlogp = 0, dh = 0;
};

// The shared row loop of both loss kernels: per row, the stats pass, then
// `terms(t, logp, H)` -> RowCoeffs, then the gradient row
//   grad_j = [dlogp (1[j = target] - p_j) + dh (-p_j (log p_j + H))] / temperature.
// Chunking: a row (4V bytes, 608 KB for V = 151,936) is handled start to
// finish by one thread: read once for the stats, then read again and
// overwritten by its gradient while it is still in L2 (1-2 MB per core).
// Memory beyond the logits/grad: O(T) here and O(1) per thread.
template <typename Terms>
void loss_rows(float* grad, float* logprobs, float* entropy, const Logits& logits, const int32_t* targets,
               float temperature, Threads threads, const Terms& terms) {
  const int64_t T = logits.rows, V = logits.vocab;
  const float inv_t = 1.0f / temperature;
  parallel_for(T, resolve_threads(threads, T, std::max<int64_t>(1, (int64_t{1} << 16) / V)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      auto run = [&](const auto& row) {
        const detail::RowStats st = detail::row_stats(row, V, inv_t);
        const int32_t tg = targets[t];
        const float zt = tg >= 0 ? row(tg) * inv_t : 0.0f;
        double logp = 0;
        if (tg >= 0) logp = (zt == kNegInf || st.max == kNegInf) ? -HUGE_VAL : static_cast<double>(zt) - st.lse;
        if (logprobs) logprobs[t] = static_cast<float>(logp);
        if (entropy) entropy[t] = static_cast<float>(st.entropy);
        const double H = st.entropy;
        RowCoeffs c;
        if (tg >= 0) c = terms(t, logp, H);
        if (!grad) return;
        float* g = grad + t * V;
        if ((c.dlogp == 0 && c.dh == 0) || st.max == kNegInf) {
          std::fill(g, g + V, 0.0f);  // no gradient through this row (masked, ignored or all -inf)
          return;
        }
        // log p_j = (z_j - max) - (lse - max): both differences are small, so
        // no cancellation even for |z| ~ 1e4.
        const float m = st.max, lsm = static_cast<float>(st.lse - static_cast<double>(st.max));
        const float a = static_cast<float>(-c.dlogp * inv_t), ch = static_cast<float>(-c.dh * inv_t);
        const float h = static_cast<float>(H);
        using detail::vfloat;
        using detail::splat;
        const vfloat vinv = splat<vfloat>(inv_t), vm = splat<vfloat>(m), vlsm = splat<vfloat>(lsm),
                     va = splat<vfloat>(a), vc = splat<vfloat>(ch), vh = splat<vfloat>(h),
                     floor = splat<vfloat>(detail::kExpFloor);
        int64_t j = 0;
        for (; j + detail::kLanes <= V; j += detail::kLanes) {
          vfloat y = (row.load(j) * vinv - vm) - vlsm;
          y = y < floor ? floor : y;  // -inf -> p = 0 and p * (y + h) = 0
          const vfloat p = detail::exp_nonpos(y);
          const vfloat gj = va * p + vc * p * (y + vh);
          std::memcpy(g + j, &gj, sizeof gj);  // may overwrite the row just read (aliasing is fine: same j)
        }
        for (; j < V; ++j) {
          float y = (row(j) * inv_t - m) - lsm;
          y = y < detail::kExpFloor ? detail::kExpFloor : y;
          const float p = detail::exp_nonpos(y);
          g[j] = a * p + ch * p * (y + h);
        }
        g[tg] += static_cast<float>(c.dlogp * inv_t);
      };
      if (logits.dtype == DType::F32) run(detail::f32_row(logits, t));
      else run(detail::bf16_row(logits, t));
    }
  });
}

void check_common(const Logits& logits, const PolicyLossConfig& cfg, PolicyLossResult* result, float* grad,
                  const char* op) {
  detail::check_logits(logits, op);
  check_config(cfg);
  if (!result) throw Error(std::string(op) + ": result is null");
  if (grad && logits.dtype == DType::BF16 && static_cast<const void*>(grad) == logits.data)
    throw Error(std::string(op) + ": grad cannot alias bf16 logits (it is float32)");
}

}  // namespace

void policy_loss(PolicyLossResult* result, float* grad, float* logprobs, float* entropy, const Logits& logits,
                 const int32_t* targets, const float* old_logprobs, const float* advantages, const float* mask,
                 const int32_t* seq_ids, int64_t num_seqs, const float* ref_logprobs, const PolicyLossConfig& cfg,
                 Threads threads) {
  check_common(logits, cfg, result, grad, "policy_loss");
  *result = PolicyLossResult{};
  const int64_t T = logits.rows, V = logits.vocab;
  if (T == 0) return;
  if (!targets || !old_logprobs || !advantages || !mask)
    throw Error("policy_loss: targets, old_logprobs, advantages and mask are required (T = " + std::to_string(T) + ")");
  if (cfg.kl_coef != 0 && !ref_logprobs) throw Error("policy_loss: kl_coef = " + num(cfg.kl_coef) + " needs ref_logprobs");

  // ---- per-token aggregation weights w_t = d(aggregated loss) / d(loss_t); O(T), logits not needed.
  const Aggregation agg = cfg.aggregation;
  const bool per_seq = agg == Aggregation::SeqMeanTokenMean || agg == Aggregation::SeqMeanTokenSum;
  if (per_seq && cfg.denominator == 0 && num_seqs < 1)
    throw Error("policy_loss: num_seqs must be >= 1 for seq-mean aggregations, got " + std::to_string(num_seqs));
  if (agg == Aggregation::SeqMeanTokenMean && !seq_ids)
    throw Error("policy_loss: seq_ids are required for seq-mean-token-mean");
  if (agg == Aggregation::SeqMeanTokenSumNorm && cfg.denominator == 0 && !(cfg.norm_constant > 0))
    throw Error("policy_loss: norm_constant must be > 0 for seq-mean-token-sum-norm, got " + num(cfg.norm_constant));
  if (seq_ids && (num_seqs < 1 || num_seqs > (int64_t{1} << 30)))
    throw Error("policy_loss: num_seqs must be in [1, 2^30] with seq_ids, got " + std::to_string(num_seqs));
  double tokens = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float mt = mask[t];
    if (!std::isfinite(mt)) throw Error("policy_loss: mask[" + std::to_string(t) + "] = " + num(mt) + " is not finite");
    const int32_t tg = targets[t];
    if (tg >= V || (tg < 0 && mt != 0))
      throw Error("policy_loss: targets[" + std::to_string(t) + "] = " + std::to_string(tg) + " is outside [0, " +
                  std::to_string(V) + ")" + (tg < 0 ? " where mask is not 0" : ""));
    if (seq_ids && (seq_ids[t] < 0 || seq_ids[t] >= num_seqs))
      throw Error("policy_loss: seq_ids[" + std::to_string(t) + "] = " + std::to_string(seq_ids[t]) + " is outside [0, " +
                  std::to_string(num_seqs) + ")");
    tokens += mt;
  }
  std::vector<double> w(static_cast<size_t>(T), 0.0);
  if (agg == Aggregation::TokenMean) {
    const double D = cfg.denominator > 0 ? cfg.denominator : tokens;
    if (D != 0)
      for (int64_t t = 0; t < T; ++t) w[t] = mask[t] / D;
  } else if (agg == Aggregation::SeqMeanTokenMean) {
    // loss = (1/S) sum_s sum_{t in s} m_t l_t / sum_{t in s} m_t; a sequence with no mask contributes 0.
    std::vector<double> count(static_cast<size_t>(num_seqs), 0.0);
    for (int64_t t = 0; t < T; ++t) count[seq_ids[t]] += mask[t];
    const double S = cfg.denominator > 0 ? cfg.denominator : static_cast<double>(num_seqs);
    for (int64_t t = 0; t < T; ++t) {
      const double c = count[seq_ids[t]];
      w[t] = c != 0 ? mask[t] / (c * S) : 0.0;
    }
  } else if (agg == Aggregation::SeqMeanTokenSum) {
    const double S = cfg.denominator > 0 ? cfg.denominator : static_cast<double>(num_seqs);
    for (int64_t t = 0; t < T; ++t) w[t] = mask[t] / S;
  } else {
    const double N = cfg.denominator > 0 ? cfg.denominator : cfg.norm_constant;
    for (int64_t t = 0; t < T; ++t) w[t] = mask[t] / N;
  }

  // ---- per row: loss terms, d loss / d logp and d loss / d H, then the gradient row.
  TokenTerms terms(T);
  const double gs = cfg.grad_scale;
  loss_rows(grad, logprobs, entropy, logits, targets, cfg.temperature, threads, [&](int64_t t, double logp, double H) {
    const PgTerm p = pg_term(advantages[t], logp, old_logprobs[t], cfg);
    double kl = 0, dkl = 0;
    if (ref_logprobs) kl_penalty(cfg.kl_type, logp, ref_logprobs[t], &kl, &dkl);
    terms.pg[t] = p.pg;
    terms.kl[t] = kl;
    terms.loss[t] = p.pg + cfg.kl_coef * kl - cfg.entropy_coef * H;
    terms.clip[t] = p.clip;
    terms.clip_lower[t] = p.clip_lower;
    terms.ppo_kl[t] = -p.neg_kl;
    terms.ent[t] = H;
    RowCoeffs c;
    c.dlogp = w[t] * gs * (p.dpg + cfg.kl_coef * dkl);
    c.dh = w[t] * gs * -static_cast<double>(cfg.entropy_coef);
    return c;
  });

  // ---- reductions in row order (deterministic).
  Totals sum;
  for (int64_t t = 0; t < T; ++t) {
    const double mt = mask[t];
    if (mt == 0) continue;  // masked tokens may hold -inf terms; 0 * inf would be NaN
    sum.loss += w[t] * terms.loss[t];
    sum.pg_loss += w[t] * terms.pg[t];
    sum.clip += mt * terms.clip[t];
    sum.clip_lower += mt * terms.clip_lower[t];
    sum.ppo_kl += mt * terms.ppo_kl[t];
    sum.ent += mt * terms.ent[t];
    sum.kl += mt * terms.kl[t];
  }
  sum.write(result, tokens, gs);
}

void policy_loss_copies(PolicyLossResult* result, float* grad, float* logprobs, float* entropy, const Logits& logits,
                        const int32_t* targets, const float* old_logprobs, const TokenCopySums& sums, int64_t num_seqs,
                        const float* ref_logprobs, const PolicyLossConfig& cfg, Threads threads) {
  const char* op = "policy_loss_copies";
  check_common(logits, cfg, result, grad, op);
  *result = PolicyLossResult{};
  const int64_t T = logits.rows, V = logits.vocab;
  if (T == 0) return;
  if (!targets || !sums.adv_pos || !sums.adv_neg || !sums.weight || !sums.count_pos || !sums.count_neg || !sums.count)
    throw Error(std::string(op) + ": targets and every copy-sum array are required (T = " + std::to_string(T) + ")");
  if (cfg.kl_coef != 0 && !ref_logprobs) throw Error(std::string(op) + ": kl_coef = " + num(cfg.kl_coef) + " needs ref_logprobs");

  // ---- the aggregation's denominator (the per-copy weights already hold the rest of it).
  const Aggregation agg = cfg.aggregation;
  double tokens = 0;
  std::vector<char> live(static_cast<size_t>(T), 0);
  for (int64_t t = 0; t < T; ++t) {
    const double ap = sums.adv_pos[t], an = sums.adv_neg[t], wt = sums.weight[t];
    const double cp = sums.count_pos[t], cn = sums.count_neg[t], ct = sums.count[t];
    auto bad = [&](const char* name, double v, const char* want) {
      throw Error(std::string(op) + ": " + name + "[" + std::to_string(t) + "] = " + num(v) + " must be " + want);
    };
    if (!std::isfinite(ap) || ap < 0) bad("adv_pos", ap, "finite and >= 0");
    if (!std::isfinite(an) || an > 0) bad("adv_neg", an, "finite and <= 0");
    if (!std::isfinite(wt) || wt < 0) bad("weight", wt, "finite and >= 0");
    if (!std::isfinite(cp) || cp < 0) bad("count_pos", cp, "finite and >= 0");
    if (!std::isfinite(cn) || cn < 0) bad("count_neg", cn, "finite and >= 0");
    if (!std::isfinite(ct) || ct < 0) bad("count", ct, "finite and >= 0");
    live[t] = ap != 0 || an != 0 || wt != 0 || ct != 0;
    const int32_t tg = targets[t];
    if (tg >= V || (tg < 0 && live[t]))
      throw Error(std::string(op) + ": targets[" + std::to_string(t) + "] = " + std::to_string(tg) + " is outside [0, " +
                  std::to_string(V) + ")" + (tg < 0 ? " where the copy sums are not 0" : ""));
    tokens += ct;
  }
  double D = cfg.denominator;
  if (D == 0) {
    if (agg == Aggregation::TokenMean) D = tokens;
    else if (agg == Aggregation::SeqMeanTokenSumNorm) D = cfg.norm_constant;
    else D = static_cast<double>(num_seqs);
    if (agg == Aggregation::SeqMeanTokenSumNorm && !(D > 0))
      throw Error(std::string(op) + ": norm_constant must be > 0 for seq-mean-token-sum-norm, got " + num(cfg.norm_constant));
    if ((agg == Aggregation::SeqMeanTokenMean || agg == Aggregation::SeqMeanTokenSum) && num_seqs < 1)
      throw Error(std::string(op) + ": num_seqs must be >= 1 for seq-mean aggregations, got " + std::to_string(num_seqs));
  }
  const double inv_d = D != 0 ? 1.0 / D : 0.0;

  // ---- per row: the clipped term evaluated once at A = +1 and once at A = -1
  // (the flat kernel's own composition, so ties get its gradient), scaled by
  // the signed advantage sums of the row's copies.
  TokenTerms terms(T);
  const double gs = cfg.grad_scale;
  loss_rows(grad, logprobs, entropy, logits, targets, cfg.temperature, threads, [&](int64_t t, double logp, double H) {
    RowCoeffs c;
    if (!live[t]) return c;
    const double old = old_logprobs ? static_cast<double>(old_logprobs[t]) : logp;  // null: ratio 1
    const PgTerm up = pg_term(1.0, logp, old, cfg), down = pg_term(-1.0, logp, old, cfg);
    const double sp = sums.adv_pos[t] * inv_d, sn = -sums.adv_neg[t] * inv_d, wt = sums.weight[t] * inv_d;
    double kl = 0, dkl = 0;
    if (ref_logprobs) kl_penalty(cfg.kl_type, logp, ref_logprobs[t], &kl, &dkl);
    const double pg = sp * up.pg + sn * down.pg;  // sum over copies of w_i pg_i
    terms.pg[t] = pg;
    terms.loss[t] = pg + wt * (cfg.kl_coef * kl - cfg.entropy_coef * H);
    terms.clip[t] = sums.count_pos[t] * up.clip + sums.count_neg[t] * down.clip;
    terms.clip_lower[t] = sums.count_neg[t] * down.clip_lower;
    terms.ppo_kl[t] = sums.count[t] * -up.neg_kl;
    terms.ent[t] = sums.count[t] * H;
    terms.kl[t] = sums.count[t] * kl;
    c.dlogp = gs * (sp * up.dpg + sn * down.dpg + wt * cfg.kl_coef * dkl);
    c.dh = gs * wt * -static_cast<double>(cfg.entropy_coef);
    return c;
  });

  Totals sum;
  for (int64_t t = 0; t < T; ++t) {
    if (!live[t]) continue;
    sum.loss += terms.loss[t];
    sum.pg_loss += terms.pg[t];
    sum.clip += terms.clip[t];
    sum.clip_lower += terms.clip_lower[t];
    sum.ppo_kl += terms.ppo_kl[t];
    sum.ent += terms.ent[t];
    sum.kl += terms.kl[t];
  }
  sum.write(result, tokens, gs);
}

}  // namespace kernels
}  // namespace arpo
