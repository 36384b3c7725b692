// The fused policy_loss kernel against the composed libtorch path with
// autograd (log_softmax -> gather -> ratio -> clip -> KL -> entropy -> agg, in
// float64): loss and d loss / d logits for every aggregation and option.
// With --bench it also times logits_stats against the libtorch composition
// and a plain sum on 256 x 151,936 float32 logits.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#undef CHECK  // glog (pulled in by libtorch) defines its own CHECK
#include "../check.h"
#include "../test_util.h"
#include "kernels/kernels.h"

namespace K = arpo::kernels;
using arpo_test::Random;

namespace {

struct Batch {
  int64_t T, V, S;
  std::vector<float> logits, old_lp, adv, mask, ref_lp;
  std::vector<int32_t> targets, seq;
};

Batch make_batch(uint64_t seed, int64_t T, int64_t V, int64_t S) {
  Random r(seed);
  Batch b{T, V, S, arpo_test::random_logits(r, T, V, 2.0), {}, {}, {}, {}, {}, {}};
  for (int64_t t = 0; t < T; ++t) {
    const int32_t tg = static_cast<int32_t>(r.integer(0, V - 1));
    const double lp = arpo_test::ref_row(b.logits.data() + t * V, V, 1.0f).logp(tg);
    b.targets.push_back(tg);
    b.old_lp.push_back(static_cast<float>(lp + 0.4 * r.normal()));
    b.ref_lp.push_back(static_cast<float>(lp + 0.3 * r.normal()));
    b.adv.push_back(static_cast<float>(r.normal()));
    b.mask.push_back(r.uniform() < 0.8 ? 1.0f : 0.0f);
    if (t % 3 == 1) {  // ratio ~4.5 with A < 0: beyond the dual-clip bound
      b.old_lp.back() = static_cast<float>(lp - 1.5);
      b.adv.back() = -std::fabs(b.adv.back()) - 0.1f;
      b.mask.back() = 1.0f;
    }
    b.seq.push_back(static_cast<int32_t>(t * S / T));
  }
  return b;
}

torch::Tensor f64(const std::vector<float>& v) {
  return torch::from_blob(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())}, torch::kFloat32).to(torch::kFloat64);
}

// verl's composition in libtorch; returns (loss, d loss / d logits).
std::pair<double, std::vector<double>> torch_loss(const Batch& b, const K::PolicyLossConfig& c, bool with_ref) {
  auto x = torch::from_blob(const_cast<float*>(b.logits.data()), {b.T, b.V}, torch::kFloat32)
               .to(torch::kFloat64)
               .requires_grad_(true);
  auto idx = torch::from_blob(const_cast<int32_t*>(b.targets.data()), {b.T}, torch::kInt32).to(torch::kInt64);
  auto logp_all = torch::log_softmax(x / static_cast<double>(c.temperature), -1);
  auto logp = logp_all.gather(1, idx.unsqueeze(1)).squeeze(1);
  auto H = -(logp_all.exp() * logp_all).sum(-1);
  auto A = f64(b.adv), mask = f64(b.mask);
  auto ratio = torch::exp(torch::clamp(logp - f64(b.old_lp), -20.0, 20.0));
  auto pg1 = -A * ratio;
  auto pg2 = -A * torch::clamp(ratio, 1.0 - c.clip_low, 1.0 + c.clip_high);
  auto clip1 = torch::maximum(pg1, pg2);
  auto pg = clip1;
  if (c.dual_clip_c > 1) pg = torch::where(A < 0, torch::minimum(-A * static_cast<double>(c.dual_clip_c), clip1), clip1);
  auto loss_t = pg - static_cast<double>(c.entropy_coef) * H;
  if (with_ref) {
    auto ref = f64(b.ref_lp);
    torch::Tensor kl;
    switch (c.kl_type) {
      case K::KLType::K1: kl = logp - ref; break;
      case K::KLType::K2: kl = 0.5 * (logp - ref).square(); break;
      case K::KLType::ABS: kl = (logp - ref).abs(); break;
      case K::KLType::K3: {
        auto d = torch::clamp(ref - logp, -20.0, 20.0);
        kl = torch::clamp(torch::exp(d) - d - 1, -10.0, 10.0);
        break;
      }
    }
    loss_t = loss_t + static_cast<double>(c.kl_coef) * kl;
  }
  // agg_loss via a (S, T) membership matrix.
  auto seq = torch::from_blob(const_cast<int32_t*>(b.seq.data()), {b.T}, torch::kInt32).to(torch::kInt64);
  auto member = torch::one_hot(seq, b.S).to(torch::kFloat64).t();  // (S, T)
  auto masked = loss_t * mask;
  torch::Tensor loss;
  const double S = c.denominator > 0 ? c.denominator : static_cast<double>(b.S);
  switch (c.aggregation) {
    case K::Aggregation::TokenMean:
      loss = masked.sum() / (c.denominator > 0 ? torch::full({}, c.denominator, torch::kFloat64) : mask.sum());
      break;
    case K::Aggregation::SeqMeanTokenMean: loss = (member.matmul(masked) / member.matmul(mask)).sum() / S; break;
    case K::Aggregation::SeqMeanTokenSum: loss = member.matmul(masked).sum() / S; break;
    case K::Aggregation::SeqMeanTokenSumNorm:
      loss = masked.sum() / (c.denominator > 0 ? c.denominator : c.norm_constant);
      break;
  }
  loss = loss * static_cast<double>(c.grad_scale);
  loss.backward();
  auto g = x.grad().contiguous();
  std::vector<double> grad(g.data_ptr<double>(), g.data_ptr<double>() + b.T * b.V);
  return {loss.item<double>(), grad};
}

void check(const std::string& name, const Batch& b, const K::PolicyLossConfig& c, bool with_ref) {
  const auto ref = torch_loss(b, c, with_ref);
  K::PolicyLossResult r;
  std::vector<float> grad(b.T * b.V, 99.0f);
  K::policy_loss(&r, grad.data(), nullptr, nullptr, K::Logits{b.logits.data(), K::DType::F32, b.T, b.V}, b.targets.data(),
                 b.old_lp.data(), b.adv.data(), b.mask.data(), b.seq.data(), b.S, with_ref ? b.ref_lp.data() : nullptr, c, 2);
  double gmax = 0;
  for (double g : ref.second) gmax = std::max(gmax, std::fabs(g));
  CHECK_CLOSE(r.loss, ref.first, 1e-6, 1e-5);
  CHECK_ARRAY(name + " grad vs libtorch autograd", grad.data(), ref.second.data(), b.T * b.V, 1e-5 * gmax + 1e-8, 1e-4);
}

void test_against_torch() {
  const Batch b = make_batch(31, 12, 151, 4);
  const char* names[] = {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"};
  for (int agg = 0; agg < 4; ++agg)
    for (const float dual : {3.0f, 0.0f}) {
      K::PolicyLossConfig c;
      c.aggregation = static_cast<K::Aggregation>(agg);
      c.dual_clip_c = dual;
      c.norm_constant = 20;
      check(std::string(names[agg]) + (dual > 1 ? " dual" : ""), b, c, false);
    }
  for (int kl = 0; kl < 4; ++kl) {
    K::PolicyLossConfig c;
    c.kl_type = static_cast<K::KLType>(kl);
    c.kl_coef = 0.25f;
    check("kl " + std::to_string(kl), b, c, true);
  }
  K::PolicyLossConfig all;
  all.clip_low = 0.1f;
  all.clip_high = 0.3f;
  all.dual_clip_c = 2.0f;
  all.kl_coef = 0.1f;
  all.entropy_coef = 0.02f;
  all.aggregation = K::Aggregation::SeqMeanTokenMean;
  all.temperature = 0.8f;
  all.denominator = 6;
  all.grad_scale = 2.0f;
  check("every option", b, all, true);
  // Odd larger shape, token-mean with entropy.
  const Batch odd = make_batch(32, 7, 1001, 2);
  K::PolicyLossConfig ent;
  ent.entropy_coef = 0.01f;
  check("7x1001 entropy", odd, ent, false);
}

// ---------------------------------------------------------------- --bench
template <typename F>
double best_ms(F&& f, int reps = 7) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    const auto e = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(e - a).count());
  }
  return best;
}

void bench() {
  const int64_t T = 256, V = 151936;
  Random r(1);
  std::vector<float> x = arpo_test::random_logits(r, T, V, 3.0);
  std::vector<int32_t> targets(T);
  for (auto& t : targets) t = static_cast<int32_t>(r.integer(0, V - 1));
  std::vector<float> lse(T), ent(T), norm(T), logp(T);
  const double gb = static_cast<double>(T * V * 4) / 1e9;
  const K::Logits lg{x.data(), K::DType::F32, T, V};
  auto xt = torch::from_blob(x.data(), {T, V}, torch::kFloat32);
  auto idx = torch::from_blob(targets.data(), {T}, torch::kInt32).to(torch::kInt64).unsqueeze(1);
  torch::NoGradGuard no_grad;
  auto composed = [&] {
    auto lp = torch::log_softmax(xt, -1);
    auto l = torch::logsumexp(xt, -1);
    auto h = -(lp.exp() * lp).sum(-1);
    auto tl = lp.gather(1, idx);
    (void)l;
    (void)h;
    (void)tl;
  };
  volatile double sink = 0;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  for (const int threads : {1, hw}) {
    torch::set_num_threads(threads);
    const double t_sum = best_ms([&] { sink = sink + K::plain_sum(x.data(), T * V, threads); });
    const double t_stats = best_ms([&] { K::logits_stats(lse.data(), ent.data(), norm.data(), logp.data(), lg, targets.data(), 1.0f, threads); });
    const double t_torch = best_ms(composed, 3);
    std::printf("threads %d | plain sum %.2f ms (%.1f GB/s) | fused stats %.2f ms (%.1f GB/s) | libtorch composition %.2f ms | "
                "stats/sum bandwidth %.2f | speedup vs libtorch %.1fx\n",
                threads, t_sum, gb / (t_sum / 1e3), t_stats, gb / (t_stats / 1e3), t_torch, t_sum / t_stats, t_torch / t_stats);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) {
    bench();
    return 0;
  }
  test_against_torch();
  return arpo_test::summary();
}
