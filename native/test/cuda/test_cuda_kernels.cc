// CUDA kernels vs the CPU kernels (native/kernels) on fresh random inputs:
// every output poisoned first (NaN / -1), f32 and bf16, sizes that do and do
// not divide the vector width and block size, V = 151,936, clusters of 1..8,
// and bad input that must throw with the CPU's wording. Exits 77 (ctest
// "skipped") when no CUDA device is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/kernels_cuda.h"
#include "kernels/kernels.h"
#include "test/check.h"

namespace {

using arpo::kernels::DType;
using arpo::kernels::Logits;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

// Device copy of a host vector, poisoned or uploaded; freed on scope exit.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    cuda_ok(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)), "cudaMalloc");
    poison();
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) { upload(v); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void poison() { cuda_ok(cudaMemset(p, 0xff, std::max<size_t>(1, n) * sizeof(T)), "cudaMemset"); }  // NaN / -1
  void upload(const std::vector<T>& v) {
    cuda_ok(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> get() const {
    std::vector<T> v(n);
    cuda_ok(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }
};

std::mt19937_64 rng(20261202);

uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// LLM-like logits: a normal bulk, a few strong peaks, occasional -inf (masked vocabulary).
std::vector<float> random_logits(int64_t T, int64_t V, float scale, bool with_neg_inf) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::uniform_int_distribution<int64_t> pick(0, V - 1);
  std::vector<float> x(static_cast<size_t>(T * V));
  for (auto& v : x) v = normal(rng);
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < 3; ++i) x[t * V + pick(rng)] += 4.0f * scale;
    if (with_neg_inf)
      for (int i = 0; i < 5 && V > 8; ++i) x[t * V + pick(rng)] = -INFINITY;
  }
  return x;
}

// Logits in both dtypes: host buffers for the CPU kernel, device for CUDA.
struct TestLogits {
  int64_t T, V;
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  Dev<float>* d32 = nullptr;
  Dev<uint16_t>* d16 = nullptr;
  TestLogits(int64_t T_, int64_t V_, DType dt, std::vector<float> x) : T(T_), V(V_), dtype(dt), f32(std::move(x)) {
    if (dtype == DType::BF16) {
      bf16.resize(f32.size());
      for (size_t i = 0; i < f32.size(); ++i) bf16[i] = to_bf16(f32[i]);
      d16 = new Dev<uint16_t>(bf16);
    } else {
      d32 = new Dev<float>(f32);
    }
  }
  ~TestLogits() {
    delete d32;
    delete d16;
  }
  Logits host() const { return Logits{dtype == DType::F32 ? static_cast<const void*>(f32.data()) : bf16.data(), dtype, T, V}; }
  Logits dev() const { return Logits{dtype == DType::F32 ? static_cast<const void*>(d32->p) : d16->p, dtype, T, V}; }
};

const char* name_of(DType d) { return d == DType::F32 ? "f32" : "bf16"; }

// ||out - ref|| / ||ref|| (METHOD.md): float32 arithmetic lands far under 1e-3.
template <typename A, typename B>
double rel_error(const std::vector<A>& out, const std::vector<B>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i], o = out[i];
    if (std::isinf(r) && o == r) continue;
    num += (o - r) * (o - r);
    den += r * r;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// ---------------------------------------------------------------- 1. logits_stats
void test_stats(int64_t T, int64_t V, DType dt, float temperature, const arpo::cuda::Tuning& tuning) {
  arpo::cuda::set_tuning(tuning);
  TestLogits lg(T, V, dt, random_logits(T, V, 2.5f, true));
  if (T > 2)  // one fully masked row: lse -inf, entropy 0, target logprob -inf
    for (int64_t j = 0; j < V; ++j) {
      lg.f32[1 * V + j] = -INFINITY;
      if (dt == DType::BF16) lg.bf16[1 * V + j] = to_bf16(-INFINITY);
    }
  if (dt == DType::F32) lg.d32->upload(lg.f32);
  else lg.d16->upload(lg.bf16);
  std::vector<int32_t> targets(T);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  for (int64_t t = 0; t < T; ++t) targets[t] = (t % 7 == 3) ? -1 : tok(rng);
  std::vector<float> lse(T), ent(T), entn(T), tlp(T);
  arpo::kernels::logits_stats(lse.data(), ent.data(), entn.data(), tlp.data(), lg.host(), targets.data(), temperature, 1);
  Dev<int32_t> d_t(targets);
  Dev<float> d_lse(T), d_ent(T), d_entn(T), d_tlp(T);
  arpo::cuda::logits_stats(d_lse.p, d_ent.p, d_entn.p, d_tlp.p, lg.dev(), d_t.p, temperature, nullptr);
  const std::string tag = std::string("stats ") + name_of(dt) + " T=" + std::to_string(T) + " V=" + std::to_string(V) +
                          " cluster=" + std::to_string(tuning.stats_cluster) + " threads=" + std::to_string(tuning.stats_threads);
  const auto g_lse = d_lse.get(), g_ent = d_ent.get(), g_entn = d_entn.get(), g_tlp = d_tlp.get();
  CHECK_ARRAY(tag + " logsumexp", g_lse.data(), lse.data(), T, 1e-5, 2e-6);
  CHECK_ARRAY(tag + " entropy", g_ent.data(), ent.data(), T, 3e-5, 1e-5);
  CHECK_ARRAY(tag + " entropy_norm", g_entn.data(), entn.data(), T, 3e-6, 1e-5);
  CHECK_ARRAY(tag + " target_logprob", g_tlp.data(), tlp.data(), T, 2e-5, 2e-6);
  const double e1 = rel_error(g_lse, lse), e2 = rel_error(g_ent, ent);
  arpo_test::report(e1 < 1e-5 && e2 < 1e-5, __FILE__, __LINE__,
                    tag + " relative errors " + std::to_string(e1) + ", " + std::to_string(e2));
  arpo::cuda::set_tuning(arpo::cuda::Tuning{});
}

void test_stats_errors() {
  TestLogits lg(4, 100, DType::F32, random_logits(4, 100, 1.0f, false));
  Dev<int32_t> d_t(std::vector<int32_t>{1, 2, 100, 3});
  Dev<float> d_lse(4), d_tlp(4);
  CHECK_THROWS(arpo::cuda::logits_stats(d_lse.p, nullptr, nullptr, d_tlp.p, lg.dev(), d_t.p, 1.0f, nullptr),
               "targets[2] = 100 is outside the vocabulary [0, 100)");
  const auto lse = d_lse.get();
  CHECK(std::isnan(lse[0]) && std::isnan(lse[3]));  // rejected call wrote nothing
  CHECK_THROWS(arpo::cuda::logits_stats(d_lse.p, nullptr, nullptr, nullptr, lg.dev(), nullptr, 0.0f, nullptr),
               "temperature must be finite and > 0");
  Logits bad = lg.dev();
  bad.vocab = 0;
  CHECK_THROWS(arpo::cuda::logits_stats(d_lse.p, nullptr, nullptr, nullptr, bad, nullptr, 1.0f, nullptr), "vocab (V) must be >= 1");
  arpo::cuda::Tuning tu;
  tu.stats_cluster = 9;
  CHECK_THROWS(arpo::cuda::set_tuning(tu), "stats_cluster must be 0 or in [1, 8], got 9");
}

// ---------------------------------------------------------------- 2. sample_tokens
void test_sample(int64_t T, int64_t V, DType dt, arpo::kernels::SamplingParams p, float scale) {
  TestLogits lg(T, V, dt, random_logits(T, V, scale, true));
  std::vector<uint64_t> streams(T);
  std::vector<int64_t> positions(T);
  for (int64_t t = 0; t < T; ++t) {
    streams[t] = rng() % 1000;
    positions[t] = static_cast<int64_t>(rng() % 5000);
  }
  std::vector<int32_t> tok(T);
  std::vector<float> lp(T), ent(T), entn(T);
  arpo::kernels::sample_tokens(tok.data(), lp.data(), ent.data(), entn.data(), lg.host(), streams.data(), positions.data(), p, 1);
  Dev<uint64_t> d_s(streams);
  Dev<int64_t> d_p(positions);
  Dev<int32_t> d_tok(T);
  Dev<float> d_lp(T), d_ent(T), d_entn(T);
  arpo::cuda::sample_tokens(d_tok.p, d_lp.p, d_ent.p, d_entn.p, lg.dev(), d_s.p, d_p.p, p, nullptr);
  const std::string tag = std::string("sample ") + name_of(dt) + " T=" + std::to_string(T) + " V=" + std::to_string(V) +
                          " temp=" + std::to_string(p.temperature) + " top_k=" + std::to_string(p.top_k) +
                          " top_p=" + std::to_string(p.top_p);
  const auto g_tok = d_tok.get();
  CHECK_ARRAY(tag + " tokens", g_tok.data(), tok.data(), T, 0, 0);
  const auto g_lp = d_lp.get(), g_ent = d_ent.get(), g_entn = d_entn.get();
  CHECK_ARRAY(tag + " logprob", g_lp.data(), lp.data(), T, 2e-5, 2e-6);
  CHECK_ARRAY(tag + " entropy", g_ent.data(), ent.data(), T, 3e-5, 1e-5);
  CHECK_ARRAY(tag + " entropy_norm", g_entn.data(), entn.data(), T, 3e-6, 1e-5);
}

void test_sample_edges() {
  // A row of all -inf gives token 0 with logprob -inf; a NaN row throws.
  const int64_t V = 50;
  std::vector<float> x(2 * V, -INFINITY);
  for (int64_t j = 0; j < V; ++j) x[V + j] = static_cast<float>(j % 7);
  TestLogits lg(2, V, DType::F32, x);
  Dev<uint64_t> d_s(std::vector<uint64_t>{1, 2});
  Dev<int64_t> d_p(std::vector<int64_t>{0, 0});
  Dev<int32_t> d_tok(2);
  Dev<float> d_lp(2);
  arpo::kernels::SamplingParams p;
  p.temperature = 0.0f;
  arpo::cuda::sample_tokens(d_tok.p, d_lp.p, nullptr, nullptr, lg.dev(), d_s.p, d_p.p, p, nullptr);
  const auto tok = d_tok.get();
  const auto lp = d_lp.get();
  CHECK(tok[0] == 0 && lp[0] == -INFINITY);
  CHECK(tok[1] == 6);  // greedy: lowest index among the ties at 6
  x[V + 3] = NAN;
  lg.d32->upload(x);
  p.temperature = 1.0f;
  CHECK_THROWS(arpo::cuda::sample_tokens(d_tok.p, nullptr, nullptr, nullptr, lg.dev(), d_s.p, d_p.p, p, nullptr),
               "logits row 1 contains NaN or +inf");
  CHECK_THROWS(arpo::cuda::sample_tokens(d_tok.p, nullptr, nullptr, nullptr, lg.dev(), nullptr, nullptr, p, nullptr),
               "streams and positions are required");
}

// ---------------------------------------------------------------- 3. policy_loss
struct LossCase {
  int64_t T, V, S;
  DType dtype;
  arpo::kernels::PolicyLossConfig cfg;
  bool in_place;    // grad aliases the float32 logits
  bool with_grad;
  const char* what;
};

void test_loss(const LossCase& c, const arpo::cuda::Tuning& tuning) {
  arpo::cuda::set_tuning(tuning);
  const int64_t T = c.T, V = c.V;
  TestLogits lg(T, V, c.dtype, random_logits(T, V, 2.0f, true));
  std::vector<int32_t> targets(T), seq(T);
  std::vector<float> mask(T), adv(T), old_lp(T), ref_lp(T);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> cur(T);
  for (int64_t t = 0; t < T; ++t) targets[t] = tok(rng);
  arpo::kernels::logits_stats(nullptr, nullptr, nullptr, cur.data(), lg.host(), targets.data(), c.cfg.temperature, 1);
  for (int64_t t = 0; t < T; ++t) {
    seq[t] = static_cast<int32_t>((t * c.S) / T);
    mask[t] = (t % 5 == 2) ? 0.0f : 1.0f;
    if (mask[t] == 0 && t % 2 == 0) targets[t] = -1;  // ignored token (allowed where mask is 0)
    adv[t] = normal(rng);
    // Ratios spread around 1 so both clip sides and the dual clip are hit.
    old_lp[t] = std::isfinite(cur[t]) ? cur[t] + 0.4f * normal(rng) : -5.0f;
    ref_lp[t] = std::isfinite(cur[t]) ? cur[t] + 0.3f * normal(rng) : -5.0f;
  }
  arpo::kernels::PolicyLossResult ref{}, out{};
  std::vector<float> grad_ref(c.with_grad ? T * V : 0), lp_ref(T), ent_ref(T);
  arpo::kernels::policy_loss(&ref, c.with_grad ? grad_ref.data() : nullptr, lp_ref.data(), ent_ref.data(), lg.host(),
                             targets.data(), old_lp.data(), adv.data(), mask.data(), seq.data(), c.S, ref_lp.data(), c.cfg, 1);
  Dev<int32_t> d_t(targets), d_seq(seq);
  Dev<float> d_mask(mask), d_adv(adv), d_old(old_lp), d_ref(ref_lp), d_lp(T), d_ent(T);
  Dev<float> d_grad(c.with_grad && !c.in_place ? T * V : 0);
  float* grad = !c.with_grad ? nullptr : c.in_place ? lg.d32->p : d_grad.p;
  arpo::cuda::policy_loss(&out, grad, d_lp.p, d_ent.p, lg.dev(), d_t.p, d_old.p, d_adv.p, d_mask.p, d_seq.p, c.S, d_ref.p,
                          c.cfg, nullptr);
  const std::string tag = std::string("loss ") + c.what + " " + name_of(c.dtype) + " T=" + std::to_string(T) +
                          " V=" + std::to_string(V) + " cluster=" + std::to_string(tuning.loss_cluster);
  const double r[] = {ref.loss, ref.pg_loss, ref.pg_clipfrac, ref.pg_clipfrac_lower, ref.ppo_kl, ref.entropy, ref.kl, ref.tokens};
  const double o[] = {out.loss, out.pg_loss, out.pg_clipfrac, out.pg_clipfrac_lower, out.ppo_kl, out.entropy, out.kl, out.tokens};
  CHECK_ARRAY(tag + " result{loss,pg_loss,clipfrac,clipfrac_lower,ppo_kl,entropy,kl,tokens}", o, r, 8, 2e-6, 2e-5);
  const auto g_lp = d_lp.get(), g_ent = d_ent.get();
  CHECK_ARRAY(tag + " logprobs", g_lp.data(), lp_ref.data(), T, 2e-5, 2e-6);
  CHECK_ARRAY(tag + " entropy", g_ent.data(), ent_ref.data(), T, 3e-5, 1e-5);
  if (c.with_grad) {
    const std::vector<float> g = c.in_place ? lg.d32->get() : d_grad.get();
    double gmax = 0;
    for (float v : grad_ref) gmax = std::max(gmax, static_cast<double>(std::fabs(v)));
    CHECK_ARRAY(tag + " grad", g.data(), grad_ref.data(), T * V, 1e-5 * gmax, 1e-4);
    const double e = rel_error(g, grad_ref);
    arpo_test::report(e < 1e-5, __FILE__, __LINE__, tag + " grad relative error " + std::to_string(e));
  }
  arpo::cuda::set_tuning(arpo::cuda::Tuning{});
}

void test_loss_errors() {
  const int64_t T = 6, V = 40;
  TestLogits lg(T, V, DType::F32, random_logits(T, V, 1.0f, false));
  std::vector<int32_t> targets = {1, 2, 3, 4, 5, 6}, seq = {0, 0, 0, 1, 1, 1};
  std::vector<float> mask(T, 1.0f), zeros(T, 0.0f), old_lp(T, -3.0f);
  Dev<int32_t> d_t(targets), d_seq(seq);
  Dev<float> d_mask(mask), d_adv(zeros), d_old(old_lp), d_grad(T * V);
  arpo::kernels::PolicyLossConfig cfg;
  arpo::kernels::PolicyLossResult res;
  auto call = [&]() {
    arpo::cuda::policy_loss(&res, d_grad.p, nullptr, nullptr, lg.dev(), d_t.p, d_old.p, d_adv.p, d_mask.p, d_seq.p, 2,
                            nullptr, cfg, nullptr);
  };
  targets[4] = 40;
  d_t.upload(targets);
  CHECK_THROWS(call(), "targets[4] = 40 is outside [0, 40)");
  targets[4] = -1;
  d_t.upload(targets);
  CHECK_THROWS(call(), "targets[4] = -1 is outside [0, 40) where mask is not 0");
  targets[4] = 5;
  d_t.upload(targets);
  mask[2] = NAN;
  d_mask.upload(mask);
  CHECK_THROWS(call(), "mask[2] = nan is not finite");
  mask[2] = 1.0f;
  d_mask.upload(mask);
  seq[5] = 2;
  d_seq.upload(seq);
  CHECK_THROWS(call(), "seq_ids[5] = 2 is outside [0, 2)");
  const auto g = d_grad.get();
  CHECK(std::all_of(g.begin(), g.end(), [](float v) { return std::isnan(v); }));  // rejected calls wrote nothing
  cfg.kl_coef = 0.1f;
  CHECK_THROWS(call(), "needs ref_logprobs");
  cfg.kl_coef = 0;
  cfg.clip_low = -1;
  CHECK_THROWS(call(), "clip_low must be finite and >= 0");
}

// ---------------------------------------------------------------- 3b. policy_loss_copies
// Rows standing for several copies: random signed copy sums (a third of the
// rows all-zero context, some with target -1), with and without old
// log-probs, vs the CPU kernel.
void test_loss_copies(int64_t T, int64_t V, DType dt, arpo::kernels::PolicyLossConfig cfg, bool with_old, int64_t S,
                      const char* what) {
  TestLogits lg(T, V, dt, random_logits(T, V, 2.0f, true));
  std::vector<int32_t> targets(T);
  std::vector<float> old_lp(T), ref_lp(T), cur(T);
  std::vector<double> ap(T), an(T), w(T), cp(T), cn(T), ct(T);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  std::uniform_int_distribution<int> copies(1, 6);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t t = 0; t < T; ++t) targets[t] = tok(rng);
  arpo::kernels::logits_stats(nullptr, nullptr, nullptr, cur.data(), lg.host(), targets.data(), cfg.temperature, 1);
  for (int64_t t = 0; t < T; ++t) {
    old_lp[t] = std::isfinite(cur[t]) ? cur[t] + 0.4f * static_cast<float>(normal(rng)) : -5.0f;
    ref_lp[t] = std::isfinite(cur[t]) ? cur[t] + 0.3f * static_cast<float>(normal(rng)) : -5.0f;
    if (t % 3 == 1) {  // context row
      if (t % 2) targets[t] = -1;
      continue;
    }
    const int d = copies(rng);
    for (int i = 0; i < d; ++i) {
      const double wi = 1.0 / (1 + i), Ai = normal(rng), mi = 1.0;
      (Ai > 0 ? ap[t] : an[t]) += wi * Ai;
      (Ai > 0 ? cp[t] : cn[t]) += mi;
      w[t] += wi;
      ct[t] += mi;
    }
  }
  const arpo::kernels::TokenCopySums host{ap.data(), an.data(), w.data(), cp.data(), cn.data(), ct.data()};
  arpo::kernels::PolicyLossResult ref{}, out{};
  std::vector<float> grad_ref(T * V), lp_ref(T), ent_ref(T);
  arpo::kernels::policy_loss_copies(&ref, grad_ref.data(), lp_ref.data(), ent_ref.data(), lg.host(), targets.data(),
                                    with_old ? old_lp.data() : nullptr, host, S, ref_lp.data(), cfg, 1);
  Dev<int32_t> d_t(targets);
  Dev<float> d_old(old_lp), d_ref(ref_lp), d_lp(T), d_ent(T), d_grad(T * V);
  Dev<double> d_ap(ap), d_an(an), d_w(w), d_cp(cp), d_cn(cn), d_ct(ct);
  const arpo::kernels::TokenCopySums dev{d_ap.p, d_an.p, d_w.p, d_cp.p, d_cn.p, d_ct.p};
  arpo::cuda::policy_loss_copies(&out, d_grad.p, d_lp.p, d_ent.p, lg.dev(), d_t.p, with_old ? d_old.p : nullptr, dev, S,
                                 d_ref.p, cfg, nullptr);
  const std::string tag = std::string("loss copies ") + what + " " + name_of(dt) + " T=" + std::to_string(T) +
                          " V=" + std::to_string(V);
  const double r[] = {ref.loss, ref.pg_loss, ref.pg_clipfrac, ref.pg_clipfrac_lower, ref.ppo_kl, ref.entropy, ref.kl, ref.tokens};
  const double o[] = {out.loss, out.pg_loss, out.pg_clipfrac, out.pg_clipfrac_lower, out.ppo_kl, out.entropy, out.kl, out.tokens};
  CHECK_ARRAY(tag + " result{loss,pg_loss,clipfrac,clipfrac_lower,ppo_kl,entropy,kl,tokens}", o, r, 8, 2e-6, 2e-5);
  const auto g_lp = d_lp.get(), g_ent = d_ent.get(), g = d_grad.get();
  CHECK_ARRAY(tag + " logprobs", g_lp.data(), lp_ref.data(), T, 2e-5, 2e-6);
  CHECK_ARRAY(tag + " entropy", g_ent.data(), ent_ref.data(), T, 3e-5, 1e-5);
  double gmax = 0;
  for (float v : grad_ref) gmax = std::max(gmax, static_cast<double>(std::fabs(v)));
  CHECK_ARRAY(tag + " grad", g.data(), grad_ref.data(), T * V, 1e-5 * gmax, 1e-4);
  const double e = rel_error(g, grad_ref);
  arpo_test::report(e < 1e-5, __FILE__, __LINE__, tag + " grad relative error " + std::to_string(e));
}

void test_loss_copies_errors() {
  const int64_t T = 4, V = 30;
  TestLogits lg(T, V, DType::F32, random_logits(T, V, 1.0f, false));
  std::vector<int32_t> targets = {1, 2, 3, 4};
  std::vector<double> ap = {1, 0, 0.5, 0}, an = {0, -1, 0, 0}, w = {1, 1, 1, 0}, cp = {1, 0, 1, 0}, cn = {0, 1, 0, 0},
                      ct = {1, 1, 1, 0};
  Dev<int32_t> d_t(targets);
  Dev<double> d_ap(ap), d_an(an), d_w(w), d_cp(cp), d_cn(cn), d_ct(ct);
  Dev<float> d_grad(T * V);
  arpo::kernels::PolicyLossConfig cfg;
  arpo::kernels::PolicyLossResult res;
  const arpo::kernels::TokenCopySums dev{d_ap.p, d_an.p, d_w.p, d_cp.p, d_cn.p, d_ct.p};
  auto call = [&]() { arpo::cuda::policy_loss_copies(&res, d_grad.p, nullptr, nullptr, lg.dev(), d_t.p, nullptr, dev, 1, nullptr, cfg, nullptr); };
  an[1] = 0.5;
  d_an.upload(an);
  CHECK_THROWS(call(), "policy_loss_copies (cuda): adv_neg[1] = 0.500000 must be finite and <= 0");
  an[1] = -1;
  d_an.upload(an);
  w[2] = NAN;
  d_w.upload(w);
  CHECK_THROWS(call(), "weight[2] = nan must be finite and >= 0");
  w[2] = 1;
  d_w.upload(w);
  targets[0] = -1;
  d_t.upload(targets);
  CHECK_THROWS(call(), "targets[0] = -1 is outside [0, 30) where the copy sums are not 0");
  targets[0] = 1;
  targets[3] = -1;  // a context row (all sums 0) may have no target
  d_t.upload(targets);
  const auto g0 = d_grad.get();
  CHECK(std::all_of(g0.begin(), g0.end(), [](float v) { return std::isnan(v); }));  // rejected calls wrote nothing
  call();
  CHECK(res.tokens == 3);
}

// ---------------------------------------------------------------- 4. tree kernels
void test_entropy_delta() {
  const int64_t T = 3000, S = 200;
  std::vector<float> ent(T);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& v : ent) v = u(rng);
  std::vector<int64_t> starts(S), ends(S);
  std::vector<int32_t> base(S);
  for (int64_t i = 0; i < S; ++i) {
    starts[i] = static_cast<int64_t>(rng() % T);
    ends[i] = std::min<int64_t>(T, starts[i] + static_cast<int64_t>(rng() % 60));
    base[i] = static_cast<int32_t>(i % 4 == 0 ? -1 : static_cast<int64_t>(rng() % S));
  }
  std::vector<float> wm(S), dl(S);
  std::vector<int32_t> wc(S);
  arpo::kernels::entropy_delta(wm.data(), wc.data(), dl.data(), ent.data(), T, starts.data(), ends.data(), base.data(), S, 20);
  Dev<float> d_ent(ent), d_wm(S), d_dl(S);
  Dev<int64_t> d_st(starts), d_en(ends);
  Dev<int32_t> d_b(base), d_wc(S);
  arpo::cuda::entropy_delta(d_wm.p, d_wc.p, d_dl.p, d_ent.p, T, d_st.p, d_en.p, d_b.p, S, 20, nullptr);
  const auto g_wm = d_wm.get(), g_dl = d_dl.get();
  const auto g_wc = d_wc.get();
  CHECK_ARRAY("entropy_delta window_mean (bit-identical)", g_wm.data(), wm.data(), S, 0, 0);
  CHECK_ARRAY("entropy_delta window_count", g_wc.data(), wc.data(), S, 0, 0);
  CHECK_ARRAY("entropy_delta delta (bit-identical)", g_dl.data(), dl.data(), S, 0, 0);
  ends[7] = T + 1;
  d_en.upload(ends);
  CHECK_THROWS(arpo::cuda::entropy_delta(d_wm.p, d_wc.p, d_dl.p, d_ent.p, T, d_st.p, d_en.p, d_b.p, S, 20, nullptr),
               "segment 7 = [");
  CHECK_THROWS(arpo::cuda::entropy_delta(d_wm.p, d_wc.p, d_dl.p, d_ent.p, T, d_st.p, d_en.p, d_b.p, S, 0, nullptr),
               "k must be >= 1, got 0");
}

void test_tree() {
  const int64_t N = 700, L = 400, P = 20000;
  std::vector<int32_t> parent(N), leaf(L);
  for (int64_t n = 0; n < N; ++n) parent[n] = (n < 3 || rng() % 50 == 0) ? -1 : static_cast<int32_t>(rng() % n);
  std::vector<float> adv(L);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t l = 0; l < L; ++l) {
    leaf[l] = static_cast<int32_t>(rng() % N);
    adv[l] = normal(rng);
  }
  std::vector<float> sum(N), mean(N);
  std::vector<int32_t> count(N);
  arpo::kernels::tree_reduce(sum.data(), mean.data(), count.data(), parent.data(), N, leaf.data(), adv.data(), L);
  Dev<int32_t> d_par(parent), d_leaf(leaf), d_count(N);
  Dev<float> d_adv(adv), d_sum(N), d_mean(N);
  arpo::cuda::tree_reduce(d_sum.p, d_mean.p, d_count.p, d_par.p, N, d_leaf.p, d_adv.p, L, nullptr);
  const auto g_sum = d_sum.get(), g_mean = d_mean.get();
  const auto g_count = d_count.get();
  // Sums are accumulated in double in another order: equal after rounding to float up to 1 ulp.
  CHECK_ARRAY("tree_reduce node_sum", g_sum.data(), sum.data(), N, 1e-6, 2e-7);
  CHECK_ARRAY("tree_reduce node_mean", g_mean.data(), mean.data(), N, 1e-6, 2e-7);
  CHECK_ARRAY("tree_reduce node_count", g_count.data(), count.data(), N, 0, 0);
  parent[10] = 10;
  d_par.upload(parent);
  CHECK_THROWS(arpo::cuda::tree_reduce(d_sum.p, d_mean.p, d_count.p, d_par.p, N, d_leaf.p, d_adv.p, L, nullptr),
               "parent[10] = 10 must be -1 (root) or an earlier node in [0, 10)");

  // Expansion over spans that cover, skip and (on purpose) overlap: the last node wins.
  std::vector<int64_t> off(N), cnt(N);
  for (int64_t n = 0; n < N; ++n) {
    off[n] = static_cast<int64_t>(rng() % P);
    cnt[n] = std::min<int64_t>(P - off[n], static_cast<int64_t>(rng() % 40));
  }
  std::vector<float> tv(P, 123.0f);
  arpo::kernels::tree_expand(tv.data(), P, sum.data(), off.data(), cnt.data(), N);
  Dev<float> d_tv(std::vector<float>(P, 123.0f)), d_val(sum);
  Dev<int64_t> d_off(off), d_cnt(cnt);
  arpo::cuda::tree_expand(d_tv.p, P, d_val.p, d_off.p, d_cnt.p, N, nullptr);
  const auto g_tv = d_tv.get();
  CHECK_ARRAY("tree_expand token_value", g_tv.data(), tv.data(), P, 0, 0);
  cnt[3] = P;
  d_cnt.upload(cnt);
  CHECK_THROWS(arpo::cuda::tree_expand(d_tv.p, P, d_val.p, d_off.p, d_cnt.p, N, nullptr), "node 3 span [");
  CHECK(d_tv.get() == g_tv);  // rejected call wrote nothing
}

}  // namespace

int main() {
  if (!arpo::cuda::available()) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  try {
    using arpo::cuda::Tuning;
    const Tuning dflt{};
    for (DType dt : {DType::F32, DType::BF16}) {
      test_stats(37, 1000, dt, 1.0f, dflt);
      test_stats(64, 4099, dt, 0.7f, dflt);    // odd V: misaligned rows, head and tail
      test_stats(3, 7, dt, 1.3f, dflt);        // V below the vector width
      test_stats(1, 1, dt, 1.0f, dflt);        // V = 1: entropy_norm 0
      test_stats(5, 151936, dt, 1.0f, dflt);   // Qwen vocabulary, few rows: clusters of 8
      test_stats(600, 151936, dt, 0.6f, dflt); // many rows: one block per row
      test_stats(9, 10007, dt, 1.0f, Tuning{96, 3, 0, 0, 0});   // cluster of 3, 3 warps
      test_stats(9, 10007, dt, 1.0f, Tuning{1024, 2, 0, 0, 0});
      test_stats(9, 151936, dt, 1.0f, Tuning{64, 1, 0, 0, 0});
    }
    test_stats_errors();

    for (DType dt : {DType::F32, DType::BF16}) {
      arpo::kernels::SamplingParams p;
      p.seed = rng();
      p.temperature = 0.0f;
      test_sample(33, 1003, dt, p, 2.0f);
      p.temperature = 1.0f;
      test_sample(33, 1003, dt, p, 2.0f);
      test_sample(6, 151936, dt, p, 2.0f);
      p.temperature = 0.6f;
      p.top_k = 20;
      test_sample(40, 4099, dt, p, 1.5f);
      p.top_k = 0;
      p.top_p = 0.9f;
      test_sample(40, 4099, dt, p, 1.5f);
      p.top_k = 50;
      p.top_p = 0.95f;
      test_sample(4, 151936, dt, p, 3.0f);
      p.top_k = 1000;
      p.top_p = 0.5f;
      test_sample(12, 30011, dt, p, 0.5f);  // flat rows: many candidates
    }
    test_sample_edges();

    using arpo::kernels::Aggregation;
    using arpo::kernels::KLType;
    arpo::kernels::PolicyLossConfig all;  // every non-default option at once
    all.clip_low = 0.2f;
    all.clip_high = 0.28f;
    all.dual_clip_c = 3.0f;
    all.kl_type = KLType::K3;
    all.kl_coef = 0.1f;
    all.entropy_coef = 0.01f;
    all.aggregation = Aggregation::SeqMeanTokenMean;
    all.temperature = 0.8f;
    all.grad_scale = 0.5f;
    for (DType dt : {DType::F32, DType::BF16}) {
      arpo::kernels::PolicyLossConfig plain;
      test_loss({47, 1003, 4, dt, plain, false, true, "default"}, dflt);
      test_loss({47, 1003, 4, dt, all, false, true, "all-options"}, dflt);
      test_loss({16, 151936, 3, dt, all, dt == DType::F32, true, dt == DType::F32 ? "all-options in-place" : "all-options"}, dflt);
      test_loss({16, 151936, 3, dt, plain, false, false, "forward-only"}, dflt);
      for (int agg = 0; agg < 4; ++agg)
        for (int kl = 0; kl < 4; ++kl) {
          arpo::kernels::PolicyLossConfig cfg = all;
          cfg.aggregation = static_cast<Aggregation>(agg);
          cfg.kl_type = static_cast<KLType>(kl);
          cfg.norm_constant = 4096;
          cfg.denominator = (agg == 1 && kl == 2) ? 3.0 : 0.0;
          test_loss({31, 4099, 5, dt, cfg, false, true, "agg/kl sweep"}, dflt);
        }
      test_loss({20, 30011, 4, dt, all, false, true, "cluster 1"}, Tuning{0, 0, 256, 1, 0});
      test_loss({20, 30011, 4, dt, all, false, true, "cluster 5"}, Tuning{0, 0, 128, 5, 3});
    }
    test_loss_errors();
    for (DType dt : {DType::F32, DType::BF16}) {
      arpo::kernels::PolicyLossConfig plain;
      test_loss_copies(41, 1003, dt, plain, true, 3, "default");
      test_loss_copies(41, 1003, dt, all, true, 3, "all-options");
      test_loss_copies(41, 1003, dt, all, false, 3, "ratio 1 (no old logprobs)");
      test_loss_copies(12, 151936, dt, all, true, 2, "qwen vocabulary");
      for (int agg = 0; agg < 4; ++agg) {
        arpo::kernels::PolicyLossConfig cfg = all;
        cfg.aggregation = static_cast<Aggregation>(agg);
        cfg.norm_constant = 4096;
        test_loss_copies(29, 4099, dt, cfg, true, 4, "aggregation sweep");
        cfg.denominator = 7.0;
        test_loss_copies(29, 4099, dt, cfg, true, 4, "denominator override");
      }
    }
    test_loss_copies_errors();

    test_entropy_delta();
    test_tree();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: unexpected exception: %s\n", e.what());
    ++arpo_test::failed();
  }
  return arpo_test::summary();
}
