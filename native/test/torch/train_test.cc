// Tests of training: the fused loss node against a plain libtorch composition
// (loss and gradient), model gradients against central finite differences,
// AdamW against the formula by hand, the LR schedule, gradient accumulation,
// exact resume from optimiser state, and a loss that goes down.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "test/check.h"
#include "tiny_model.h"
#include "torch/engine.h"
#include "torch/trainer.h"

using namespace arpo::model;
namespace K = arpo::kernels;
using arpo_test::tiny_config;
using arpo_test::tolerance_ratio;

namespace {

std::vector<float> to_vec(const at::Tensor& t) {
  at::Tensor c = t.to(at::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// verl core_algos composition in float64 with autograd: per-token clipped
// ratio loss (+ dual clip, k3 KL, entropy bonus), then the aggregation.
at::Tensor reference_loss(const at::Tensor& z_in, const at::Tensor& targets, const at::Tensor& old_lp,
                          const at::Tensor& adv, const at::Tensor& mask, const at::Tensor& seq, int64_t S,
                          const at::Tensor& ref_lp, const K::PolicyLossConfig& c) {
  at::Tensor ls = at::log_softmax(z_in / c.temperature, -1);
  at::Tensor logp = ls.gather(1, targets.unsqueeze(1)).squeeze(1);
  at::Tensor ratio = at::exp(at::clamp(logp - old_lp, -20, 20));
  at::Tensor pg1 = -adv * ratio, pg2 = -adv * at::clamp(ratio, 1 - c.clip_low, 1 + c.clip_high);
  at::Tensor clipped = at::maximum(pg1, pg2);
  at::Tensor pg = at::where(adv < 0, at::minimum(-adv * c.dual_clip_c, clipped), clipped);
  at::Tensor loss = pg;
  if (c.kl_coef != 0) {
    at::Tensor kl = at::clamp(ref_lp - logp, -20, 20);
    loss = loss + c.kl_coef * at::clamp(at::exp(kl) - kl - 1, -10, 10);
  }
  if (c.entropy_coef != 0) loss = loss - c.entropy_coef * -(ls.exp() * ls).sum(-1);
  if (c.aggregation == K::Aggregation::TokenMean) return (loss * mask).sum() / mask.sum();
  at::Tensor total = at::zeros({}, at::kDouble);
  for (int64_t s = 0; s < S; ++s) {
    at::Tensor in = (seq == s).to(at::kDouble) * mask;
    total = total + (loss * in).sum() / in.sum();
  }
  return total / static_cast<double>(S);
}

void test_fused_loss_against_torch() {
  const int64_t R = 13, V = 31, S = 3;  // odd shape on purpose
  at::manual_seed(1);
  at::Tensor z = at::randn({R, V}, at::kDouble) * 2;
  at::Tensor targets = at::randint(0, V, {R}, at::kLong);
  at::Tensor logp = at::log_softmax(z, -1).gather(1, targets.unsqueeze(1)).squeeze(1);
  at::Tensor old_lp = logp + at::randn({R}, at::kDouble) * 0.4;  // ratios from ~0.5 to ~2: some clip
  at::Tensor adv = at::randn({R}, at::kDouble);
  at::Tensor mask = (at::rand({R}, at::kDouble) > 0.25).to(at::kDouble);
  at::Tensor seq = at::tensor({0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2}, at::kLong);
  at::Tensor ref_lp = logp + at::randn({R}, at::kDouble) * 0.3;
  std::vector<int32_t> tg(R), sq(R);
  for (int64_t r = 0; r < R; ++r) tg[r] = targets[r].item<int32_t>(), sq[r] = seq[r].item<int32_t>();

  K::PolicyLossConfig plain;
  K::PolicyLossConfig every;  // every non-default option at once
  every.clip_low = 0.1f;
  every.clip_high = 0.28f;
  every.dual_clip_c = 2.0f;
  every.kl_coef = 0.3f;
  every.entropy_coef = 0.01f;
  every.temperature = 0.7f;
  every.aggregation = K::Aggregation::SeqMeanTokenMean;
  for (const K::PolicyLossConfig& cfg : {plain, every}) {
    at::Tensor zr = z.clone().requires_grad_(true);
    at::Tensor ref = reference_loss(zr, targets, old_lp, adv, mask, seq, S, ref_lp, cfg);
    ref.backward();
    at::Tensor leaf = z.to(at::kFloat).requires_grad_(true);
    at::Tensor logits = leaf * 1.0f;  // the fused node overwrites its input buffer, not the leaf
    K::PolicyLossResult res;
    std::vector<float> ref_v = cfg.kl_coef != 0 ? to_vec(ref_lp) : std::vector<float>{};
    at::Tensor loss = fused_policy_loss(logits, tg, to_vec(old_lp), to_vec(adv), to_vec(mask), sq, S, ref_v, cfg,
                                        LossMode::Policy, 1, &res);
    loss.backward();
    CHECK_CLOSE(loss.item<double>(), ref.item<double>(), 1e-5, 1e-4);
    const double gr = tolerance_ratio(leaf.grad(), zr.grad(), 1e-6, 1e-4);
    CHECK(gr <= 1.0);
    std::printf("  fused loss %.6f vs torch %.6f, gradient ratio %.2g (<= 1 passes)\n", loss.item<double>(),
                ref.item<double>(), gr);
  }
  // SFT: loss = -sum(mask logp) / sum(mask).
  at::Tensor zr = z.clone().requires_grad_(true);
  at::Tensor ref = -(at::log_softmax(zr, -1).gather(1, targets.unsqueeze(1)).squeeze(1) * mask).sum() / mask.sum();
  ref.backward();
  at::Tensor leaf = z.to(at::kFloat).requires_grad_(true);
  K::PolicyLossResult res;
  at::Tensor loss = fused_policy_loss(leaf * 1.0f, tg, {}, {}, to_vec(mask), sq, S, {}, plain, LossMode::SFT, 1, &res);
  loss.backward();
  CHECK_CLOSE(loss.item<double>(), ref.item<double>(), 1e-5, 1e-5);
  CHECK(tolerance_ratio(leaf.grad(), zr.grad(), 1e-6, 1e-4) <= 1.0);
  CHECK_THROWS(fused_policy_loss(z.to(at::kFloat), tg, {}, {}, {1.0f}, sq, S, {}, plain, LossMode::SFT, 1, &res),
               "expected 13 values for mask but received 1");
}

MicroBatch make_batch(const std::vector<std::vector<int32_t>>& seqs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  MicroBatch mb;
  for (const auto& s : seqs) {
    mb.lengths.push_back(static_cast<int64_t>(s.size()));
    for (size_t t = 0; t < s.size(); ++t) {
      mb.tokens.push_back(s[t]);
      mb.mask.push_back(t >= 2 && t % 5 != 3 ? 1.0f : 0.0f);  // a prompt and a "tool result" token masked out
      mb.advantages.push_back(nd(rng));
      mb.old_logprobs.push_back(-3.9f + 0.5f * nd(rng));
    }
  }
  return mb;
}

std::vector<int32_t> seq_of(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> s(n);
  for (auto& t : s) t = static_cast<int32_t>(rng() % vocab);
  return s;
}

// Loss of a micro-batch through the training forward, with gradients.
double batch_loss(Model& m, const MicroBatch& mb, const K::PolicyLossConfig& cfg, LossMode mode, bool backward) {
  PackedSequences p = pack_sequences(mb.tokens, mb.lengths, m.config().vocab_size, 1000, "test");
  at::Tensor h = m.forward_hidden(p.ids, p.positions, packed_causal_attention(p.offsets));
  at::Tensor logits = m.logits(h.index_select(0, p.rows)).to(at::kFloat).contiguous();
  std::vector<float> old_lp, adv, mask;
  for (int64_t i : p.target_index) {
    old_lp.push_back(mb.old_logprobs[i]);
    adv.push_back(mb.advantages[i]);
    mask.push_back(mb.mask[i]);
  }
  K::PolicyLossResult res;
  at::Tensor loss = fused_policy_loss(logits, p.targets, old_lp, adv, mask, p.seq_of_row,
                                      static_cast<int64_t>(mb.lengths.size()), {}, cfg, mode, 1, &res);
  if (backward) loss.backward();
  return loss.item<double>();
}

// d loss / d theta of the whole model (float64 compute) against central
// differences, through the fused loss (float32 logits inside the kernel).
void test_gradients_finite_differences() {
  ModelConfig c = tiny_config("qwen3", 29);
  Model m(c, at::kDouble);
  m.init_weights(3);
  m.set_requires_grad(true);
  MicroBatch mb = make_batch({seq_of(9, c.vocab_size, 1), seq_of(6, c.vocab_size, 2)}, 4);
  K::PolicyLossConfig cfg;
  cfg.clip_low = cfg.clip_high = 10.0f;  // no clipping kinks near the evaluation point
  batch_loss(m, mb, cfg, LossMode::Policy, true);
  std::mt19937 rng(7);
  const double h = 1e-3;
  int checked = 0, bad = 0;
  double worst = 0;
  for (const auto& [name, p] : m.named_tensors()) {
    at::Tensor grad = p.grad().clone();
    at::Tensor flat = p.detach().view(-1);
    for (int k = 0; k < 3; ++k) {
      const int64_t i = rng() % flat.numel();
      const double orig = flat[i].item<double>();
      double lp, lm;
      {
        at::NoGradGuard g;
        flat[i] = orig + h;
        lp = batch_loss(m, mb, cfg, LossMode::Policy, false);
        flat[i] = orig - h;
        lm = batch_loss(m, mb, cfg, LossMode::Policy, false);
        flat[i] = orig;
      }
      const double fd = (lp - lm) / (2 * h), an = grad.view(-1)[i].item<double>();
      // float32 logits inside the kernel: loss noise ~1e-7 / 2h ~ 5e-5 absolute.
      const double r = std::fabs(fd - an) / (2e-4 + 2e-2 * std::fabs(fd));
      worst = std::max(worst, r);
      ++checked;
      if (r > 1.0) {
        ++bad;
        if (bad < 5) std::fprintf(stderr, "  %s[%ld]: analytic %.6g fd %.6g\n", name.c_str(), (long)i, an, fd);
      }
    }
  }
  CHECK(bad == 0);
  std::printf("  %d parameter entries vs central differences: worst ratio %.2g (<= 1 passes)\n", checked, worst);
}

void test_adamw_by_hand() {
  OptimConfig oc;
  oc.lr = 0.1;
  oc.beta1 = 0.8;
  oc.beta2 = 0.9;
  oc.eps = 1e-3;
  oc.weight_decay = 0.5;
  at::Tensor w = at::tensor({1.0f, -2.0f, 0.5f, 0.0f, 3.0f}).requires_grad_(true);
  NamedTensors params = {{"w", w}};
  AdamW opt(params);
  const double g1[] = {0.1, -0.2, 0.3, 0.0, 1.0}, g2[] = {-0.5, 0.4, 0.3, 0.2, 0.0};
  double p[] = {1.0, -2.0, 0.5, 0.0, 3.0}, m[5] = {}, v[5] = {};
  for (int t = 1; t <= 2; ++t) {
    const double* g = t == 1 ? g1 : g2;
    w.mutable_grad() = at::tensor(std::vector<float>(g, g + 5));
    opt.step(params, oc.lr, oc);
    for (int i = 0; i < 5; ++i) {
      p[i] *= 1 - oc.lr * oc.weight_decay;
      m[i] = oc.beta1 * m[i] + (1 - oc.beta1) * g[i];
      v[i] = oc.beta2 * v[i] + (1 - oc.beta2) * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(oc.beta1, t)), vh = v[i] / (1 - std::pow(oc.beta2, t));
      p[i] -= oc.lr * mh / (std::sqrt(vh) + oc.eps);
    }
  }
  CHECK_ARRAY("adamw params", w.detach().data_ptr<float>(), p, 5, 1e-6, 1e-5);
  CHECK(opt.steps() == 2);
  CHECK(opt.state().back().first == "step" && opt.state().back().second.item<int64_t>() == 2);
}

void test_schedule() {
  OptimConfig oc;
  oc.lr = 1.0;
  oc.warmup_steps = 4;
  oc.total_steps = 14;
  CHECK_CLOSE(scheduled_lr(oc, 0), 0.25, 0, 1e-12);
  CHECK_CLOSE(scheduled_lr(oc, 3), 1.0, 0, 1e-12);
  CHECK_CLOSE(scheduled_lr(oc, 9), 1.0, 0, 1e-12);  // constant
  oc.schedule = Schedule::Linear;
  oc.min_lr_ratio = 0.1;
  CHECK_CLOSE(scheduled_lr(oc, 9), 0.1 + 0.9 * 0.5, 0, 1e-12);
  CHECK_CLOSE(scheduled_lr(oc, 20), 0.1, 0, 1e-12);
  oc.schedule = Schedule::Cosine;
  CHECK_CLOSE(scheduled_lr(oc, 4), 1.0, 0, 1e-12);
  CHECK_CLOSE(scheduled_lr(oc, 9), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5)), 0, 1e-12);
  CHECK_CLOSE(scheduled_lr(oc, 14), 0.1, 0, 1e-12);
}

// Two micro-batches accumulate to the one-batch step; resume from saved state is exact.
void test_accumulation_and_resume() {
  ModelConfig c = tiny_config("qwen2", 41);
  // float64: Adam normalises each gradient entry, so with float32 a near-zero
  // entry whose sign depends on the BLAS summation order (batched vs split
  // matmuls) would move its parameter by +-lr and hide real accumulation bugs.
  Model base(c, at::kDouble);
  base.init_weights(9);
  MicroBatch whole = make_batch({seq_of(8, c.vocab_size, 1), seq_of(11, c.vocab_size, 2)}, 3);
  MicroBatch a = make_batch({seq_of(8, c.vocab_size, 1)}, 0), b = make_batch({seq_of(11, c.vocab_size, 2)}, 0);
  // Same per-token values in the split batches as in the whole one.
  a.old_logprobs.assign(whole.old_logprobs.begin(), whole.old_logprobs.begin() + 8);
  a.advantages.assign(whole.advantages.begin(), whole.advantages.begin() + 8);
  b.old_logprobs.assign(whole.old_logprobs.begin() + 8, whole.old_logprobs.end());
  b.advantages.assign(whole.advantages.begin() + 8, whole.advantages.end());
  OptimConfig oc;
  oc.lr = 1e-2;
  K::PolicyLossConfig cfg;
  Model m1 = base.clone(at::kDouble), m2 = base.clone(at::kDouble);
  AdamW o1(m1.named_tensors()), o2(m2.named_tensors());
  TrainMetrics r1 = train_step(m1, o1, {whole}, cfg, LossMode::Policy, oc, nullptr, 1);
  TrainMetrics r2 = train_step(m2, o2, {a, b}, cfg, LossMode::Policy, oc, nullptr, 1);
  CHECK_CLOSE(r2.loss, r1.loss, 1e-6, 1e-4);
  CHECK_CLOSE(r2.grad_norm, r1.grad_norm, 1e-6, 1e-4);
  CHECK_CLOSE(r2.pg_clipfrac, r1.pg_clipfrac, 1e-6, 1e-5);
  CHECK(r1.tokens == r2.tokens && r1.tokens > 0);
  double worst = 0;
  for (size_t i = 0; i < m1.named_tensors().size(); ++i)
    worst = std::max(worst, tolerance_ratio(m2.named_tensors()[i].second, m1.named_tensors()[i].second, 1e-6, 1e-4));
  CHECK(worst <= 1.0);
  // Resume: copy model + optimiser state after step 1, then step both again.
  Model m3 = m1.clone(at::kDouble);
  AdamW o3(m3.named_tensors());
  NamedTensors st;
  for (const auto& [n, t] : o1.state()) st.emplace_back(n, t.clone());
  o3.load_state(st);
  train_step(m1, o1, {whole}, cfg, LossMode::Policy, oc, nullptr, 1);
  train_step(m3, o3, {whole}, cfg, LossMode::Policy, oc, nullptr, 1);
  bool same = true;
  for (size_t i = 0; i < m1.named_tensors().size(); ++i)
    same = same && m1.named_tensors()[i].second.equal(m3.named_tensors()[i].second);
  CHECK(same);
  CHECK(o3.steps() == 2);
  st.pop_back();
  CHECK_THROWS(o3.load_state(st), "optimizer state: missing tensor step");
}

void test_training_lowers_loss() {
  ModelConfig c = tiny_config("llama", 37);
  Model m(c, at::kFloat);
  m.init_weights(12);
  AdamW opt(m.named_tensors());
  OptimConfig oc;
  oc.lr = 3e-3;
  oc.weight_decay = 0.0;
  K::PolicyLossConfig cfg;
  MicroBatch mb = make_batch({seq_of(12, c.vocab_size, 5), seq_of(7, c.vocab_size, 6)}, 2);
  std::vector<double> losses;
  for (int s = 0; s < 12; ++s) losses.push_back(train_step(m, opt, {mb}, cfg, LossMode::SFT, oc, nullptr, 1).loss);
  CHECK(losses.back() < 0.5 * losses.front());
  std::printf("  SFT loss over 12 steps: %.4f -> %.4f\n", losses.front(), losses.back());
  // Policy mode: positive advantages raise the chosen tokens' logprobs, which the KL term (to the frozen start) sees.
  PackedSequences p = pack_sequences(mb.tokens, mb.lengths, c.vocab_size, 1000, "test");
  TokenStats before = score_sequences(m, p, 1.0f, 1);
  Model reference = m.clone(at::kFloat);
  mb.old_logprobs = before.logprobs;
  mb.advantages.assign(mb.tokens.size(), 1.0f);
  cfg.kl_coef = 0.01f;
  TrainMetrics first = train_step(m, opt, {mb}, cfg, LossMode::Policy, oc, &reference, 1);
  CHECK_CLOSE(first.kl, 0.0, 1e-6, 0);
  CHECK_CLOSE(first.ppo_kl, 0.0, 1e-5, 0);
  TrainMetrics second = train_step(m, opt, {mb}, cfg, LossMode::Policy, oc, &reference, 1);
  CHECK(second.kl > 0);
  TokenStats after = score_sequences(m, p, 1.0f, 1);
  double gain = 0;
  for (size_t i = 0; i < mb.tokens.size(); ++i) gain += mb.mask[i] * (after.logprobs[i] - before.logprobs[i]);
  CHECK(gain > 0);
  CHECK_THROWS(train_step(m, opt, {mb}, cfg, LossMode::Policy, oc, nullptr, 1), "neither refLogprobs nor a reference model");
  MicroBatch broken = mb;
  broken.advantages.pop_back();
  cfg.kl_coef = 0;
  CHECK_THROWS(train_step(m, opt, {broken}, cfg, LossMode::Policy, oc, nullptr, 1),
               "trainStep micro-batch 0: expected 19 values for advantages but received 18");
}

}  // namespace

int main() {
  at::set_num_threads(1);
  test_fused_loss_against_torch();
  test_gradients_finite_differences();
  test_adamw_by_hand();
  test_schedule();
  test_accumulation_and_resume();
  test_training_lowers_loss();
  return arpo_test::summary();
}
