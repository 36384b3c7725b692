// Helpers shared by the model tests: tiny configs of each model type and a
// plain float64 reference forward written with loops (per row, per head, per
// rotary pair), independent of the model's batched tensor code.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "torch/model.h"

namespace arpo_test {

using arpo::model::ModelConfig;

// n token ids in [0, vocab) from a seeded generator.
inline std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

inline ModelConfig tiny_config(const std::string& type, int64_t vocab = 53) {
  ModelConfig c;
  c.model_type = type;
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = type == "qwen3" ? 16 : 0;  // qwen3 decouples head_dim from hidden / heads
  c.max_position_embeddings = 4096;
  c.rope_theta = type == "llama" ? 500000.0 : 10000.0;
  c.rms_norm_eps = 1e-6;
  c.qkv_bias = type == "qwen2" || type == "llama";
  c.output_bias = type == "llama";  // llama attention_bias: q/k/v and o_proj
  c.mlp_bias = type == "llama";
  c.tie_word_embeddings = type == "qwen3";
  c.initializer_range = 0.2;  // large weights so attention is far from uniform
  if (type == "llama") {
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = 8.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 64;  // small, so all three frequency bands occur
  }
  c.validate();
  return c;
}

// Llama 3 frequency scaling, straight from the HF formula (scalar form).
inline double reference_inv_freq(const ModelConfig& c, int64_t i) {
  double f = 1.0 / std::pow(c.rope_theta, 2.0 * i / c.head_dim);
  if (c.rope_scaling.type == "linear") return f / c.rope_scaling.factor;
  if (c.rope_scaling.type != "llama3") return f;
  const auto& s = c.rope_scaling;
  const double wavelen = 2 * M_PI / f;
  const double low_wl = s.original_max_position_embeddings / s.low_freq_factor;
  const double high_wl = s.original_max_position_embeddings / s.high_freq_factor;
  if (wavelen < high_wl) return f;
  if (wavelen > low_wl) return f / s.factor;
  const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * f / s.factor + smooth * f;
}

// y_r = w * x_r / sqrt(mean(x_r^2) + eps), row by row.
inline std::vector<double> ref_rms(const std::vector<double>& x, const at::Tensor& w, double eps) {
  double ms = 0;
  for (double v : x) ms += v * v;
  ms /= static_cast<double>(x.size());
  const double inv = 1.0 / std::sqrt(ms + eps);
  std::vector<double> y(x.size());
  auto wa = w.to(at::kDouble).contiguous();
  for (size_t i = 0; i < x.size(); ++i) y[i] = wa.data_ptr<double>()[i] * x[i] * inv;
  return y;
}

// y = W x + b for one row.
inline std::vector<double> ref_linear(const std::vector<double>& x, const at::Tensor& W, const at::Tensor& b) {
  at::Tensor Wd = W.to(at::kDouble).contiguous();
  const int64_t out = Wd.size(0), in = Wd.size(1);
  std::vector<double> y(out, 0.0);
  const double* w = Wd.data_ptr<double>();
  for (int64_t o = 0; o < out; ++o) {
    double s = 0;
    for (int64_t i = 0; i < in; ++i) s += w[o * in + i] * x[i];
    y[o] = s;
  }
  if (b.defined()) {
    at::Tensor bd = b.to(at::kDouble).contiguous();
    for (int64_t o = 0; o < out; ++o) y[o] += bd.data_ptr<double>()[o];
  }
  return y;
}

// Logits (L, V) of one sequence, float64, computed token by token.
inline at::Tensor reference_forward(const arpo::model::Model& model, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = model.config();
  std::map<std::string, at::Tensor> W;
  for (const auto& [n, t] : model.named_tensors()) W[n] = t.detach();
  auto get = [&](const std::string& n) { return W.count(n) ? W[n] : at::Tensor(); };
  const int64_t L = static_cast<int64_t>(tokens.size()), Hd = c.hidden_size, H = c.num_attention_heads,
                KVH = c.num_key_value_heads, D = c.head_dim;
  at::Tensor emb = W["model.embed_tokens.weight"].to(at::kDouble).contiguous();
  std::vector<std::vector<double>> x(L, std::vector<double>(Hd));
  for (int64_t t = 0; t < L; ++t)
    for (int64_t i = 0; i < Hd; ++i) x[t][i] = emb.data_ptr<double>()[tokens[t] * Hd + i];
  auto rope = [&](std::vector<double>& v, int64_t head, int64_t pos) {
    for (int64_t i = 0; i < D / 2; ++i) {
      const double ang = pos * reference_inv_freq(c, i);
      const double a = v[head * D + i], b = v[head * D + i + D / 2];
      v[head * D + i] = a * std::cos(ang) - b * std::sin(ang);
      v[head * D + i + D / 2] = b * std::cos(ang) + a * std::sin(ang);
    }
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(L), k(L), v(L);
    for (int64_t t = 0; t < L; ++t) {
      auto h = ref_rms(x[t], W[p + "input_layernorm.weight"], c.rms_norm_eps);
      q[t] = ref_linear(h, W[p + "self_attn.q_proj.weight"], get(p + "self_attn.q_proj.bias"));
      k[t] = ref_linear(h, W[p + "self_attn.k_proj.weight"], get(p + "self_attn.k_proj.bias"));
      v[t] = ref_linear(h, W[p + "self_attn.v_proj.weight"], get(p + "self_attn.v_proj.bias"));
      if (c.qk_norm) {
        for (int64_t hh = 0; hh < H; ++hh) {
          std::vector<double> seg(q[t].begin() + hh * D, q[t].begin() + (hh + 1) * D);
          seg = ref_rms(seg, W[p + "self_attn.q_norm.weight"], c.rms_norm_eps);
          std::copy(seg.begin(), seg.end(), q[t].begin() + hh * D);
        }
        for (int64_t hh = 0; hh < KVH; ++hh) {
          std::vector<double> seg(k[t].begin() + hh * D, k[t].begin() + (hh + 1) * D);
          seg = ref_rms(seg, W[p + "self_attn.k_norm.weight"], c.rms_norm_eps);
          std::copy(seg.begin(), seg.end(), k[t].begin() + hh * D);
        }
      }
      for (int64_t hh = 0; hh < H; ++hh) rope(q[t], hh, t);
      for (int64_t hh = 0; hh < KVH; ++hh) rope(k[t], hh, t);
    }
    for (int64_t t = 0; t < L; ++t) {
      std::vector<double> attn(H * D, 0.0);
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t kv = hh / (H / KVH);
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int64_t i = 0; i < D; ++i) d += q[t][hh * D + i] * k[j][kv * D + i];
          s[j] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& e : s) z += (e = std::exp(e - mx));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t i = 0; i < D; ++i) attn[hh * D + i] += s[j] / z * v[j][kv * D + i];
      }
      auto o = ref_linear(attn, W[p + "self_attn.o_proj.weight"], get(p + "self_attn.o_proj.bias"));
      for (int64_t i = 0; i < Hd; ++i) x[t][i] += o[i];
      auto h = ref_rms(x[t], W[p + "post_attention_layernorm.weight"], c.rms_norm_eps);
      auto g = ref_linear(h, W[p + "mlp.gate_proj.weight"], get(p + "mlp.gate_proj.bias"));
      auto u = ref_linear(h, W[p + "mlp.up_proj.weight"], get(p + "mlp.up_proj.bias"));
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      auto d = ref_linear(g, W[p + "mlp.down_proj.weight"], get(p + "mlp.down_proj.bias"));
      for (int64_t i = 0; i < Hd; ++i) x[t][i] += d[i];
    }
  }
  at::Tensor head = c.tie_word_embeddings ? W["model.embed_tokens.weight"] : W["lm_head.weight"];
  at::Tensor out = at::empty({L, c.vocab_size}, at::kDouble);
  for (int64_t t = 0; t < L; ++t) {
    auto h = ref_rms(x[t], W["model.norm.weight"], c.rms_norm_eps);
    auto lg = ref_linear(h, head, at::Tensor());
    for (int64_t j = 0; j < c.vocab_size; ++j) out[t][j] = lg[j];
  }
  return out;
}

// Perturbs every parameter (norm weights off 1, biases off 0) so tests see them.
inline void perturb_all(arpo::model::Model& m, uint64_t seed) {
  at::NoGradGuard g;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (const auto& [n, t] : m.named_tensors()) {
    at::Tensor noise = at::empty(t.sizes(), at::kFloat);
    noise.normal_(0.0, 0.1, gen);
    t.add_(noise.to(t.scalar_type()));
  }
}

// Max over entries of |a - b| / (atol + rtol |b|): <= 1 means within tolerance.
inline double tolerance_ratio(const at::Tensor& a, const at::Tensor& b, double atol, double rtol) {
  at::Tensor ad = a.to(at::kDouble), bd = b.to(at::kDouble);
  return ((ad - bd).abs() / (atol + rtol * bd.abs())).max().item<double>();
}

}  // namespace arpo_test
