// Tests of the decoder and the generation engine: forward against a looped
// float64 reference (qwen2, qwen3, llama3 rope), KV-cache decode against the
// full forward, forks, copy-on-write, refcounts, batch-order independence.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>

#include "test/check.h"
#include "torch/engine.h"
#include "torch/model.h"
#include "tiny_model.h"

using namespace arpo::model;
using arpo_test::tiny_config;
using arpo_test::random_tokens;
using arpo_test::tolerance_ratio;

namespace {

// Full-sequence logits (L, V) through the packed training forward.
at::Tensor full_logits(const Model& m, const std::vector<int32_t>& tokens) {
  at::NoGradGuard g;
  PackedSequences p = pack_sequences(tokens, {static_cast<int64_t>(tokens.size())}, m.config().vocab_size, 1 << 20, "test");
  at::Tensor h = m.forward_hidden(p.ids, p.positions, packed_causal_attention(p.offsets));
  return m.logits(h).to(at::kDouble);
}

void test_config_validation() {
  ModelConfig c = tiny_config("qwen2");
  c.model_type = "gpt2";
  CHECK_THROWS(c.validate(), "model_type");
  c = tiny_config("qwen2");
  c.num_key_value_heads = 3;
  CHECK_THROWS(c.validate(), "expected a divisor of num_attention_heads for num_key_value_heads but received 3");
  c = tiny_config("llama");
  c.rope_scaling.type = "yarn";
  CHECK_THROWS(c.validate(), "rope_scaling.rope_type");
  CHECK_THROWS(parse_dtype("float16"), "dtype");
}

void test_forward_matches_reference() {
  for (const char* type : {"qwen2", "qwen3", "llama", "linear"}) {
    const bool linear = std::string(type) == "linear";
    ModelConfig c = tiny_config(linear ? "qwen2" : type);
    if (linear) {
      c.rope_scaling.type = "linear";
      c.rope_scaling.factor = 2.5;
    }
    Model m64(c, at::kDouble);
    m64.init_weights(7);
    arpo_test::perturb_all(m64, 8);
    const auto tokens = random_tokens(70, c.vocab_size, 3);  // > original_max_position_embeddings for llama3
    at::Tensor ref = arpo_test::reference_forward(m64, tokens);
    const double r64 = tolerance_ratio(full_logits(m64, tokens), ref, 1e-10, 1e-9);
    CHECK(r64 <= 1.0);
    Model m32 = m64.clone(at::kFloat);
    const double r32 = tolerance_ratio(full_logits(m32, tokens), ref, 1e-4, 1e-4);
    CHECK(r32 <= 1.0);
    Model mbf = m64.clone(at::kBFloat16);
    // bf16 compute against the reference on the bf16-rounded weights.
    at::Tensor ref_bf = arpo_test::reference_forward(mbf.clone(at::kDouble), tokens);
    // bf16 rounds every activation (8 bits of mantissa): relative L2 error
    // ||out - ref|| / ||ref|| within 3% (reported as a ratio to that bound).
    const double rbf = (full_logits(mbf, tokens) - ref_bf).norm().item<double>() / ref_bf.norm().item<double>() / 0.03;
    CHECK(rbf <= 1.0);
    std::printf("  %s forward vs loop reference: f64 %.2g, f32 %.2g, bf16 %.2g (<= 1 passes)\n", type, r64, r32, rbf);
  }
  // Same seed, same weights in every dtype (drawn in float32, then cast).
  ModelConfig c = tiny_config("qwen2");
  Model a(c, at::kFloat), b(c, at::kDouble);
  a.init_weights(11);
  b.init_weights(11);
  CHECK(tolerance_ratio(a.named_tensors()[2].second, b.named_tensors()[2].second, 1e-12, 1e-12) <= 1.0);
  // Norms start at 1, biases at 0.
  CHECK(a.named_tensors()[1].first == "model.layers.0.input_layernorm.weight");
  CHECK(a.named_tensors()[1].second.eq(1).all().item<bool>());
  CHECK(a.named_tensors()[3].first == "model.layers.0.self_attn.q_proj.bias");
  CHECK(a.named_tensors()[3].second.eq(0).all().item<bool>());
}

void test_load_tensors() {
  ModelConfig c = tiny_config("qwen2");
  Model src(c, at::kFloat);
  src.init_weights(5);
  Model dst(c, at::kFloat);
  NamedTensors ts;
  for (const auto& [n, t] : src.named_tensors()) ts.emplace_back(n, t.to(at::kBFloat16));  // dtype cast on load
  ts.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", at::zeros({8}));       // ignored
  dst.load_tensors(ts);
  CHECK(tolerance_ratio(dst.named_tensors()[2].second, src.named_tensors()[2].second, 0, 1e-2) <= 1.0);
  NamedTensors bad = ts;
  bad[2].second = at::zeros({3, 5});
  CHECK_THROWS(dst.load_tensors(bad), "tensor " + bad[2].first + ": expected shape (32, 32) but received (3, 5)");
  bad = ts;
  bad.erase(bad.begin() + 4);
  CHECK_THROWS(dst.load_tensors(bad), "missing tensor " + ts[4].first + " (expected shape");
  bad = ts;
  bad.emplace_back("model.layers.9.mlp.up_proj.weight", at::zeros({1}));
  CHECK_THROWS(dst.load_tensors(bad), "unexpected tensor model.layers.9.mlp.up_proj.weight");
  // A tied model ignores a stored lm_head.weight.
  ModelConfig ct = tiny_config("qwen3");
  Model tied(ct, at::kFloat);
  NamedTensors tt = tied.named_tensors();
  tt.emplace_back("lm_head.weight", at::zeros({ct.vocab_size, ct.hidden_size}));
  tied.load_tensors(tt);
  CHECK(true);
}

// Decode with the KV cache, one token (or a chunk) at a time, equals the full forward.
void test_incremental_decode() {
  for (const char* type : {"qwen2", "qwen3", "llama"}) {
    ModelConfig c = tiny_config(type);
    Model m(c, at::kFloat);
    m.init_weights(21);
    const auto tokens = random_tokens(40, c.vocab_size, 9);
    at::Tensor full = full_logits(m, tokens);
    Engine e(m, KVCache::Options{4, 2, 0}, 1);  // tiny pool: forces growth
    const int32_t p = e.cache().new_path(1);
    // Prefill 7 tokens, then chunks of 1, 3, 1, 5, ... to the end.
    size_t pos = 0;
    const int64_t chunks[] = {7, 1, 3, 1, 5, 1, 1, 9, 1, 2};
    double worst = 0;
    for (size_t ci = 0; pos < tokens.size(); ++ci) {
      const size_t n = std::min<size_t>(chunks[ci % 10], tokens.size() - pos);
      std::vector<int32_t> in(tokens.begin() + pos, tokens.begin() + pos + n);
      at::Tensor lg = e.extend_logits({p}, {in});
      pos += n;
      worst = std::max(worst, tolerance_ratio(lg[0], full[pos - 1], 1e-5, 1e-5));
    }
    CHECK(worst <= 1.0);
    CHECK(e.cache().length(p) == 40);
    std::printf("  %s incremental decode vs full forward: %.2g (<= 1 passes)\n", type, worst);
  }
}

// Forks: shared prefix, copy-on-write of the partial block, parent undisturbed.
void test_fork_copy_on_write() {
  ModelConfig c = tiny_config("qwen2");
  Model m(c, at::kFloat);
  m.init_weights(33);
  Engine e(m, KVCache::Options{4, 8, 0}, 1);
  KVCache& kv = e.cache();
  const auto prefix = random_tokens(10, c.vocab_size, 1);  // blocks: [0..3] [4..7] [8..9 partial]
  const int32_t parent = kv.new_path(0);
  e.extend_logits({parent}, {prefix});
  const auto used_before = kv.stats().blocks_used;
  const int32_t child = kv.fork(parent, 10, 1);
  CHECK(kv.stats().blocks_used == used_before);  // forking allocates nothing
  CHECK(kv.block_refcount(parent, 9) == 2);
  CHECK(kv.length(child) == 10);
  // Child writes first into the shared partial block: it gets a private copy.
  const std::vector<int32_t> child_tail = {5, 6, 7};
  at::Tensor child_lg = e.extend_logits({child}, {child_tail});
  CHECK(kv.block_refcount(parent, 9) == 1);
  CHECK(kv.block_refcount(child, 9) == 1);
  CHECK(kv.block_refcount(parent, 0) == 2);  // full blocks stay shared
  std::vector<int32_t> child_seq = prefix;
  child_seq.insert(child_seq.end(), child_tail.begin(), child_tail.end());
  CHECK(tolerance_ratio(child_lg[0], full_logits(m, child_seq)[12], 1e-5, 1e-5) <= 1.0);
  // Parent continues as if the child never existed.
  const std::vector<int32_t> parent_tail = {11, 12};
  at::Tensor parent_lg = e.extend_logits({parent}, {parent_tail});
  std::vector<int32_t> parent_seq = prefix;
  parent_seq.insert(parent_seq.end(), parent_tail.begin(), parent_tail.end());
  CHECK(tolerance_ratio(parent_lg[0], full_logits(m, parent_seq)[11], 1e-5, 1e-5) <= 1.0);

  // Fork mid-block at 6 (block [4..7] shared by parent, child, child2; rows
  // 6, 7 are the parent's): child2 copies that block when it writes row 6.
  const int32_t child2 = kv.fork(parent, 6, 2);
  const std::vector<int32_t> more = {1, 2, 3};
  e.extend_logits({parent}, {more});  // parent writes at 12..14 (a new block 3)
  CHECK(kv.block_refcount(child2, 5) == 3);
  const std::vector<int32_t> child2_tail = {40, 41, 42, 43, 44};
  at::Tensor c2 = e.extend_logits({child2}, {child2_tail});
  std::vector<int32_t> c2_seq(prefix.begin(), prefix.begin() + 6);
  c2_seq.insert(c2_seq.end(), child2_tail.begin(), child2_tail.end());
  CHECK(tolerance_ratio(c2[0], full_logits(m, c2_seq)[10], 1e-5, 1e-5) <= 1.0);
  // ...and the parent's rows 6..9 were not overwritten by the child.
  std::vector<int32_t> p_seq = parent_seq;
  p_seq.insert(p_seq.end(), more.begin(), more.end());
  CHECK(kv.block_refcount(child2, 5) == 1 && kv.block_refcount(parent, 5) == 2);
  // Fork at the parent's full length 15 (partial block 3 shared); this time
  // the parent writes first and takes the copy, the child keeps the original.
  const int32_t child3 = kv.fork(parent, 15, 6);
  at::Tensor p_next = e.extend_logits({parent}, {{7}});
  CHECK(kv.block_refcount(child3, 14) == 1 && kv.block_refcount(parent, 14) == 1);
  std::vector<int32_t> c3_seq = p_seq;
  p_seq.push_back(7);
  CHECK(tolerance_ratio(p_next[0], full_logits(m, p_seq)[p_seq.size() - 1], 1e-5, 1e-5) <= 1.0);
  at::Tensor c3 = e.extend_logits({child3}, {{9}});
  c3_seq.push_back(9);
  CHECK(tolerance_ratio(c3[0], full_logits(m, c3_seq)[c3_seq.size() - 1], 1e-5, 1e-5) <= 1.0);

  // Fork at 0 and at a block boundary; free everything: the pool is empty.
  const int32_t empty = kv.fork(parent, 0, 3);
  CHECK(kv.length(empty) == 0);
  const int32_t boundary = kv.fork(child, 8, 4);
  e.extend_logits({boundary, empty}, {{3, 3}, {4}});
  CHECK_THROWS(kv.fork(parent, 99, 5), "prefixLength in [0, 16]");
  for (int32_t p : {parent, child, child2, child3, empty, boundary}) kv.free_path(p);
  CHECK(kv.stats().blocks_used == 0);
  CHECK(kv.stats().paths == 0);
  CHECK_THROWS(kv.length(parent), "unknown or freed path");
  CHECK_THROWS(e.extend_logits({parent}, {{1}}), "unknown or freed path");
}

// Mixed prefill + decode batch gives each path what it would get alone, and
// sampled tokens depend only on (seed, stream, position).
void test_batch_independence() {
  ModelConfig c = tiny_config("qwen3", 97);
  Model m(c, at::kFloat);
  m.init_weights(4);
  arpo::kernels::SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 1234;
  const int P = 5;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < P; ++i) prompts.push_back(random_tokens(3 + 2 * i, c.vocab_size, 100 + i));
  // Alone: each path in its own engine, prompt then 6 decode steps.
  std::vector<std::vector<int32_t>> alone(P);
  std::vector<std::vector<float>> alone_lp(P);
  for (int i = 0; i < P; ++i) {
    Engine e(m, KVCache::Options{4, 4, 0}, 1);
    const int32_t p = e.cache().new_path(50 + i);
    DecodeResult r = e.extend({p}, {prompts[i]}, sp);
    for (int s = 0; s < 6; ++s) {
      alone[i].push_back(r.tokens[0]);
      alone_lp[i].push_back(r.logprobs[0]);
      r = e.extend({p}, {{r.tokens[0]}}, sp);
    }
  }
  // Together, in a shuffled order each step, prompts of some paths arriving late.
  Engine e(m, KVCache::Options{4, 4, 0}, 1);
  std::vector<int32_t> ids(P);
  for (int i = 0; i < P; ++i) ids[i] = e.cache().new_path(50 + i);
  std::vector<std::vector<int32_t>> got(P);
  std::vector<int32_t> next(P, -1);
  std::mt19937 rng(5);
  bool ok_lp = true;
  for (int step = 0; step < 8; ++step) {
    std::vector<int> order;
    for (int i = 0; i < P; ++i)
      if (static_cast<int>(got[i].size()) < 6 && (next[i] >= 0 || step >= i % 3)) order.push_back(i);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int32_t> paths;
    std::vector<std::vector<int32_t>> inputs;
    for (int i : order) {
      paths.push_back(ids[i]);
      inputs.push_back(next[i] < 0 ? prompts[i] : std::vector<int32_t>{next[i]});
    }
    if (paths.empty()) continue;
    DecodeResult r = e.extend(paths, inputs, sp);
    for (size_t j = 0; j < order.size(); ++j) {
      const int i = order[j];
      ok_lp = ok_lp && std::fabs(r.logprobs[j] - alone_lp[i][got[i].size()]) <= 1e-4;
      got[i].push_back(r.tokens[j]);
      next[i] = r.tokens[j];
    }
  }
  for (int i = 0; i < P; ++i) CHECK(got[i] == alone[i]);
  CHECK(ok_lp);
  // A different seed changes the samples.
  sp.seed = 999;
  Engine e2(m, KVCache::Options{4, 4, 0}, 1);
  const int32_t q = e2.cache().new_path(50);
  std::vector<int32_t> other;
  DecodeResult r = e2.extend({q}, {prompts[0]}, sp);
  for (int s = 0; s < 6; ++s) {
    other.push_back(r.tokens[0]);
    r = e2.extend({q}, {{r.tokens[0]}}, sp);
  }
  CHECK(other != alone[0]);
}

void test_errors_and_limits() {
  ModelConfig c = tiny_config("qwen2");
  c.max_position_embeddings = 20;
  Model m(c, at::kFloat);
  m.init_weights(1);
  Engine e(m, KVCache::Options{4, 2, 3}, 1);  // at most 3 blocks = 12 tokens
  const int32_t a = e.cache().new_path(0);
  CHECK_THROWS(e.extend_logits({a}, {{}}), "inputs[0] (path 0) is empty");
  CHECK_THROWS(e.extend_logits({a}, {{999}}), "expected token ids in [0, 53) but inputs[0][0] is 999");
  CHECK_THROWS(e.extend_logits({a, a}, {{1}, {2}}), "path 0 appears twice");
  CHECK_THROWS(e.extend_logits({a}, {std::vector<int32_t>(21, 1)}), "beyond max_position_embeddings 20");
  CHECK_THROWS(e.extend_logits({a}, {std::vector<int32_t>(13, 1)}), "KV cache exhausted");
  // The failed call left the path usable.
  e.extend_logits({a}, {std::vector<int32_t>(12, 1)});
  CHECK(e.cache().length(a) == 12);
  e.cache().free_path(a);
  CHECK(e.cache().stats().blocks_used == 0);
}

// Cache-free scoring equals log_softmax of the full forward.
void test_score_sequences() {
  ModelConfig c = tiny_config("llama");
  Model m(c, at::kFloat);
  m.init_weights(8);
  const auto s1 = random_tokens(9, c.vocab_size, 1), s2 = random_tokens(4, c.vocab_size, 2);
  std::vector<int32_t> all = s1;
  all.insert(all.end(), s2.begin(), s2.end());
  PackedSequences p = pack_sequences(all, {9, 4}, c.vocab_size, 100, "test");
  TokenStats st = score_sequences(m, p, 0.7f, 1);
  bool ok = st.logprobs[0] == 0 && st.logprobs[9] == 0;
  for (int seq = 0; seq < 2; ++seq) {
    const auto& s = seq == 0 ? s1 : s2;
    at::Tensor ls = at::log_softmax(full_logits(m, s) / 0.7, -1);
    for (size_t t = 1; t < s.size(); ++t) {
      const double ref = ls[t - 1][s[t]].item<double>();
      at::Tensor pr = ls[t - 1].exp();
      const double ent = -(pr * ls[t - 1]).sum().item<double>();
      const size_t k = (seq == 0 ? 0 : 9) + t;
      ok = ok && std::fabs(st.logprobs[k] - ref) <= 1e-4 + 1e-4 * std::fabs(ref) &&
           std::fabs(st.entropies[k] - ent) <= 1e-4 + 1e-4 * ent;
    }
  }
  CHECK(ok);
  CHECK_THROWS(pack_sequences(all, {9, 3}, c.vocab_size, 100, "logprobs"), "sequence lengths sum to 12 but 13 tokens");
  CHECK_THROWS(pack_sequences(all, {13, 0}, c.vocab_size, 100, "logprobs"), "sequence 1 has 0");
}

// The Qwen vocabulary (151,936) with a tiny hidden size builds and decodes.
void test_large_vocab() {
  ModelConfig c = tiny_config("qwen2", 151936);
  c.hidden_size = 16;
  c.head_dim = 0;
  c.num_hidden_layers = 1;
  c.validate();
  Model m(c, at::kFloat);
  m.init_weights(2);
  Engine e(m, KVCache::Options{16, 4, 0}, 2);
  arpo::kernels::SamplingParams sp;
  sp.seed = 3;
  const int32_t p = e.cache().new_path(0);
  DecodeResult r = e.extend({p}, {{151935, 0, 77}}, sp);
  r = e.extend({p}, {{r.tokens[0]}}, sp);
  CHECK(r.tokens[0] >= 0 && r.tokens[0] < 151936);
  CHECK(r.norm_entropies[0] > 0.9f && r.norm_entropies[0] <= 1.0f);  // near-uniform at init
}

}  // namespace

int main() {
  at::set_num_threads(1);
  test_config_validation();
  test_forward_matches_reference();
  test_load_tensors();
  test_incremental_decode();
  test_fork_copy_on_write();
  test_batch_independence();
  test_errors_and_limits();
  test_score_sequences();
  test_large_vocab();
  return arpo_test::summary();
}
