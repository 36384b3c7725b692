// Tests of the device seam (torch/device.h): device names and their errors,
// the kernel dispatch point against direct kernel calls on the CPU (bitwise:
// the seam must not change a number), and, when this build has CUDA and a
// device is visible, a tiny model on cuda:0 against the same model on the CPU:
// forward logits, decoding with forks (greedy tokens equal), a flat train step
// with a KL reference and a tree train step (parameters after the update).
// Without CUDA the last part prints why it was skipped and the test passes on
// the rest.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test/check.h"
#include "tiny_model.h"
#include "torch/compat.h"
#include "torch/device.h"
#include "torch/engine.h"
#include "torch/trainer.h"
#include "torch/tree.h"

using namespace arpo::model;
namespace K = arpo::kernels;
using arpo_test::random_tokens;
using arpo_test::tiny_config;

namespace {

std::vector<float> random_floats(int64_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

void test_parse_device() {
  CHECK(parse_device("cpu").is_cpu());
  CHECK(device_name(parse_device("cpu")) == "cpu");
  for (const char* bad : {"gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", "cuda:0:1", "", " cpu", "cuda:123456"})
    CHECK_THROWS(parse_device(bad), std::string("expected cpu, cuda or cuda:N for model.device but received \"") + bad + "\"");
  CHECK_THROWS(parse_device("tpu", "options.device"), "for options.device");
  if (!cuda_build()) {
    CHECK_THROWS(parse_device("cuda"), "model.device is \"cuda\" but this build of arpo has no CUDA");
    CHECK_THROWS(parse_device("cuda:1"), "model.device is \"cuda:1\" but this build of arpo has no CUDA");
  }
}

// Each dispatch function on CPU tensors = the kernel called directly on the same data, bit for bit.
void test_dispatch_cpu() {
  const int64_t R = 9, V = 37;
  const std::vector<float> z = random_floats(R * V, 2.0f, 7);
  std::vector<int32_t> targets = random_tokens(R, V, 8);
  targets[4] = -1;
  auto logits = [&] { return at::from_blob(const_cast<float*>(z.data()), {R, V}, at::kFloat).clone(); };
  const K::Logits L{z.data(), K::DType::F32, R, V};

  {  // logits_stats
    std::vector<float> lp(R), ent(R), lp_ref(R), ent_ref(R);
    dispatch::logits_stats(lp.data(), ent.data(), logits(), targets.data(), 0.7f, 1);
    K::logits_stats(nullptr, ent_ref.data(), nullptr, lp_ref.data(), L, targets.data(), 0.7f, 1);
    CHECK(lp == lp_ref);
    CHECK(ent == ent_ref);
  }
  {  // sample_tokens: streams and positions as int64 tensors beside the logits
    std::vector<int64_t> streams(R), positions(R);
    for (int64_t r = 0; r < R; ++r) streams[r] = 1000 + 3 * r, positions[r] = 5 + r;
    K::SamplingParams sp;
    sp.temperature = 0.9f;
    sp.top_k = 10;
    sp.seed = 42;
    std::vector<int32_t> tok(R), tok_ref(R);
    std::vector<float> lp(R), ent(R), ne(R), lp_ref(R), ent_ref(R), ne_ref(R);
    dispatch::sample_tokens(tok.data(), lp.data(), ent.data(), ne.data(), logits(),
                            at::from_blob(streams.data(), {R}, at::kLong), at::from_blob(positions.data(), {R}, at::kLong),
                            sp, 1);
    std::vector<uint64_t> s64(streams.begin(), streams.end());
    K::sample_tokens(tok_ref.data(), lp_ref.data(), ent_ref.data(), ne_ref.data(), L, s64.data(), positions.data(), sp, 1);
    CHECK(tok == tok_ref);
    CHECK(lp == lp_ref && ent == ent_ref && ne == ne_ref);
    CHECK_THROWS(dispatch::sample_tokens(tok.data(), nullptr, nullptr, nullptr, logits(),
                                         at::from_blob(streams.data(), {R - 1}, at::kLong),
                                         at::from_blob(positions.data(), {R}, at::kLong), sp, 1),
                 "streams and positions must be contiguous int64 (rows)");
  }
  std::vector<float> old_lp = random_floats(R, 0.3f, 9), adv = random_floats(R, 1.0f, 10), ref = random_floats(R, 0.3f, 11);
  std::vector<float> mask(R, 1.0f);
  mask[4] = 0;
  for (int64_t r = 0; r < R; ++r) old_lp[r] -= 3.6f, ref[r] -= 3.6f;
  std::vector<int32_t> seq(R);
  for (int64_t r = 0; r < R; ++r) seq[r] = static_cast<int32_t>(r / 4);
  K::PolicyLossConfig cfg;
  cfg.kl_coef = 0.1f;
  cfg.entropy_coef = 0.01f;
  cfg.aggregation = K::Aggregation::SeqMeanTokenMean;
  {  // policy_loss: the logits become the gradient
    at::Tensor g = logits();
    std::vector<float> grad_ref(z), lp(R), lp_ref(R);
    K::PolicyLossResult res, res_ref;
    dispatch::policy_loss(&res, lp.data(), g, targets.data(), old_lp.data(), adv.data(), mask.data(), seq.data(), 3,
                          ref.data(), cfg, 1);
    K::policy_loss(&res_ref, grad_ref.data(), lp_ref.data(), nullptr, L, targets.data(), old_lp.data(), adv.data(),
                   mask.data(), seq.data(), 3, ref.data(), cfg, 1);
    CHECK(res.loss == res_ref.loss && res.pg_loss == res_ref.pg_loss && res.kl == res_ref.kl && res.tokens == res_ref.tokens);
    CHECK(std::vector<float>(g.data_ptr<float>(), g.data_ptr<float>() + R * V) == grad_ref);
    CHECK(lp == lp_ref);
    at::Tensor wrong = g.to(at::kDouble);
    CHECK_THROWS(dispatch::policy_loss(&res, nullptr, wrong, targets.data(), old_lp.data(), adv.data(),
                                       mask.data(), seq.data(), 3, ref.data(), cfg, 1),
                 "policy_loss: expected contiguous float32 (rows, vocab) logits");
  }
  {  // policy_loss_copies
    std::vector<double> ap(R), an(R), w(R), cp(R), cn(R), ct(R);
    for (int64_t r = 0; r < R; ++r) {
      if (r == 4) continue;  // context row (target -1)
      (adv[r] > 0 ? ap[r] : an[r]) = 0.5 * adv[r];
      (adv[r] > 0 ? cp[r] : cn[r]) = 1;
      w[r] = 0.5;
      ct[r] = 1;
    }
    const K::TokenCopySums sums{ap.data(), an.data(), w.data(), cp.data(), cn.data(), ct.data()};
    cfg.aggregation = K::Aggregation::TokenMean;
    at::Tensor g = logits();
    std::vector<float> grad_ref(z);
    K::PolicyLossResult res, res_ref;
    dispatch::policy_loss_copies(&res, g, targets.data(), old_lp.data(), sums, 2, ref.data(), cfg, 1);
    K::policy_loss_copies(&res_ref, grad_ref.data(), nullptr, nullptr, L, targets.data(), old_lp.data(), sums, 2,
                          ref.data(), cfg, 1);
    CHECK(res.loss == res_ref.loss && res.pg_clipfrac == res_ref.pg_clipfrac && res.tokens == res_ref.tokens);
    CHECK(std::vector<float>(g.data_ptr<float>(), g.data_ptr<float>() + R * V) == grad_ref);
  }
}

// ---------------------------------------------------------------- CUDA vs CPU

std::vector<float> to_vec(const at::Tensor& t) {
  at::Tensor c = t.detach().to(at::kCPU).to(at::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// The largest |a - b| / (atol + rtol |b|) over two tensors (<= 1 passes).
double ratio(const at::Tensor& a, const at::Tensor& b, double atol, double rtol) {
  const at::Tensor x = a.detach().to(at::kCPU).to(at::kDouble), y = b.detach().to(at::kCPU).to(at::kDouble);
  return ((x - y).abs() / (atol + rtol * y.abs())).max().item<double>();
}

// A model on `device` with the weights of `cpu`.
Model copy_to(const Model& cpu, const at::Device& device) {
  Model m(cpu.config(), cpu.dtype(), device);
  m.load_tensors(cpu.named_tensors());
  return m;
}

void test_cuda_forward_and_decode(const at::Device& dev) {
  for (const char* type : {"qwen2", "qwen3", "llama"}) {
    const ModelConfig c = tiny_config(type, 61);
    Model cpu(c, at::kFloat);
    cpu.init_weights(3);
    Model gpu = copy_to(cpu, dev);
    CHECK(gpu.named_tensors()[0].second.device() == dev);
    // Packed forward of two sequences.
    const std::vector<int32_t> toks = random_tokens(19, c.vocab_size, 4);
    PackedSequences p = pack_sequences(toks, {11, 8}, c.vocab_size, 1000, "test");
    at::NoGradGuard no_grad;
    at::Tensor h_cpu = cpu.forward_hidden(p.ids, p.positions, packed_causal_attention(p.offsets));
    at::Tensor h_gpu = gpu.forward_hidden(p.ids, p.positions, packed_causal_attention(p.offsets));
    CHECK(h_gpu.device() == dev);
    CHECK(ratio(gpu.logits(h_gpu), cpu.logits(h_cpu), 1e-4, 1e-3) <= 1.0);
    TokenStats s_cpu = score_sequences(cpu, p, 1.0f, 1), s_gpu = score_sequences(gpu, p, 1.0f, 1);
    double worst = 0;
    for (size_t i = 0; i < toks.size(); ++i) worst = std::max(worst, std::fabs(s_cpu.logprobs[i] - s_gpu.logprobs[i]) / (1e-4 + 1e-3 * std::fabs(s_cpu.logprobs[i])));
    CHECK(worst <= 1.0);

    // Decode with forks: a prompt, two forks at different prefixes, greedy steps on all three.
    Engine e_cpu(cpu, KVCache::Options{4, 2, 0}, 1), e_gpu(gpu, KVCache::Options{4, 2, 0}, 1);
    K::SamplingParams greedy;
    greedy.temperature = 0.0f;
    const std::vector<int32_t> prompt = random_tokens(9, c.vocab_size, 5);
    std::vector<int32_t> pc = {e_cpu.cache().new_path(1)}, pg = {e_gpu.cache().new_path(1)};
    DecodeResult a = e_cpu.extend(pc, {prompt}, greedy), b = e_gpu.extend(pg, {prompt}, greedy);
    CHECK(a.tokens == b.tokens);
    pc.push_back(e_cpu.cache().fork(pc[0], 9, 2));
    pg.push_back(e_gpu.cache().fork(pg[0], 9, 2));
    pc.push_back(e_cpu.cache().fork(pc[0], 6, 3));
    pg.push_back(e_gpu.cache().fork(pg[0], 6, 3));
    std::vector<std::vector<int32_t>> in_c = {{a.tokens[0]}, {a.tokens[0]}, {prompt[6], prompt[7]}}, in_g = in_c;
    bool same = true;
    double lp_worst = 0;
    for (int step = 0; step < 8; ++step) {
      DecodeResult x = e_cpu.extend(pc, in_c, greedy), y = e_gpu.extend(pg, in_g, greedy);
      same = same && x.tokens == y.tokens;
      for (size_t i = 0; i < x.tokens.size(); ++i) {
        lp_worst = std::max(lp_worst, std::fabs(x.logprobs[i] - y.logprobs[i]) / (1e-4 + 1e-3 * std::fabs(x.logprobs[i])));
        in_c[i] = {x.tokens[i]};
        in_g[i] = {y.tokens[i]};
      }
    }
    CHECK(same);
    CHECK(lp_worst <= 1.0);
    std::printf("  %s on %s: forward, scoring and 8 greedy steps over 3 forked paths agree\n", type, dev.str().c_str());
  }
}

MicroBatch flat_batch(int64_t vocab) {
  MicroBatch mb;
  const std::vector<int32_t> a = random_tokens(10, vocab, 21), b = random_tokens(7, vocab, 22);
  mb.tokens = a;
  mb.tokens.insert(mb.tokens.end(), b.begin(), b.end());
  mb.lengths = {10, 7};
  const auto adv = random_floats(17, 1.0f, 23), old = random_floats(17, 0.3f, 24);
  for (int64_t i = 0; i < 17; ++i) {
    mb.mask.push_back(i % 10 >= 3 ? 1.0f : 0.0f);
    mb.advantages.push_back(adv[i]);
    mb.old_logprobs.push_back(-4.1f + old[i]);
  }
  return mb;
}

TreeMicroBatch tree_batch(int64_t vocab) {
  TreeMicroBatch mb;
  mb.tokens = random_tokens(10, vocab, 31);
  mb.parent = {-1, 0, 0};
  mb.node_tokens = {4, 3, 3};
  const auto old = random_floats(10, 0.3f, 32);
  for (int64_t i = 0; i < 10; ++i) mb.old_logprobs.push_back(-4.1f + old[i]);
  for (auto* v : {&mb.adv_pos, &mb.adv_neg, &mb.weight, &mb.count_pos, &mb.count_neg, &mb.count}) v->assign(10, 0.0);
  for (int64_t i = 4; i < 7; ++i) mb.adv_pos[i] = 0.8 / 3, mb.weight[i] = 1.0 / 3, mb.count_pos[i] = 1, mb.count[i] = 1;
  for (int64_t i = 7; i < 10; ++i) mb.adv_neg[i] = -0.6 / 3, mb.weight[i] = 1.0 / 3, mb.count_neg[i] = 1, mb.count[i] = 1;
  mb.sequences = 2;
  return mb;
}

void test_cuda_train(const at::Device& dev) {
  const ModelConfig c = tiny_config("qwen2", 47);
  OptimConfig oc;
  oc.lr = 1e-3;
  oc.max_grad_norm = 0.5;  // clipping active
  K::PolicyLossConfig cfg;
  cfg.kl_coef = 0.05f;
  cfg.entropy_coef = 0.01f;
  for (int tree = 0; tree < 2; ++tree) {
    Model cpu(c, at::kFloat);
    cpu.init_weights(11);
    Model gpu = copy_to(cpu, dev);
    const Model ref_cpu = cpu.clone(at::kFloat), ref_gpu = gpu.clone(at::kFloat);
    cpu.set_requires_grad(true);
    gpu.set_requires_grad(true);
    AdamW o_cpu(cpu.named_tensors()), o_gpu(gpu.named_tensors());
    TrainMetrics m_cpu, m_gpu;
    for (int step = 0; step < 2; ++step) {
      if (tree) {
        m_cpu = train_tree_step(cpu, o_cpu, {tree_batch(c.vocab_size)}, cfg, oc, &ref_cpu, 1);
        m_gpu = train_tree_step(gpu, o_gpu, {tree_batch(c.vocab_size)}, cfg, oc, &ref_gpu, 1);
      } else {
        m_cpu = train_step(cpu, o_cpu, {flat_batch(c.vocab_size)}, cfg, LossMode::Policy, oc, &ref_cpu, 1);
        m_gpu = train_step(gpu, o_gpu, {flat_batch(c.vocab_size)}, cfg, LossMode::Policy, oc, &ref_gpu, 1);
      }
    }
    CHECK_CLOSE(m_gpu.loss, m_cpu.loss, 1e-5, 1e-3);
    CHECK_CLOSE(m_gpu.grad_norm, m_cpu.grad_norm, 1e-5, 1e-3);
    CHECK_CLOSE(m_gpu.kl, m_cpu.kl, 1e-6, 1e-2);
    CHECK(m_gpu.tokens == m_cpu.tokens);
    double worst = 0;
    for (size_t i = 0; i < cpu.named_tensors().size(); ++i) {
      CHECK(o_gpu.state()[2 * i].second.device() == dev);  // exp_avg on the device
      worst = std::max(worst, ratio(gpu.named_tensors()[i].second, cpu.named_tensors()[i].second, 1e-5, 1e-3));
    }
    CHECK(worst <= 1.0);
    std::printf("  %s train step x2 on %s: loss %.6g vs %.6g, parameters within tolerance (worst ratio %.3f)\n",
                tree ? "tree" : "flat", dev.str().c_str(), m_gpu.loss, m_cpu.loss, worst);
  }
}

// model.threads 0 means every core for libtorch and the addon's kernels
// (libtorch's own default was 1 on a 2-vCPU VM), n means n; and the kernels
// the dispatch point splits over those threads give the same bits as on one.
void test_compute_threads() {
  const int before = at::get_num_threads();
  arpo::compat::set_compute_threads(0);
  CHECK(at::get_num_threads() == std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  arpo::compat::set_compute_threads(1);
  CHECK(at::get_num_threads() == 1);
  at::manual_seed(5);
  const int64_t rows = 4096, heads = 4, D = 16;  // past the grain of one thread
  at::Tensor x = at::randn({rows, heads * D}), w = at::randn({heads * D});
  at::Tensor q = at::randn({rows, heads, D}), cs = at::randn({rows, D}), sn = at::randn({rows, D});
  at::Tensor norm1 = dispatch::rms_norm(x, w, 1e-6), rope1 = q.clone();
  dispatch::rope_(rope1, cs, sn);
  arpo::compat::set_compute_threads(3);
  at::Tensor norm3 = dispatch::rms_norm(x, w, 1e-6), rope3 = q.clone();
  dispatch::rope_(rope3, cs, sn);
  CHECK(norm1.equal(norm3));
  CHECK(rope1.equal(rope3));
  arpo::compat::set_compute_threads(before);
}

// compat::SingleThreadBlas: OpenBLAS on one thread for the scope (the
// engine's small calls), the count before restored when the last of
// overlapping scopes ends; a matmul gives the same product either way.
void test_single_thread_blas() {
  const auto get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (get == nullptr) {
    std::printf("single-thread BLAS scope: libtorch's BLAS is not OpenBLAS, the scope is a no-op\n");
    arpo::compat::SingleThreadBlas harmless;
    return;
  }
  const int before = at::get_num_threads();
  arpo::compat::set_compute_threads(3);
  CHECK(get() == 3);
  at::manual_seed(6);
  at::Tensor a = at::randn({96, 512}), b = at::randn({512, 640});
  const at::Tensor many = at::matmul(a, b);
  {
    arpo::compat::SingleThreadBlas one;
    CHECK(get() == 1);
    // The same product within float rounding; bitwise only where this CPU's
    // OpenBLAS kernel sums in the same order on 1 and 3 threads (not so on the
    // reference VM under one host kernel: the engine must not rely on it).
    const at::Tensor single = at::matmul(a, b);
    CHECK(arpo_test::tolerance_ratio(single, many, 1e-5, 1e-4) <= 1.0);
    std::printf("single-thread BLAS scope: a 96x512x640 matmul on 1 vs 3 OpenBLAS threads is %s\n",
                single.equal(many) ? "bitwise equal" : "equal within float rounding, not bitwise");
    std::thread other([&] {
      arpo::compat::SingleThreadBlas nested;
      CHECK(get() == 1);
    });
    other.join();
    CHECK(get() == 1);  // this scope is still open
  }
  CHECK(get() == 3);
  auto* first = new arpo::compat::SingleThreadBlas;
  auto* second = new arpo::compat::SingleThreadBlas;
  delete first;  // ends before the second: the count stays 1
  CHECK(get() == 1);
  delete second;
  CHECK(get() == 3);
  arpo::compat::set_compute_threads(before);
}

// The engine's rule for one BLAS thread (engine.h): a call's largest matmul
// at most 2^24 = 16,777,216 multiply-adds, boundaries worked out by hand.
void test_blas_rule() {
  ModelConfig demo;  // the demo model: hidden 128, MLP 384, 8 / 4 heads of 16, vocab 1,206
  demo.hidden_size = 128;
  demo.intermediate_size = 384;
  demo.num_attention_heads = 8;
  demo.num_key_value_heads = 4;
  demo.head_dim = 16;
  demo.vocab_size = 1206;
  // LM head 1,206 x 128 = 154,368 per sampled row: 108 rows 16,671,744, 109 rows 16,826,112.
  CHECK(arpo::model::blas_on_calling_thread(demo, 108, 108));
  CHECK(!arpo::model::blas_on_calling_thread(demo, 109, 109));
  // gate/up/down 128 x 384 = 49,152 per token: 341 tokens 16,760,832, 342 tokens 16,809,984.
  CHECK(arpo::model::blas_on_calling_thread(demo, 341, 1));
  CHECK(!arpo::model::blas_on_calling_thread(demo, 342, 1));
  ModelConfig half;  // Qwen2-0.5B: hidden 896, MLP 4,864, 14 / 2 heads of 64, vocab 151,936
  half.hidden_size = 896;
  half.intermediate_size = 4864;
  half.num_attention_heads = 14;
  half.num_key_value_heads = 2;
  half.head_dim = 64;
  half.vocab_size = 151936;
  CHECK(!arpo::model::blas_on_calling_thread(half, 1, 1));  // 136,134,656 in the LM head
  CHECK(!arpo::model::blas_on_calling_thread(half, 4, 0));  // 4 x 4,358,144 = 17,432,576 in the MLP
  CHECK(arpo::model::blas_on_calling_thread(half, 3, 0));   // 13,074,432
  // Far past int64 when multiplied naively: still a plain "no".
  CHECK(!arpo::model::blas_on_calling_thread(half, int64_t{1} << 40, int64_t{1} << 40));
}

}  // namespace

int main() {
  try {
    test_parse_device();
    test_dispatch_cpu();
    test_compute_threads();
    test_single_thread_blas();
    test_blas_rule();
    std::string why;
    at::Device dev(at::kCPU);
    if (!cuda_build()) {
      why = "this build has no CUDA (libtorch " + std::string(TORCH_VERSION) + " without CUDA)";
    } else {
      try {
        dev = parse_device("cuda:0");
      } catch (const ModelError& e) {
        why = e.what();
      }
    }
    if (why.empty()) {
      test_cuda_forward_and_decode(dev);
      test_cuda_train(dev);
    } else {
      std::printf("CUDA vs CPU part skipped: %s\n", why.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: unexpected exception: %s\n", e.what());
    ++arpo_test::failed();
  }
  return arpo_test::summary();
}
