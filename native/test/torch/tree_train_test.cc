// Tests of training on packed rollout trees (torch/tree.h, train_tree_step)
// against the flat path on the flattened trajectories, on the same inputs:
// the logits of every token (float64 model 1e-9, float32 1e-4) for each model
// type, scoring, and one optimiser step's loss, metrics and every parameter
// gradient over all aggregations, dual clip on/off, each KL type, entropy
// bonus, soft and hard attribution, micro-batch splits with recomputed
// ancestor context and a chunked LM head; AdamW parameters after 3 steps.
// The copy sums are built here naively, copy by copy (no tree kernel).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <set>

#include "test/check.h"
#include "tiny_model.h"
#include "torch/engine.h"
#include "torch/trainer.h"
#include "torch/tree.h"

using namespace arpo::model;
namespace K = arpo::kernels;
using arpo_test::tiny_config;
using arpo_test::tolerance_ratio;

namespace {

// A forest in topological order with its flattened trajectories.
struct Forest {
  std::vector<int32_t> tokens, parent;
  std::vector<int64_t> node_tokens, node_offset;
  std::vector<int32_t> leaves;                 // leaf node per trajectory
  std::vector<std::vector<int32_t>> paths;     // root-to-leaf nodes per trajectory
  std::vector<std::vector<int64_t>> path_idx;  // packed token indices along each trajectory
};

void finish(Forest& f) {
  const size_t K = f.parent.size();
  f.node_offset.assign(K + 1, 0);
  for (size_t k = 0; k < K; ++k) f.node_offset[k + 1] = f.node_offset[k] + f.node_tokens[k];
  std::vector<int> children(K, 0);
  for (size_t k = 0; k < K; ++k)
    if (f.parent[k] >= 0) ++children[f.parent[k]];
  f.leaves.clear();
  f.paths.clear();
  f.path_idx.clear();
  for (size_t k = 0; k < K; ++k) {
    if (children[k] != 0) continue;
    std::vector<int32_t> path;
    for (int32_t a = static_cast<int32_t>(k); a >= 0; a = f.parent[a]) path.push_back(a);
    std::reverse(path.begin(), path.end());
    std::vector<int64_t> idx;
    for (int32_t n : path)
      for (int64_t i = f.node_offset[n]; i < f.node_offset[n + 1]; ++i) idx.push_back(i);
    f.leaves.push_back(static_cast<int32_t>(k));
    f.paths.push_back(path);
    f.path_idx.push_back(idx);
  }
}

// Random trees of depth <= max_depth: roots of 1-6 tokens (the prompt),
// nodes of 0 (an empty-response leaf or a branch point), 1 or 2-5 tokens.
// preorder: nodes in depth-first order; else breadth-first (still topological).
Forest random_forest(std::mt19937& g, int roots, int max_depth, int64_t vocab, bool preorder) {
  struct N {
    int32_t parent;
    std::vector<int32_t> tokens;
    std::vector<int> kids;
  };
  std::vector<N> nodes;
  std::function<int(int32_t, int)> grow = [&](int32_t parent, int depth) {
    const int id = static_cast<int>(nodes.size());
    nodes.push_back({parent, {}, {}});
    const int r = static_cast<int>(g() % 20);
    const int n = parent < 0 ? 1 + static_cast<int>(g() % 6) : r < 3 ? 0 : r < 8 ? 1 : 2 + static_cast<int>(g() % 4);
    for (int i = 0; i < n; ++i) nodes[id].tokens.push_back(static_cast<int32_t>(g() % vocab));
    const int kids = depth >= max_depth ? 0 : depth == 0 ? 1 + static_cast<int>(g() % 3) : static_cast<int>(g() % 3);
    for (int c = 0; c < kids; ++c) {
      const int child = grow(id, depth + 1);
      nodes[id].kids.push_back(child);
    }
    return id;
  };
  std::vector<int> root_ids;
  for (int r = 0; r < roots; ++r) root_ids.push_back(grow(-1, 0));
  // Order: grow() numbers nodes depth-first already; breadth-first renumbers.
  std::vector<int> order;
  if (preorder) {
    for (size_t i = 0; i < nodes.size(); ++i) order.push_back(static_cast<int>(i));
  } else {
    std::vector<int> queue = root_ids;
    for (size_t q = 0; q < queue.size(); ++q)
      for (int c : nodes[queue[q]].kids) queue.push_back(c);
    order = queue;
  }
  std::vector<int32_t> new_id(nodes.size());
  for (size_t i = 0; i < order.size(); ++i) new_id[order[i]] = static_cast<int32_t>(i);
  Forest f;
  for (int old : order) {
    const N& n = nodes[old];
    f.parent.push_back(n.parent < 0 ? -1 : new_id[n.parent]);
    f.node_tokens.push_back(static_cast<int64_t>(n.tokens.size()));
    f.tokens.insert(f.tokens.end(), n.tokens.begin(), n.tokens.end());
  }
  finish(f);
  return f;
}

MicroBatch flat_batch(const Forest& f) {
  MicroBatch mb;
  for (const auto& idx : f.path_idx) {
    mb.lengths.push_back(static_cast<int64_t>(idx.size()));
    for (int64_t i : idx) mb.tokens.push_back(f.tokens[i]);
  }
  return mb;
}

at::Tensor flat_logits(const Model& m, const MicroBatch& mb) {
  at::NoGradGuard ng;
  PackedSequences p = pack_sequences(mb.tokens, mb.lengths, m.config().vocab_size, 4096, "test");
  return m.logits(m.forward_hidden(p.ids, p.positions, packed_causal_attention(p.offsets)));
}

at::Tensor tree_logits(const Model& m, const Forest& f) {
  at::NoGradGuard ng;
  PackedTree t = pack_tree(f.tokens, f.parent, f.node_tokens, m.config().vocab_size, 4096, "test");
  return m.logits(m.forward_hidden(t.ids, t.positions, tree_attention(t)));
}

// Every token's logits in the packed forest equal those of each of its
// flattened copies; scoring (logprob, entropy of each target) likewise.
void test_forward_matches_flat() {
  int cases = 0;
  for (const char* type : {"qwen2", "qwen3", "llama"}) {
    for (at::ScalarType dt : {at::kDouble, at::kFloat}) {
      Model m(tiny_config(type, 61), dt);
      m.init_weights(3);
      const double tol = dt == at::kDouble ? 1e-9 : 1e-4;
      std::mt19937 g(11 + cases);
      for (int trial = 0; trial < 6; ++trial) {
        const int depth = 1 + trial % 5;
        Forest f = random_forest(g, 1 + trial % 2, depth, 61, trial % 3 != 2);
        MicroBatch mb = flat_batch(f);
        at::Tensor lf = flat_logits(m, mb).to(at::kDouble), lt = tree_logits(m, f).to(at::kDouble);
        double worst = 0;
        int64_t row = 0;
        for (const auto& idx : f.path_idx)
          for (int64_t i : idx) worst = std::max(worst, tolerance_ratio(lt[i], lf[row++], tol, tol));
        CHECK(worst <= 1.0);
        if (worst > 1.0) std::fprintf(stderr, "  %s %s trial %d: worst %.3g\n", type, at::toString(dt), trial, worst);

        // Scoring: the flat path's logprob / entropy of every copy.
        PackedSequences ps = pack_sequences(mb.tokens, mb.lengths, 61, 4096, "test");
        PackedTree pt = pack_tree(f.tokens, f.parent, f.node_tokens, 61, 4096, "test");
        TokenStats sf = score_sequences(m, ps, 1.3f, 1), st = score_tree(m, pt, 1.3f, 1);
        double bad = 0;
        row = 0;
        for (const auto& idx : f.path_idx) {
          for (size_t j = 0; j < idx.size(); ++j, ++row) {
            if (j == 0) continue;  // a sequence's first token is predicted by nothing
            bad = std::max(bad, std::fabs(sf.logprobs[row] - st.logprobs[idx[j]]) / (1e-5 + 1e-5 * std::fabs(sf.logprobs[row])));
            bad = std::max(bad, std::fabs(sf.entropies[row] - st.entropies[idx[j]]) / (1e-5 + 1e-5 * sf.entropies[row]));
          }
        }
        CHECK(bad <= 1.0);
        // A wanted subset scores only those tokens.
        std::vector<uint8_t> wanted(f.tokens.size(), 0);
        for (size_t i = 0; i < wanted.size(); i += 2) wanted[i] = 1;
        TokenStats sw = score_tree(m, pt, 1.3f, 1, wanted);
        bool ok = true;
        for (size_t i = 0; i < wanted.size(); ++i)
          ok = ok && (wanted[i] ? std::fabs(sw.logprobs[i] - st.logprobs[i]) <= 1e-5f * (1 + std::fabs(st.logprobs[i]))
                                : sw.logprobs[i] == 0.0f && sw.entropies[i] == 0.0f);
        CHECK(ok);
        ++cases;
      }
    }
  }
  CHECK(cases == 36);
}

// Children that start with different tokens: the parent's last row predicts
// each child's first token, and the targets say so.
void test_targets_of_branches() {
  // root [5 6] -> a [7 8], b [9], c [] -> d [4]   (c empty: d is predicted by the root's last token)
  PackedTree t = pack_tree({5, 6, 7, 8, 9, 4}, {-1, 0, 0, 0, 3}, {2, 2, 1, 0, 1}, 10, 100, "test");
  CHECK(t.row_of_token == (std::vector<int64_t>{-1, 0, 1, 2, 1, 1}));
  CHECK(t.targets == (std::vector<int32_t>{6, 7, 8, 9, 4}));
  std::vector<int64_t> pos(t.positions.data_ptr<int64_t>(), t.positions.data_ptr<int64_t>() + 6);
  CHECK(pos == (std::vector<int64_t>{0, 1, 2, 3, 2, 2}));
  CHECK(t.chains.size() == 3 && t.chains_in_order);  // root-a, b, c-d
  CHECK(t.chains[1].q_offset == 2 && t.chains[2].q_offset == 2);
}

void test_errors() {
  CHECK_THROWS(pack_tree({1, 2}, {-1, 1}, {1, 1}, 10, 100, "t"), "parent[1] = 1 must be -1 (a root) or an earlier node");
  CHECK_THROWS(pack_tree({1, 2}, {-1, -1}, {2, 0}, 10, 100, "t"), "nodeTokens[1] = 0 must be at least 1");
  CHECK_THROWS(pack_tree({1, 2}, {-1, 0}, {1, -1}, 10, 100, "t"), "nodeTokens[1] = -1 must be >= 0");
  CHECK_THROWS(pack_tree({1, 2, 3}, {-1, 0}, {1, 1}, 10, 100, "t"), "node token counts sum to 2 but 3 tokens");
  CHECK_THROWS(pack_tree({1, 12}, {-1, 0}, {1, 1}, 10, 100, "t"), "token 1 is 12");
  CHECK_THROWS(pack_tree({1, 2, 3}, {-1, 0}, {2, 1}, 10, 2, "t"), "node 1 reaches position 3, beyond the model's 2");
  CHECK_THROWS(pack_tree({1}, {-1, 0}, {1}, 10, 100, "t"), "expected 2 node token counts");

  Model m(tiny_config("qwen2", 17), at::kFloat);
  m.init_weights(1);
  AdamW opt(m.named_tensors());
  TreeMicroBatch mb;
  mb.tokens = {1, 2, 3};
  mb.parent = {-1, 0};
  mb.node_tokens = {1, 2};
  mb.old_logprobs.assign(3, -1.0f);
  for (auto* v : {&mb.adv_pos, &mb.adv_neg, &mb.weight, &mb.count_pos, &mb.count_neg, &mb.count}) v->assign(3, 0.0);
  mb.adv_neg.pop_back();
  K::PolicyLossConfig cfg;
  OptimConfig oc;
  at::Tensor before = m.named_tensors()[0].second.clone();
  CHECK_THROWS(train_tree_step(m, opt, {mb}, cfg, oc, nullptr, 1), "micro-batch 0: expected 3 values for advNeg but received 2");
  mb.adv_neg.push_back(0.0);
  mb.weight[0] = 1.0;  // a root's first token carries loss terms
  CHECK_THROWS(train_tree_step(m, opt, {mb}, cfg, oc, nullptr, 1), "token 0 starts a root");
  mb.weight[0] = 0.0;
  cfg.kl_coef = 0.1f;
  CHECK_THROWS(train_tree_step(m, opt, {mb}, cfg, oc, nullptr, 1), "neither refLogprobs nor a reference model");
  CHECK(m.named_tensors()[0].second.equal(before) && opt.steps() == 0);  // nothing touched
}

// Per-token inputs of a forest shared by every copy of a token, and per
// trajectory the advantage.
struct Rollout {
  std::vector<float> loss_mask, old_logprobs;  // per packed token
  std::vector<float> leaf_adv;                 // per trajectory
};

Rollout random_rollout(std::mt19937& g, const Forest& f) {
  std::normal_distribution<float> nd;
  Rollout r;
  const size_t N = f.tokens.size();
  r.loss_mask.assign(N, 0.0f);
  r.old_logprobs.assign(N, 0.0f);
  for (size_t k = 0; k < f.parent.size(); ++k) {
    const bool tool = f.parent[k] >= 0 && g() % 4 == 0;  // a tool result: context
    for (int64_t i = f.node_offset[k]; i < f.node_offset[k + 1]; ++i) {
      r.loss_mask[i] = f.parent[k] < 0 || tool ? 0.0f : 1.0f;
      r.old_logprobs[i] = -3.5f + 0.4f * nd(g);
    }
  }
  for (size_t l = 0; l < f.leaves.size(); ++l) {
    const int c = static_cast<int>(g() % 5);
    r.leaf_adv.push_back(c == 0 ? 0.0f : (c % 2 ? 1.0f : -1.0f) * (0.2f + std::fabs(nd(g))));
  }
  return r;
}

// Leaves (trajectory indices) under each node.
std::vector<std::vector<int>> leaves_under(const Forest& f) {
  std::vector<std::vector<int>> out(f.parent.size());
  for (size_t l = 0; l < f.paths.size(); ++l)
    for (int32_t n : f.paths[l]) out[n].push_back(static_cast<int>(l));
  return out;
}

int32_t node_of(const Forest& f, int64_t i) {
  return static_cast<int32_t>(std::upper_bound(f.node_offset.begin(), f.node_offset.end(), i) - f.node_offset.begin() - 1);
}

// The flat micro-batch of every trajectory (verl's layout: one sequence per
// trajectory, mask = loss mask, soft: the trajectory's advantage; hard: the
// node's mean advantage with mask 1/d, as lib/train/batch.ts builds them).
MicroBatch flat_train_batch(const Forest& f, const Rollout& r, bool hard) {
  auto under = leaves_under(f);
  MicroBatch mb = flat_batch(f);
  for (size_t l = 0; l < f.path_idx.size(); ++l) {
    for (int64_t i : f.path_idx[l]) {
      const auto& u = under[node_of(f, i)];
      float adv = r.leaf_adv[l], mask = r.loss_mask[i];
      if (hard) {
        double s = 0;
        for (int j : u) s += r.leaf_adv[j];
        adv = static_cast<float>(s / static_cast<double>(u.size()));
        mask = static_cast<float>(r.loss_mask[i] / static_cast<double>(u.size()));
      }
      mb.advantages.push_back(adv);
      mb.mask.push_back(mask);
      mb.old_logprobs.push_back(r.old_logprobs[i]);
    }
  }
  return mb;
}

// Copy sums per packed token, copy by copy, from the flat batch itself.
struct Sums {
  std::vector<double> pos, neg, weight, cpos, cneg, count;
};
Sums naive_sums(const Forest& f, const MicroBatch& flat, K::Aggregation agg) {
  const size_t N = f.tokens.size();
  Sums s;
  for (auto* v : {&s.pos, &s.neg, &s.weight, &s.cpos, &s.cneg, &s.count}) v->assign(N, 0.0);
  size_t row = 0;
  for (size_t l = 0; l < f.path_idx.size(); ++l) {
    const auto& idx = f.path_idx[l];
    double len = 0;
    for (size_t j = 1; j < idx.size(); ++j) len += flat.mask[row + j];
    for (size_t j = 0; j < idx.size(); ++j, ++row) {
      if (j == 0) continue;
      const double m = flat.mask[row], a = flat.advantages[row];
      const double w = agg == K::Aggregation::SeqMeanTokenMean ? (len > 0 ? m / len : 0.0) : m;
      const int64_t i = idx[j];
      if (a > 0) s.pos[i] += w * a, s.cpos[i] += m;
      if (a < 0) s.neg[i] += w * a, s.cneg[i] += m;
      s.weight[i] += w;
      s.count[i] += m;
    }
  }
  return s;
}

// The sub-forest of the nodes in `keep` (closed under ancestors), renumbered
// in the original order, with the copy sums of the tokens in `owned` and
// zeros (context) elsewhere.
TreeMicroBatch sub_batch(const Forest& f, const std::vector<bool>& keep, const std::vector<bool>& owned,
                         const std::vector<float>& old_lp, const Sums& s, int64_t sequences) {
  TreeMicroBatch mb;
  std::vector<int32_t> id(f.parent.size(), -1);
  for (size_t k = 0; k < f.parent.size(); ++k) {
    if (!keep[k]) continue;
    id[k] = static_cast<int32_t>(mb.parent.size());
    mb.parent.push_back(f.parent[k] < 0 ? -1 : id[f.parent[k]]);
    mb.node_tokens.push_back(f.node_tokens[k]);
    for (int64_t i = f.node_offset[k]; i < f.node_offset[k + 1]; ++i) {
      const bool own = owned[i];
      mb.tokens.push_back(f.tokens[i]);
      mb.old_logprobs.push_back(old_lp[i]);
      mb.adv_pos.push_back(own ? s.pos[i] : 0.0);
      mb.adv_neg.push_back(own ? s.neg[i] : 0.0);
      mb.weight.push_back(own ? s.weight[i] : 0.0);
      mb.count_pos.push_back(own ? s.cpos[i] : 0.0);
      mb.count_neg.push_back(own ? s.cneg[i] : 0.0);
      mb.count.push_back(own ? s.count[i] : 0.0);
    }
  }
  mb.sequences = sequences;
  return mb;
}

// The forest in one micro-batch, or split in two by trajectories: the second
// holds its trajectories' full paths, and the tokens the first already owns
// are context there (recomputed with gradient, no loss terms of their own).
std::vector<TreeMicroBatch> tree_batches(const Forest& f, const Rollout& r, const Sums& s, bool split) {
  const size_t K = f.parent.size(), L = f.paths.size();
  const size_t cut = split ? std::max<size_t>(1, L / 2) : L;
  std::vector<TreeMicroBatch> out;
  std::vector<bool> owned_before(f.tokens.size(), false);
  for (size_t lo = 0; lo < L; lo = lo == 0 ? cut : L) {
    const size_t hi = lo == 0 ? cut : L;
    std::vector<bool> keep(K, false), owned(f.tokens.size(), false);
    for (size_t l = lo; l < hi; ++l)
      for (int32_t n : f.paths[l]) keep[n] = true;
    for (size_t i = 0; i < f.tokens.size(); ++i)
      if (keep[node_of(f, static_cast<int64_t>(i))] && !owned_before[i]) owned[i] = owned_before[i] = true;
    out.push_back(sub_batch(f, keep, owned, r.old_logprobs, s, static_cast<int64_t>(hi - lo)));
  }
  return out;
}

// Loss, metrics and every parameter gradient of one step: tree vs flat. The
// gradient is read through one AdamW step with lr = eps = 1e6, no decay, no
// clipping: p - p' = g / (1 + |g| / 1e6), the gradient to 1e-6 of itself.
void test_step_matches_flat() {
  int cases = 0, worst_case = -1;
  double worst_all = 0;
  const K::Aggregation aggs[] = {K::Aggregation::TokenMean, K::Aggregation::SeqMeanTokenMean,
                                 K::Aggregation::SeqMeanTokenSum, K::Aggregation::SeqMeanTokenSumNorm};
  const K::KLType kls[] = {K::KLType::K1, K::KLType::K2, K::KLType::K3, K::KLType::ABS};
  const char* types[] = {"qwen2", "qwen3", "llama"};
  for (int ai = 0; ai < 4; ++ai) {
    for (int hard = 0; hard < 2; ++hard) {
      for (int dual = 0; dual < 2; ++dual) {
        const int v = ai * 4 + hard * 2 + dual;
        ModelConfig c = tiny_config(types[v % 3], 47);
        Model base(c, at::kDouble);
        base.init_weights(20 + v);
        Model reference = base.clone(at::kDouble);
        reference.init_weights(90 + v);
        std::mt19937 g(400 + v);
        Forest f;
        Rollout r;
        MicroBatch flat;
        do {  // a forest with some action tokens
          f = random_forest(g, 1 + v % 2, 2 + v % 4, 47, v % 4 != 3);
          r = random_rollout(g, f);
          flat = flat_train_batch(f, r, hard);
        } while (std::count(flat.mask.begin(), flat.mask.end(), 0.0f) + 3 > static_cast<long>(flat.mask.size()));
        K::PolicyLossConfig cfg;
        cfg.aggregation = aggs[ai];
        cfg.norm_constant = 7.0;
        cfg.dual_clip_c = dual ? 2.0f : 0.0f;
        cfg.clip_low = 0.1f, cfg.clip_high = 0.15f;  // tight, so both bounds clip
        cfg.kl_type = kls[v % 4];
        cfg.kl_coef = v % 5 == 4 ? 0.0f : 0.3f;
        cfg.entropy_coef = v % 3 == 0 ? 0.0f : 0.05f;
        cfg.temperature = v % 2 ? 1.0f : 0.8f;
        Sums s = naive_sums(f, flat, cfg.aggregation);
        const bool split = v % 2 == 1;
        std::vector<TreeMicroBatch> tb = tree_batches(f, r, s, split);
        OptimConfig oc;
        oc.lr = 1e6, oc.eps = 1e6, oc.weight_decay = 0, oc.max_grad_norm = 0;
        Model mf = base.clone(at::kDouble), mt = base.clone(at::kDouble);
        AdamW of(mf.named_tensors()), ot(mt.named_tensors());
        TrainMetrics rf = train_step(mf, of, {flat}, cfg, LossMode::Policy, oc, &reference, 1);
        TrainMetrics rt = train_tree_step(mt, ot, tb, cfg, oc, &reference, 1, v % 3 == 1 ? 3 : 0);
        CHECK_CLOSE(rt.loss, rf.loss, 1e-9, 1e-6);
        CHECK_CLOSE(rt.pg_loss, rf.pg_loss, 1e-9, 1e-6);
        CHECK_CLOSE(rt.pg_clipfrac, rf.pg_clipfrac, 1e-9, 1e-6);
        CHECK_CLOSE(rt.pg_clipfrac_lower, rf.pg_clipfrac_lower, 1e-9, 1e-6);
        CHECK_CLOSE(rt.ppo_kl, rf.ppo_kl, 1e-9, 1e-6);
        CHECK_CLOSE(rt.entropy, rf.entropy, 1e-9, 1e-6);
        CHECK_CLOSE(rt.kl, rf.kl, 1e-9, 1e-6);
        CHECK_CLOSE(rt.tokens, rf.tokens, 1e-9, 1e-9);
        CHECK_CLOSE(rt.grad_norm, rf.grad_norm, 1e-9, 1e-6);
        CHECK(rf.tokens > 0 && rf.grad_norm > 0);
        // Every parameter's gradient, relative to the largest entry of that parameter's.
        double worst = 0;
        for (size_t i = 0; i < base.named_tensors().size(); ++i) {
          at::Tensor p0 = base.named_tensors()[i].second;
          at::Tensor gf = p0 - mf.named_tensors()[i].second, gt = p0 - mt.named_tensors()[i].second;
          const double scale = gf.abs().max().item<double>();
          worst = std::max(worst, ((gt - gf).abs() / (1e-6 * scale + 1e-6 * gf.abs() + 1e-300)).max().item<double>());
        }
        CHECK(worst <= 1.0);
        if (worst > worst_all) worst_all = worst, worst_case = v;
        ++cases;
      }
    }
  }
  CHECK(cases == 16);
  std::printf("step tree vs flat: worst gradient error %.3g of the bound (case %d)\n", worst_all, worst_case);
}

// Three AdamW steps on the same trees: the parameters stay equal.
void test_three_steps() {
  ModelConfig c = tiny_config("qwen3", 43);
  Model base(c, at::kDouble);
  base.init_weights(5);
  std::mt19937 g(77);
  Forest f = random_forest(g, 2, 4, 43, true);
  Rollout r = random_rollout(g, f);
  MicroBatch flat = flat_train_batch(f, r, false);
  K::PolicyLossConfig cfg;
  cfg.aggregation = K::Aggregation::SeqMeanTokenMean;
  cfg.entropy_coef = 0.01f;
  Sums s = naive_sums(f, flat, cfg.aggregation);
  std::vector<TreeMicroBatch> tb = tree_batches(f, r, s, true);
  OptimConfig oc;
  oc.lr = 1e-3, oc.eps = 1e-3;  // eps: a near-zero entry's float32 noise cannot move it by lr
  Model mf = base.clone(at::kDouble), mt = base.clone(at::kDouble);
  AdamW of(mf.named_tensors()), ot(mt.named_tensors());
  for (int step = 0; step < 3; ++step) {
    TrainMetrics rf = train_step(mf, of, {flat}, cfg, LossMode::Policy, oc, nullptr, 1);
    TrainMetrics rt = train_tree_step(mt, ot, tb, cfg, oc, nullptr, 1);
    CHECK_CLOSE(rt.loss, rf.loss, 1e-9, 1e-6);
  }
  double worst = 0;
  for (size_t i = 0; i < mf.named_tensors().size(); ++i)
    worst = std::max(worst, tolerance_ratio(mt.named_tensors()[i].second, mf.named_tensors()[i].second, 1e-7, 1e-6));
  CHECK(worst <= 1.0);
  CHECK(ot.steps() == 3);
  CHECK(!mt.named_tensors()[0].second.equal(base.named_tensors()[0].second));
}

}  // namespace

int main() {
  at::set_num_threads(1);
  test_targets_of_branches();
  test_errors();
  test_forward_matches_flat();
  test_step_matches_flat();
  test_three_steps();
  return arpo_test::summary();
}
