// policy_loss against a plain double reference of verl's compute_policy_loss
// + agg_loss + kl_penalty + entropy bonus: loss, metrics, and the gradient
// both against central finite differences of the reference and against the
// reference's analytic form; every aggregation, dual clip, each KL type,
// entropy bonus, bf16, all options at once, in-place (aliased) gradient,
// thread-count independence and argument errors.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/kernels.h"
#include "test_util.h"

using namespace arpo::kernels;
using arpo_test::kInf;
using arpo_test::kInfF;
using arpo_test::Random;

namespace {

struct Batch {
  int64_t T = 0, V = 0, S = 0;
  std::vector<float> logits, old_lp, adv, mask, ref_lp;
  std::vector<int32_t> targets, seq;
};

// Random batch with ratios spread over [~0.5, ~2] so clipping is exercised.
Batch make_batch(uint64_t seed, int64_t T, int64_t V, int64_t S) {
  Random r(seed);
  Batch b;
  b.T = T;
  b.V = V;
  b.S = S;
  b.logits = arpo_test::random_logits(r, T, V, 2.0);
  b.targets.resize(T);
  b.old_lp.resize(T);
  b.adv.resize(T);
  b.mask.resize(T);
  b.ref_lp.resize(T);
  b.seq.resize(T);
  for (int64_t t = 0; t < T; ++t) {
    b.targets[t] = static_cast<int32_t>(r.integer(0, V - 1));
    const auto ref = arpo_test::ref_row(b.logits.data() + t * V, V, 1.0f);
    b.old_lp[t] = static_cast<float>(ref.logp(b.targets[t]) + 0.4 * r.normal());
    b.ref_lp[t] = static_cast<float>(ref.logp(b.targets[t]) + 0.3 * r.normal());
    b.adv[t] = static_cast<float>(r.normal());
    b.mask[t] = r.uniform() < 0.8 ? 1.0f : 0.0f;
    if (t % 3 == 1) {
      // ratio e^1.5 ~ 4.5 with A < 0: beyond the dual-clip bound c = 3.
      b.old_lp[t] = static_cast<float>(ref.logp(b.targets[t]) - 1.5);
      b.adv[t] = -std::fabs(b.adv[t]) - 0.1f;
      b.mask[t] = 1.0f;
    }
    b.seq[t] = static_cast<int32_t>(t * S / T);
  }
  return b;
}

// ---- the plain reference, all double, straight from verl's formulas.
double kl_ref(KLType type, double lp, double ref) {
  const double d = lp - ref;
  switch (type) {
    case KLType::K1: return d;
    case KLType::K2: return 0.5 * d * d;
    case KLType::ABS: return std::fabs(d);
    case KLType::K3: {
      const double kl = std::min(20.0, std::max(-20.0, ref - lp));
      return std::min(10.0, std::max(-10.0, std::exp(kl) - kl - 1));
    }
  }
  return 0;
}

struct RefOut {
  double loss = 0, pg_loss = 0, clipfrac = 0, clipfrac_lower = 0, ppo_kl = 0, entropy = 0, kl = 0, tokens = 0;
  std::vector<double> logp, ent;
};

RefOut ref_loss(const Batch& b, const std::vector<double>& x, const PolicyLossConfig& c, bool with_ref) {
  const int64_t T = b.T, V = b.V;
  RefOut o;
  o.logp.assign(T, 0);
  o.ent.assign(T, 0);
  std::vector<double> loss_t(T, 0), pg_t(T, 0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> z(V);
    double m = -kInf;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, z[j] = x[t * V + j] / c.temperature);
    double s = 0;
    for (double v : z) s += std::exp(v - m);
    const double lse = m + std::log(s);
    double h = 0;
    for (double v : z)
      if (v != -kInf) h -= std::exp(v - lse) * (v - lse);
    o.ent[t] = h;
    if (b.targets[t] < 0) continue;
    const double lp = z[b.targets[t]] - lse;
    o.logp[t] = lp;
    const double A = b.adv[t];
    const double neg_kl = std::min(20.0, std::max(-20.0, lp - b.old_lp[t]));
    const double ratio = std::exp(neg_kl);
    const double pg1 = -A * ratio;
    const double pg2 = -A * std::min(1.0 + c.clip_high, std::max(1.0 - c.clip_low, ratio));
    const double clipped = std::max(pg1, pg2);
    double pg = clipped;
    if (c.dual_clip_c > 1 && A < 0) {
      const double pg3 = -A * c.dual_clip_c;
      pg = std::min(pg3, clipped);
      o.clipfrac_lower += b.mask[t] * (clipped > pg3 ? 1 : 0);
    }
    o.clipfrac += b.mask[t] * (pg2 > pg1 ? 1 : 0);
    o.ppo_kl += b.mask[t] * -neg_kl;
    const double kl = with_ref ? kl_ref(c.kl_type, lp, b.ref_lp[t]) : 0.0;
    o.kl += b.mask[t] * kl;
    pg_t[t] = pg;
    loss_t[t] = pg + c.kl_coef * kl - c.entropy_coef * h;
  }
  // agg_loss
  double tokens = 0;
  for (int64_t t = 0; t < T; ++t) tokens += b.mask[t];
  o.tokens = tokens;
  auto aggregate = [&](const std::vector<double>& l) {
    double r = 0;
    if (c.aggregation == Aggregation::TokenMean) {
      const double D = c.denominator > 0 ? c.denominator : tokens;
      for (int64_t t = 0; t < T; ++t) r += D > 0 ? l[t] * b.mask[t] / D : 0;
    } else if (c.aggregation == Aggregation::SeqMeanTokenSumNorm) {
      const double N = c.denominator > 0 ? c.denominator : c.norm_constant;
      for (int64_t t = 0; t < T; ++t) r += l[t] * b.mask[t] / N;
    } else {
      const double S = c.denominator > 0 ? c.denominator : static_cast<double>(b.S);
      for (int64_t s = 0; s < b.S; ++s) {
        double sum = 0, cnt = 0;
        for (int64_t t = 0; t < T; ++t)
          if (b.seq[t] == s) {
            sum += l[t] * b.mask[t];
            cnt += b.mask[t];
          }
        if (c.aggregation == Aggregation::SeqMeanTokenMean) r += cnt > 0 ? sum / cnt / S : 0;
        else r += sum / S;
      }
    }
    return r;
  };
  o.loss = aggregate(loss_t) * c.grad_scale;
  o.pg_loss = aggregate(pg_t);
  if (tokens > 0) {
    o.clipfrac /= tokens;
    o.clipfrac_lower /= tokens;
    o.ppo_kl /= tokens;
    o.kl /= tokens;
    double e = 0;
    for (int64_t t = 0; t < T; ++t) e += b.mask[t] * o.ent[t];
    o.entropy = e / tokens;
  }
  return o;
}

struct KernelOut {
  PolicyLossResult r;
  std::vector<float> grad, logp, ent;
};

KernelOut run_kernel(const Batch& b, const PolicyLossConfig& c, bool with_ref, int threads, bool bf16 = false) {
  KernelOut o;
  o.grad.assign(b.T * b.V, 123.0f);  // poison: every entry must be written
  o.logp.resize(b.T);
  o.ent.resize(b.T);
  std::vector<uint16_t> h;
  Logits lg{b.logits.data(), DType::F32, b.T, b.V};
  if (bf16) {
    for (float v : b.logits) h.push_back(arpo_test::to_bf16(v));
    lg = Logits{h.data(), DType::BF16, b.T, b.V};
  }
  policy_loss(&o.r, o.grad.data(), o.logp.data(), o.ent.data(), lg, b.targets.data(), b.old_lp.data(), b.adv.data(),
              b.mask.data(), b.seq.data(), b.S, with_ref ? b.ref_lp.data() : nullptr, c, threads);
  return o;
}

// Full check of one configuration: loss/metrics vs the reference, gradient vs
// central differences of the reference (h = 1e-5 in double).
void check_config(const std::string& name, Batch b, const PolicyLossConfig& c, bool with_ref, bool bf16 = false) {
  if (bf16)  // the reference sees the bf16-rounded values
    for (auto& v : b.logits) v = arpo_test::from_bf16(arpo_test::to_bf16(v));
  std::vector<double> x(b.logits.begin(), b.logits.end());
  const RefOut ref = ref_loss(b, x, c, with_ref);
  const KernelOut k = run_kernel(b, c, with_ref, 2, bf16);
  CHECK_CLOSE(k.r.loss, ref.loss, 1e-6, 1e-5);
  CHECK_CLOSE(k.r.pg_loss, ref.pg_loss, 1e-6, 1e-5);
  CHECK_CLOSE(k.r.pg_clipfrac, ref.clipfrac, 1e-9, 0);
  CHECK_CLOSE(k.r.pg_clipfrac_lower, ref.clipfrac_lower, 1e-9, 0);
  CHECK_CLOSE(k.r.ppo_kl, ref.ppo_kl, 1e-6, 1e-5);
  CHECK_CLOSE(k.r.entropy, ref.entropy, 1e-6, 1e-5);
  CHECK_CLOSE(k.r.kl, ref.kl, 1e-6, 1e-5);
  CHECK_CLOSE(k.r.tokens, ref.tokens, 0, 0);
  CHECK_ARRAY(name + " logprobs", k.logp.data(), ref.logp.data(), b.T, 2e-6, 1e-5);
  CHECK_ARRAY(name + " entropy", k.ent.data(), ref.ent.data(), b.T, 2e-6, 1e-5);
  std::vector<double> fd(b.T * b.V);
  const double h = 1e-5;
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double up = ref_loss(b, x, c, with_ref).loss;
    x[i] = x0 - h;
    const double dn = ref_loss(b, x, c, with_ref).loss;
    x[i] = x0;
    fd[i] = (up - dn) / (2 * h);
  }
  double gmax = 0;
  for (double g : fd) gmax = std::max(gmax, std::fabs(g));
  CHECK_ARRAY(name + " grad vs finite differences", k.grad.data(), fd.data(), b.T * b.V, 2e-5 * gmax + 1e-7, 1e-3);
}

void test_configs() {
  const Batch b = make_batch(11, 9, 37, 3);  // odd shape
  const char* agg_names[] = {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"};
  for (int agg = 0; agg < 4; ++agg)
    for (const float dual : {3.0f, 0.0f}) {
      PolicyLossConfig c;
      c.aggregation = static_cast<Aggregation>(agg);
      c.dual_clip_c = dual;
      c.norm_constant = 16;
      check_config(std::string(agg_names[agg]) + (dual > 1 ? " dual" : ""), b, c, false);
      const KernelOut k = run_kernel(b, c, false, 1);
      CHECK(k.r.pg_clipfrac > 0 && (dual <= 1 || k.r.pg_clipfrac_lower > 0));  // clip and dual clip exercised
    }
  const char* kl_names[] = {"k1", "k2", "k3", "abs"};
  for (int kl = 0; kl < 4; ++kl) {
    PolicyLossConfig c;
    c.kl_type = static_cast<KLType>(kl);
    c.kl_coef = 0.3f;
    check_config(std::string("kl ") + kl_names[kl], b, c, true);
  }
  PolicyLossConfig ent;
  ent.entropy_coef = 0.05f;
  check_config("entropy bonus", b, ent, false);
  // Every non-default option at once, with bf16 logits.
  PolicyLossConfig all;
  all.clip_low = 0.15f;
  all.clip_high = 0.28f;
  all.dual_clip_c = 2.5f;
  all.kl_type = KLType::K3;
  all.kl_coef = 0.2f;
  all.entropy_coef = 0.01f;
  all.aggregation = Aggregation::SeqMeanTokenMean;
  all.temperature = 0.7f;
  all.denominator = 5;
  all.grad_scale = 0.5f;
  check_config("every option f32", b, all, true);
  check_config("every option bf16", b, all, true, true);
}

void test_alias_threads_extremes() {
  Batch b = make_batch(12, 13, 517, 4);
  // A row with -inf logits (banned tokens) and an ignored (masked) target.
  for (int64_t j = 0; j < b.V; j += 3)
    if (j != b.targets[2]) b.logits[2 * b.V + j] = -kInfF;
  b.targets[5] = -1;
  b.mask[5] = 0;
  PolicyLossConfig c;
  c.entropy_coef = 0.02f;
  c.aggregation = Aggregation::SeqMeanTokenMean;
  const KernelOut a = run_kernel(b, c, false, 1);
  for (int threads : {2, 3, 0}) {
    const KernelOut k = run_kernel(b, c, false, threads);
    CHECK(k.grad == a.grad && k.r.loss == a.r.loss && k.r.entropy == a.r.entropy && k.logp == a.logp);
  }
  bool zero_at_inf = true, masked_zero = true;
  for (int64_t j = 0; j < b.V; j += 3)
    if (j != b.targets[2]) zero_at_inf = zero_at_inf && a.grad[2 * b.V + j] == 0.0f;
  for (int64_t j = 0; j < b.V; ++j) masked_zero = masked_zero && a.grad[5 * b.V + j] == 0.0f;
  CHECK(zero_at_inf);
  CHECK(masked_zero);
  CHECK(a.logp[5] == 0.0f);
  // Analytic reference of the whole gradient on this bigger shape.
  std::vector<double> x(b.logits.begin(), b.logits.end());
  const RefOut ref = ref_loss(b, x, c, false);
  CHECK_CLOSE(a.r.loss, ref.loss, 1e-6, 1e-5);
  // In place: grad written over the float32 logits equals the separate buffer bit for bit.
  Batch inplace = b;
  PolicyLossResult r;
  policy_loss(&r, inplace.logits.data(), nullptr, nullptr, Logits{inplace.logits.data(), DType::F32, b.T, b.V},
              b.targets.data(), b.old_lp.data(), b.adv.data(), b.mask.data(), b.seq.data(), b.S, nullptr, c, 2);
  CHECK(inplace.logits == a.grad);
  CHECK(r.loss == a.r.loss);
}

void test_errors_and_edges() {
  Batch b = make_batch(13, 4, 10, 2);
  PolicyLossConfig c;
  PolicyLossResult r;
  auto call = [&](const Batch& bb, const PolicyLossConfig& cc, const float* ref = nullptr) {
    policy_loss(&r, nullptr, nullptr, nullptr, Logits{bb.logits.data(), DType::F32, bb.T, bb.V}, bb.targets.data(),
                bb.old_lp.data(), bb.adv.data(), bb.mask.data(), bb.seq.data(), bb.S, ref, cc, 1);
  };
  Batch bad = b;
  bad.targets[1] = 10;
  CHECK_THROWS(call(bad, c), "targets[1] = 10 is outside [0, 10)");
  bad = b;
  bad.targets[2] = -1;
  bad.mask[2] = 1;
  CHECK_THROWS(call(bad, c), "targets[2] = -1 is outside [0, 10) where mask is not 0");
  bad = b;
  bad.seq[3] = 7;
  CHECK_THROWS(call(bad, c), "seq_ids[3] = 7 is outside [0, 2)");
  PolicyLossConfig cc = c;
  cc.temperature = std::nanf("");
  CHECK_THROWS(call(b, cc), "temperature must be finite and > 0");
  cc = c;
  cc.clip_low = -0.1f;
  CHECK_THROWS(call(b, cc), "clip_low must be finite and >= 0");
  cc = c;
  cc.aggregation = Aggregation::SeqMeanTokenSumNorm;
  CHECK_THROWS(call(b, cc), "norm_constant must be > 0");
  cc = c;
  cc.kl_coef = 0.1f;
  CHECK_THROWS(call(b, cc), "needs ref_logprobs");
  cc = c;
  cc.aggregation = static_cast<Aggregation>(9);
  CHECK_THROWS(call(b, cc), "aggregation must be 0..3, got 9");
  // T = 0: zero result; all masked: loss 0, metrics 0, zero gradient.
  Batch empty;
  empty.V = 5;
  r.loss = 7;
  policy_loss(&r, nullptr, nullptr, nullptr, Logits{nullptr, DType::F32, 0, 5}, nullptr, nullptr, nullptr, nullptr, nullptr,
              0, nullptr, c, 1);
  CHECK(r.loss == 0 && r.tokens == 0);
  Batch masked = b;
  std::fill(masked.mask.begin(), masked.mask.end(), 0.0f);
  const KernelOut k = run_kernel(masked, c, false, 1);
  CHECK(k.r.loss == 0 && k.r.tokens == 0 && k.r.entropy == 0);
  CHECK(std::all_of(k.grad.begin(), k.grad.end(), [](float g) { return g == 0.0f; }));
}

// policy_loss_copies against the flat kernel: every row of a "tree" batch
// stands for 1-4 copies with their own advantage (some exactly 0) and mask
// weight (1, or 1/d as hard attribution gives); the flat batch repeats the
// row once per copy. The copy kernel must give the flat loss, metrics and the
// sum of the copies' gradient rows, for every aggregation the sums express
// directly and every loss option.
void test_copies_against_flat() {
  Random r(31);
  const int64_t T = 23, V = 37;  // odd on purpose
  const Batch rows = make_batch(41, T, V, 1);
  std::vector<int64_t> copies(T);
  Batch flat;
  flat.V = V;
  std::vector<int64_t> first(T);
  std::vector<double> ap(T, 0), an(T, 0), wt(T, 0), cp(T, 0), cn(T, 0), ct(T, 0);
  for (int64_t t = 0; t < T; ++t) {
    copies[t] = r.integer(1, 4);
    first[t] = flat.T;
    const bool hard = r.uniform() < 0.3;
    const double masked = t % 7 == 3 ? 0.0 : 1.0;  // some rows are context: every copy masked
    for (int64_t i = 0; i < copies[t]; ++i) {
      const double u = r.uniform();
      const float A = u < 0.15 ? 0.0f : (t % 3 == 1 ? -static_cast<float>(0.1 + r.uniform()) : static_cast<float>(r.normal()));
      const float m = static_cast<float>(masked * (hard ? 1.0 / static_cast<double>(copies[t]) : 1.0));
      flat.logits.insert(flat.logits.end(), rows.logits.begin() + t * V, rows.logits.begin() + (t + 1) * V);
      flat.targets.push_back(rows.targets[t]);
      flat.old_lp.push_back(rows.old_lp[t]);
      flat.ref_lp.push_back(rows.ref_lp[t]);
      flat.adv.push_back(A);
      flat.mask.push_back(m);
      flat.seq.push_back(static_cast<int32_t>(flat.T % 5));
      ++flat.T;
      if (A > 0) ap[t] += static_cast<double>(m) * A, cp[t] += m;
      if (A < 0) an[t] += static_cast<double>(m) * A, cn[t] += m;
      wt[t] += m;
      ct[t] += m;
    }
  }
  flat.S = 5;
  TokenCopySums sums{ap.data(), an.data(), wt.data(), cp.data(), cn.data(), ct.data()};

  PolicyLossConfig plain;
  PolicyLossConfig every;
  every.clip_low = 0.1f;
  every.clip_high = 0.28f;
  every.dual_clip_c = 2.0f;
  every.kl_coef = 0.3f;
  every.entropy_coef = 0.01f;
  every.temperature = 0.7f;
  every.grad_scale = 0.5f;
  std::vector<PolicyLossConfig> configs = {plain, every};
  for (KLType kt : {KLType::K1, KLType::K2, KLType::ABS}) {
    PolicyLossConfig c = every;
    c.kl_type = kt;
    c.dual_clip_c = 0.0f;  // dual clip off
    configs.push_back(c);
  }
  for (Aggregation agg : {Aggregation::TokenMean, Aggregation::SeqMeanTokenSum, Aggregation::SeqMeanTokenSumNorm}) {
    for (PolicyLossConfig c : configs) {
      c.aggregation = agg;
      c.norm_constant = 17.0;
      const bool ref = c.kl_coef != 0;
      const Logits lf{flat.logits.data(), DType::F32, flat.T, V};
      std::vector<float> gf(flat.logits.size());
      PolicyLossResult rf;
      policy_loss(&rf, gf.data(), nullptr, nullptr, lf, flat.targets.data(), flat.old_lp.data(), flat.adv.data(),
                  flat.mask.data(), flat.seq.data(), flat.S, ref ? flat.ref_lp.data() : nullptr, c, 1);
      const Logits lt{rows.logits.data(), DType::F32, T, V};
      std::vector<float> gt(rows.logits.size());
      PolicyLossResult rt;
      policy_loss_copies(&rt, gt.data(), nullptr, nullptr, lt, rows.targets.data(), rows.old_lp.data(), sums, flat.S,
                         ref ? rows.ref_lp.data() : nullptr, c, 2);
      CHECK_CLOSE(rt.loss, rf.loss, 1e-9, 1e-6);
      CHECK_CLOSE(rt.pg_loss, rf.pg_loss, 1e-9, 1e-6);
      CHECK_CLOSE(rt.tokens, rf.tokens, 0, 1e-12);
      CHECK_CLOSE(rt.pg_clipfrac, rf.pg_clipfrac, 1e-12, 1e-9);
      CHECK_CLOSE(rt.pg_clipfrac_lower, rf.pg_clipfrac_lower, 1e-12, 1e-9);
      CHECK_CLOSE(rt.ppo_kl, rf.ppo_kl, 1e-9, 1e-6);
      CHECK_CLOSE(rt.entropy, rf.entropy, 1e-9, 1e-6);
      CHECK_CLOSE(rt.kl, rf.kl, 1e-9, 1e-6);
      std::vector<double> want(rows.logits.size(), 0.0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < copies[t]; ++i)
          for (int64_t j = 0; j < V; ++j) want[t * V + j] += gf[(first[t] + i) * V + j];
      CHECK_ARRAY("copies grad", gt.data(), want.data(), T * V, 1e-7, 1e-5);
    }
  }
  // SFT form: old_logprobs null is ratio 1, so with A = +1 on every copy the
  // gradient is -W d logp / d z: the flat kernel at old = its own logp.
  PolicyLossConfig c;
  std::vector<float> lp(T);
  const Logits lt{rows.logits.data(), DType::F32, T, V};
  logits_stats(nullptr, nullptr, nullptr, lp.data(), lt, rows.targets.data(), 1.0f, 1);
  std::vector<double> pos(ct), zero(T, 0.0);
  TokenCopySums sft{pos.data(), zero.data(), ct.data(), ct.data(), zero.data(), ct.data()};
  std::vector<float> g1(rows.logits.size()), g2(rows.logits.size()), ones(T, 1.0f), m(T);
  for (int64_t t = 0; t < T; ++t) m[t] = static_cast<float>(ct[t]);
  PolicyLossResult r1, r2;
  policy_loss_copies(&r1, g1.data(), nullptr, nullptr, lt, rows.targets.data(), nullptr, sft, 1, nullptr, c, 1);
  policy_loss(&r2, g2.data(), nullptr, nullptr, lt, rows.targets.data(), lp.data(), ones.data(), m.data(), nullptr, 1,
              nullptr, c, 1);
  std::vector<double> g2d(g2.begin(), g2.end());
  CHECK_ARRAY("ratio-1 grad", g1.data(), g2d.data(), T * V, 1e-6, 1e-4);
  CHECK_CLOSE(r1.pg_loss, -1.0, 0, 1e-12);  // -sum W / D with D = sum count = sum W
  // Bad sums name the array, the row and the value.
  std::vector<double> bad = ap;
  bad[4] = -1.0;
  TokenCopySums bs = sums;
  bs.adv_pos = bad.data();
  PolicyLossResult rr;
  CHECK_THROWS(policy_loss_copies(&rr, nullptr, nullptr, nullptr, lt, rows.targets.data(), rows.old_lp.data(), bs, 5,
                                  nullptr, plain, 1),
               "adv_pos[4] = -1.000000 must be finite and >= 0");
  std::vector<int32_t> tg = rows.targets;
  tg[0] = -1;
  ct[0] = 1;
  CHECK_THROWS(policy_loss_copies(&rr, nullptr, nullptr, nullptr, lt, tg.data(), rows.old_lp.data(), sums, 5, nullptr,
                                  plain, 1),
               "targets[0] = -1 is outside [0, 37) where the copy sums are not 0");
}

}  // namespace

int main() {
  test_copies_against_flat();
  test_configs();
  test_alias_threads_extremes();
  test_errors_and_edges();
  return arpo_test::summary();
}
