// Data-parallel training steps (issue 16) against one process on the same
// inputs: two ranks as two threads of this process (Gloo over a localhost
// TCPStore), each with its own copy of a float64 model, each given some of
// the step's micro-batches (unequal token counts, and a step where one rank
// has none), against train_step / train_tree_step in one process over all of
// them. After 3 AdamW steps every parameter, and each step's loss and
// metrics, must agree within 1e-9 relative (float64 model; the fused loss
// kernel is float32 per row, but a row's numbers do not depend on which rank
// computes it, so the only differences are float64 summation order).
// Cases: flat token-mean, flat seq-mean-token-mean with a KL term against a
// frozen reference, SFT, packed trees (chains) token-mean; gradient clipping
// on (the norm is the global one). Also: broadcast_parameters makes rank 1's
// differently initialised model rank 0's, bit for bit.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tiny_model.h"
#include "free_port.h"
#include "torch/dist.h"
#include "torch/engine.h"
#include "torch/trainer.h"
// After libtorch, whose glog also defines CHECK: the harness's counts failures instead of aborting.
#undef CHECK
#include "test/check.h"

using namespace arpo::model;
namespace K = arpo::kernels;
namespace D = arpo::dist;
using arpo_test::tiny_config;

namespace {

using arpo_test::free_port;

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<float> mask, adv, old_lp;
};

// Random sequences of 3-14 tokens, mask 0 on the first token and on random
// "tool result" tokens, one advantage per sequence of either sign, old
// log-probs = the base model's own plus noise (ratios near 1, some clipped).
std::vector<Seq> random_sequences(const Model& base, int count, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<Seq> out(count);
  for (auto& s : out) {
    const int n = 3 + static_cast<int>(g() % 12);
    for (int i = 0; i < n; ++i) s.tokens.push_back(static_cast<int32_t>(g() % base.config().vocab_size));
    const float a = std::uniform_real_distribution<float>(-1.5f, 1.5f)(g);
    for (int i = 0; i < n; ++i) {
      s.mask.push_back(i == 0 || g() % 5 == 0 ? 0.f : 1.f);
      s.adv.push_back(a);
    }
    PackedSequences pk = pack_sequences(s.tokens, {static_cast<int64_t>(n)}, base.config().vocab_size, base.config().max_position_embeddings, "test");
    TokenStats st = score_sequences(base, pk, 1.0f, 1);
    std::normal_distribution<float> noise(0.f, 0.15f);
    for (int i = 0; i < n; ++i) s.old_lp.push_back(st.logprobs[i] + noise(g));
  }
  return out;
}

MicroBatch flat_batch(const std::vector<Seq>& seqs, size_t begin, size_t end) {
  MicroBatch mb;
  for (size_t k = begin; k < end; ++k) {
    const Seq& s = seqs[k];
    mb.lengths.push_back(static_cast<int64_t>(s.tokens.size()));
    mb.tokens.insert(mb.tokens.end(), s.tokens.begin(), s.tokens.end());
    mb.mask.insert(mb.mask.end(), s.mask.begin(), s.mask.end());
    mb.advantages.insert(mb.advantages.end(), s.adv.begin(), s.adv.end());
    mb.old_logprobs.insert(mb.old_logprobs.end(), s.old_lp.begin(), s.old_lp.end());
  }
  return mb;
}

// The same sequences as packed trees of single chains (each root one trajectory), token-mean copy sums.
TreeMicroBatch tree_batch(const std::vector<Seq>& seqs, size_t begin, size_t end) {
  TreeMicroBatch mb;
  for (size_t k = begin; k < end; ++k) {
    const Seq& s = seqs[k];
    mb.parent.push_back(-1);
    mb.node_tokens.push_back(static_cast<int64_t>(s.tokens.size()));
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const double m = i == 0 ? 0.0 : s.mask[i], a = s.adv[i];
      mb.tokens.push_back(s.tokens[i]);
      mb.old_logprobs.push_back(s.old_lp[i]);
      mb.adv_pos.push_back(a > 0 ? m * a : 0.0);
      mb.adv_neg.push_back(a < 0 ? m * a : 0.0);
      mb.weight.push_back(m);
      mb.count_pos.push_back(a > 0 ? m : 0.0);
      mb.count_neg.push_back(a < 0 ? m : 0.0);
      mb.count.push_back(m);
    }
    ++mb.sequences;
  }
  return mb;
}

enum class Form { Flat, Tree };

struct Case {
  const char* name;
  Form form;
  LossMode mode;
  K::Aggregation aggregation;
  float kl_coef;
};

// Micro-batch boundaries over 9 sequences per step, and which rank gets each
// micro-batch: unequal shares, and at step 2 rank 1 gets nothing.
const std::vector<std::vector<size_t>> kCuts = {{0, 2, 5, 6, 9}, {0, 4, 9}, {0, 1, 3, 6, 9}};
const std::vector<std::vector<int>> kOwner = {{0, 1, 0, 1}, {0, 0}, {1, 0, 1}};

using Step = std::function<TrainMetrics(Model&, AdamW&, const std::vector<Seq>&, const std::vector<std::pair<size_t, size_t>>&, D::Group*)>;

Step step_for(const Case& c, const Model* reference) {
  K::PolicyLossConfig loss;
  loss.aggregation = c.aggregation;
  loss.kl_coef = c.kl_coef;
  loss.entropy_coef = 0.01f;
  OptimConfig optim;
  optim.lr = 1e-3, optim.eps = 1e-3;  // eps: a near-zero moment's rounding cannot move a parameter by lr
  optim.max_grad_norm = 0.05;         // small: clipping is on in every step
  return [=](Model& m, AdamW& opt, const std::vector<Seq>& seqs, const std::vector<std::pair<size_t, size_t>>& parts, D::Group* g) {
    if (c.form == Form::Tree) {
      std::vector<TreeMicroBatch> b;
      for (auto [lo, hi] : parts) b.push_back(tree_batch(seqs, lo, hi));
      return train_tree_step(m, opt, b, loss, optim, reference, 1, 0, g);
    }
    std::vector<MicroBatch> b;
    for (auto [lo, hi] : parts) b.push_back(flat_batch(seqs, lo, hi));
    return train_step(m, opt, b, loss, c.mode, optim, reference, 1, g);
  };
}

double rel(double a, double b) { return std::abs(a - b) / std::max(1e-12, std::max(std::abs(a), std::abs(b))); }

void test_case(const Case& c) {
  const ModelConfig cfg = tiny_config("qwen2", 41);
  Model base(cfg, at::kDouble);
  base.init_weights(11);
  Model reference = base.clone(at::kDouble);
  reference.init_weights(12);
  std::vector<std::vector<Seq>> steps;
  for (int s = 0; s < 3; ++s) steps.push_back(random_sequences(base, 9, 100 + s));
  const Step step = step_for(c, c.kl_coef != 0 ? &reference : nullptr);

  // One process, every micro-batch.
  Model single = base.clone(at::kDouble);
  AdamW single_opt(single.named_tensors());
  std::vector<TrainMetrics> single_m;
  for (int s = 0; s < 3; ++s) {
    std::vector<std::pair<size_t, size_t>> parts;
    for (size_t b = 0; b + 1 < kCuts[s].size(); ++b) parts.emplace_back(kCuts[s][b], kCuts[s][b + 1]);
    single_m.push_back(step(single, single_opt, steps[s], parts, nullptr));
  }

  // Two ranks.
  const int port = free_port();
  std::vector<Model> models{base.clone(at::kDouble), base.clone(at::kDouble)};
  std::vector<std::vector<TrainMetrics>> rank_m(2);
  std::string errors[2];
  auto rank_main = [&](int r) {
    try {
      auto g = D::Group::create(D::Config{r, 2, "127.0.0.1", port, std::chrono::milliseconds(30000)});
      AdamW opt(models[r].named_tensors());
      for (int s = 0; s < 3; ++s) {
        std::vector<std::pair<size_t, size_t>> parts;
        for (size_t b = 0; b + 1 < kCuts[s].size(); ++b)
          if (kOwner[s][b] == r) parts.emplace_back(kCuts[s][b], kCuts[s][b + 1]);
        rank_m[r].push_back(step(models[r], opt, steps[s], parts, g.get()));
      }
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  for (int r = 0; r < 2; ++r) {
    CHECK(errors[r].empty());
    if (!errors[r].empty()) std::printf("%s rank %d: %s\n", c.name, r, errors[r].c_str());
  }
  if (!errors[0].empty() || !errors[1].empty()) return;

  double worst_param = 0, worst_metric = 0;
  for (int r = 0; r < 2; ++r) {
    const auto& a = models[r].named_tensors();
    const auto& b = single.named_tensors();
    for (size_t i = 0; i < a.size(); ++i) {
      const double diff = (a[i].second - b[i].second).abs().max().item<double>();
      const double scale = b[i].second.abs().max().item<double>();
      worst_param = std::max(worst_param, diff / std::max(scale, 1e-12));
    }
    for (int s = 0; s < 3; ++s) {
      const TrainMetrics &x = rank_m[r][s], &y = single_m[s];
      for (auto [u, v] : {std::pair{x.loss, y.loss}, {x.pg_loss, y.pg_loss}, {x.pg_clipfrac, y.pg_clipfrac}, {x.ppo_kl, y.ppo_kl},
                          {x.entropy, y.entropy}, {x.kl, y.kl}, {x.grad_norm, y.grad_norm}, {x.tokens, y.tokens}})
        worst_metric = std::max(worst_metric, rel(u, v));
      CHECK(x.step == y.step && x.skipped == y.skipped);
    }
    // The two ranks hold the same numbers, bit for bit (the same summed gradients, the same AdamW).
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i].second.equal(models[1 - r].named_tensors()[i].second));
  }
  CHECK(worst_param <= 1e-9);
  CHECK(worst_metric <= 1e-9);
  // The steps did something: clipping was active and the parameters moved.
  CHECK(single_m[0].grad_norm > 0.05);
  CHECK(!single.named_tensors()[0].second.equal(base.named_tensors()[0].second));
  std::printf("%-28s 2 ranks vs 1 process: worst parameter %.2e, worst metric %.2e (relative)\n", c.name, worst_param, worst_metric);
}

void test_broadcast() {
  const ModelConfig cfg = tiny_config("qwen3", 29);
  std::vector<Model> models{Model(cfg, at::kFloat), Model(cfg, at::kFloat)};
  models[0].init_weights(1);
  models[1].init_weights(2);
  const Model expect = models[0].clone(at::kFloat);
  const int port = free_port();
  std::string errors[2];
  auto rank_main = [&](int r) {
    try {
      auto g = D::Group::create(D::Config{r, 2, "127.0.0.1", port, std::chrono::milliseconds(30000)});
      broadcast_parameters(models[r], *g, 0);
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  CHECK(errors[0].empty() && errors[1].empty());
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < expect.named_tensors().size(); ++i)
      CHECK(models[r].named_tensors()[i].second.equal(expect.named_tensors()[i].second));
}

}  // namespace

int main() {
  at::set_num_threads(1);
  if (!D::have_gloo()) {
    std::printf("(built without Gloo: skipped)\n");
    return arpo_test::summary();
  }
  test_case({"flat token-mean", Form::Flat, LossMode::Policy, K::Aggregation::TokenMean, 0.f});
  test_case({"flat seq-mean-token-mean + kl", Form::Flat, LossMode::Policy, K::Aggregation::SeqMeanTokenMean, 0.05f});
  test_case({"sft", Form::Flat, LossMode::SFT, K::Aggregation::TokenMean, 0.f});
  test_case({"tree token-mean + kl", Form::Tree, LossMode::Policy, K::Aggregation::TokenMean, 0.05f});
  test_broadcast();
  return arpo_test::summary();
}
