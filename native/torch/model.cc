// The Qwen2 / Qwen3 / Llama decoder: config validation, HF-named parameters,
// random init, RMSNorm, RoPE, causal attention and the packed forward.
// Numerics follow HF transformers' eager implementation (modeling_qwen2.py,
// modeling_qwen3.py, modeling_llama.py) so HF checkpoints give HF logits.
#include "torch/model.h"

#include "torch/device.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <sstream>
#include <unordered_map>

namespace arpo {
namespace model {

namespace {

template <typename T>
[[noreturn]] void bad_field(const char* field, const T& value, const char* expected) {
  std::ostringstream os;
  os << "model config: expected " << expected << " for " << field << " but received " << value;
  throw ModelError(os.str());
}

void positive(const char* field, int64_t value) {
  if (value <= 0) bad_field(field, value, "a positive integer");
}

// Compute dtype of norms, RoPE angles and softmax: float32, or float64 for
// float64 models (the finite-difference tests need the extra precision).
at::ScalarType accum_dtype(at::ScalarType dtype) {
  return dtype == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace

std::string shape_string(at::IntArrayRef shape) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ")";
  return os.str();
}

void ModelConfig::validate() {
  if (model_type != "qwen2" && model_type != "qwen3" && model_type != "llama")
    bad_field("model_type", "\"" + model_type + "\"", "one of qwen2, qwen3, llama");
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("max_position_embeddings", max_position_embeddings);
  if (num_attention_heads % num_key_value_heads != 0)
    bad_field("num_key_value_heads", num_key_value_heads, "a divisor of num_attention_heads");
  if (head_dim == 0) {
    if (hidden_size % num_attention_heads != 0)
      bad_field("hidden_size", hidden_size, "a multiple of num_attention_heads (or an explicit head_dim)");
    head_dim = hidden_size / num_attention_heads;
  }
  if (head_dim <= 0 || head_dim % 2 != 0) bad_field("head_dim", head_dim, "a positive even integer");
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) bad_field("rope_theta", rope_theta, "a positive number");
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) bad_field("rms_norm_eps", rms_norm_eps, "a positive number");
  if (!(initializer_range >= 0) || !std::isfinite(initializer_range))
    bad_field("initializer_range", initializer_range, "a non-negative number");
  // Qwen3 is Qwen2 with per-head q/k RMSNorm; the flag follows the type.
  qk_norm = model_type == "qwen3";
  if (rope_scaling.type == "default") rope_scaling.type = "none";
  if (rope_scaling.type != "none" && rope_scaling.type != "llama3" && rope_scaling.type != "linear")
    bad_field("rope_scaling.rope_type", "\"" + rope_scaling.type + "\"", "none, default, linear or llama3");
  if (rope_scaling.type == "linear" && !(rope_scaling.factor > 0))
    bad_field("rope_scaling.factor", rope_scaling.factor, "a positive number");
  if (rope_scaling.type == "llama3") {
    if (!(rope_scaling.factor > 0)) bad_field("rope_scaling.factor", rope_scaling.factor, "a positive number");
    if (!(rope_scaling.low_freq_factor > 0))
      bad_field("rope_scaling.low_freq_factor", rope_scaling.low_freq_factor, "a positive number");
    if (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor))
      bad_field("rope_scaling.high_freq_factor", rope_scaling.high_freq_factor, "a number above low_freq_factor");
    positive("rope_scaling.original_max_position_embeddings", rope_scaling.original_max_position_embeddings);
  }
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float64") return at::kDouble;
  throw ModelError("expected one of float32, bfloat16, float64 for dtype but received \"" + name + "\"");
}

const char* dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kDouble: return "float64";
    default: return "unsupported";
  }
}

at::Tensor rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  at::Tensor out = at::empty({half}, at::kDouble);
  double* f = out.data_ptr<double>();
  for (int64_t i = 0; i < half; ++i)
    f[i] = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
  if (c.rope_scaling.type == "linear")
    for (int64_t i = 0; i < half; ++i) f[i] /= c.rope_scaling.factor;
  if (c.rope_scaling.type == "llama3") {
    // HF _compute_llama3_parameters: long wavelengths are divided by factor,
    // short ones kept, and the band between interpolated smoothly.
    const RopeScaling& s = c.rope_scaling;
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_len / s.low_freq_factor;
    const double high_freq_wavelen = old_len / s.high_freq_factor;
    for (int64_t i = 0; i < half; ++i) {
      const double wavelen = 2.0 * M_PI / f[i];
      double v = wavelen > low_freq_wavelen ? f[i] / s.factor : f[i];
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      if (medium) {
        const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        v = (1.0 - smooth) * v / s.factor + smooth * v;
      }
      f[i] = v;
    }
  }
  return out;
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t q_offset) {
  const int64_t n = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t Lk = k.size(0), KVH = k.size(1), G = H / KVH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  // (n, H, D) -> (KVH, G * n, D): the G query heads of a kv head side by side,
  // so one batched matmul per kv head serves them all (no repeat_kv copy).
  at::Tensor qg = q.reshape({n, KVH, G, D}).permute({1, 2, 0, 3}).reshape({KVH, G * n, D});
  at::Tensor kt = k.permute({1, 2, 0});  // (KVH, D, Lk)
  at::Tensor scores = at::matmul(qg, kt).mul(scale).view({KVH, G, n, Lk});
  // mask[i][j] = key j lies after query i's absolute position.
  const auto index = q.options().dtype(at::kLong);
  at::Tensor qpos = at::arange(q_offset, q_offset + n, index).unsqueeze(1);
  at::Tensor kpos = at::arange(0, Lk, index).unsqueeze(0);
  scores = scores.masked_fill(kpos > qpos, -std::numeric_limits<double>::infinity());
  at::Tensor probs = at::softmax(scores, -1, accum_dtype(q.scalar_type())).to(q.scalar_type());
  at::Tensor out = at::matmul(probs.view({KVH, G * n, Lk}), v.permute({1, 0, 2}));  // (KVH, G*n, D)
  return out.view({KVH, G, n, D}).permute({2, 0, 1, 3}).reshape({n, H * D});
}

AttentionFn packed_causal_attention(std::vector<int64_t> offsets) {
  return [offsets = std::move(offsets)](int64_t, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    std::vector<at::Tensor> outs;
    outs.reserve(offsets.size());
    for (size_t s = 0; s + 1 < offsets.size(); ++s) {
      const int64_t a = offsets[s], b = offsets[s + 1];
      if (b > a) outs.push_back(causal_attention(q.slice(0, a, b), k.slice(0, a, b), v.slice(0, a, b), 0));
    }
    return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
  };
}

Model::Model(ModelConfig config, at::ScalarType dtype, at::Device device)
    : config_(std::move(config)), dtype_(dtype), device_(device) {
  config_.validate();
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kDouble)
    throw ModelError(std::string("unsupported model dtype ") + c10::toString(dtype));
  const ModelConfig& c = config_;
  const int64_t Hd = c.hidden_size;
  add("model.embed_tokens.weight", {c.vocab_size, Hd}, false);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {Hd}, true);
    add(p + "self_attn.q_proj.weight", {c.q_dim(), Hd}, false);
    if (c.qkv_bias) add(p + "self_attn.q_proj.bias", {c.q_dim()}, false);
    add(p + "self_attn.k_proj.weight", {c.kv_dim(), Hd}, false);
    if (c.qkv_bias) add(p + "self_attn.k_proj.bias", {c.kv_dim()}, false);
    add(p + "self_attn.v_proj.weight", {c.kv_dim(), Hd}, false);
    if (c.qkv_bias) add(p + "self_attn.v_proj.bias", {c.kv_dim()}, false);
    add(p + "self_attn.o_proj.weight", {Hd, c.q_dim()}, false);
    if (c.output_bias) add(p + "self_attn.o_proj.bias", {Hd}, false);
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {c.head_dim}, true);
      add(p + "self_attn.k_norm.weight", {c.head_dim}, true);
    }
    add(p + "post_attention_layernorm.weight", {Hd}, true);
    add(p + "mlp.gate_proj.weight", {c.intermediate_size, Hd}, false);
    add(p + "mlp.up_proj.weight", {c.intermediate_size, Hd}, false);
    add(p + "mlp.down_proj.weight", {Hd, c.intermediate_size}, false);
    if (c.mlp_bias) {
      add(p + "mlp.gate_proj.bias", {c.intermediate_size}, false);
      add(p + "mlp.up_proj.bias", {c.intermediate_size}, false);
      add(p + "mlp.down_proj.bias", {Hd}, false);
    }
  }
  add("model.norm.weight", {Hd}, true);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, Hd}, false);
  bind();
  inv_freq_ = rope_inv_freq(c).to(device_);  // parameters start at zero: init_weights or load_tensors fills them
}

at::Tensor& Model::add(const std::string& name, std::vector<int64_t> shape, bool is_norm) {
  params_.emplace_back(name, at::zeros(shape, at::TensorOptions().dtype(dtype_).device(device_)));
  is_norm_.push_back(is_norm);
  return params_.back().second;
}

void Model::bind() {
  std::unordered_map<std::string, at::Tensor> by_name;
  for (auto& [name, t] : params_) by_name.emplace(name, t);
  auto get = [&](const std::string& name) {
    auto it = by_name.find(name);
    return it == by_name.end() ? at::Tensor() : it->second;
  };
  embed_ = get("model.embed_tokens.weight");
  final_norm_ = get("model.norm.weight");
  lm_head_ = config_.tie_word_embeddings ? embed_ : get("lm_head.weight");
  layers_.assign(config_.num_hidden_layers, Layer{});
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer& L = layers_[i];
    L.input_norm = get(p + "input_layernorm.weight");
    L.q_w = get(p + "self_attn.q_proj.weight");
    L.q_b = get(p + "self_attn.q_proj.bias");
    L.k_w = get(p + "self_attn.k_proj.weight");
    L.k_b = get(p + "self_attn.k_proj.bias");
    L.v_w = get(p + "self_attn.v_proj.weight");
    L.v_b = get(p + "self_attn.v_proj.bias");
    L.o_w = get(p + "self_attn.o_proj.weight");
    L.o_b = get(p + "self_attn.o_proj.bias");
    L.q_norm = get(p + "self_attn.q_norm.weight");
    L.k_norm = get(p + "self_attn.k_norm.weight");
    L.post_norm = get(p + "post_attention_layernorm.weight");
    L.gate_w = get(p + "mlp.gate_proj.weight");
    L.gate_b = get(p + "mlp.gate_proj.bias");
    L.up_w = get(p + "mlp.up_proj.weight");
    L.up_b = get(p + "mlp.up_proj.bias");
    L.down_w = get(p + "mlp.down_proj.weight");
    L.down_b = get(p + "mlp.down_proj.bias");
  }
}

void Model::init_weights(uint64_t seed) {
  at::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i].first;
    at::Tensor& p = params_[i].second;
    if (is_norm_[i]) {
      p.fill_(1.0);
    } else if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.zero_();
    } else {
      at::Tensor draw = at::empty(p.sizes(), at::kFloat);
      draw.normal_(0.0, config_.initializer_range, gen);
      p.copy_(draw);
    }
  }
}

void Model::load_tensors(const NamedTensors& tensors) {
  std::unordered_map<std::string, const at::Tensor*> given;
  for (const auto& [name, t] : tensors) {
    const bool ignorable = (config_.tie_word_embeddings && name == "lm_head.weight") ||
                           name.find("rotary_emb.inv_freq") != std::string::npos;
    if (ignorable) continue;
    if (!given.emplace(name, &t).second) throw ModelError("duplicate tensor " + name);
  }
  for (const auto& [name, p] : params_) {
    auto it = given.find(name);
    if (it == given.end())
      throw ModelError("missing tensor " + name + " (expected shape " + shape_string(p.sizes()) + ")");
    const at::Tensor& t = *it->second;
    if (!t.defined() || t.sizes() != p.sizes())
      throw ModelError("tensor " + name + ": expected shape " + shape_string(p.sizes()) + " but received " +
                       (t.defined() ? shape_string(t.sizes()) : std::string("an undefined tensor")));
    if (!at::isFloatingType(t.scalar_type()))
      throw ModelError("tensor " + name + ": expected a floating-point dtype but received " +
                       c10::toString(t.scalar_type()));
  }
  if (given.size() != params_.size()) {
    std::unordered_map<std::string, bool> expected;
    for (const auto& [name, p] : params_) expected.emplace(name, true);
    for (const auto& [name, t] : given)
      if (!expected.count(name)) throw ModelError("unexpected tensor " + name + " for a " + config_.model_type + " model");
  }
  at::NoGradGuard no_grad;
  for (auto& [name, p] : params_) p.copy_(*given.at(name));
}

Model Model::clone(at::ScalarType dtype) const {
  Model m(config_, dtype, device_);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) m.params_[i].second.copy_(params_[i].second);
  return m;
}

void Model::set_requires_grad(bool requires_grad) {
  for (auto& [name, p] : params_) p.requires_grad_(requires_grad);
}

int64_t Model::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, p] : params_) n += p.numel();
  return n;
}

namespace {
thread_local bool fused_scope = false;
}  // namespace

FusedInferenceScope::FusedInferenceScope() : previous_(fused_scope) { fused_scope = true; }
FusedInferenceScope::~FusedInferenceScope() { fused_scope = previous_; }

bool Model::fused_inference(const at::Tensor& x) const {
  return fused_inference_ && fused_scope && !at::GradMode::is_enabled() && dispatch::fused_inference_supported(x);
}

at::Tensor Model::rms_norm(const at::Tensor& x, const at::Tensor& weight) const {
  if (fused_inference(x)) return dispatch::rms_norm(x, weight, config_.rms_norm_eps);
  at::Tensor xf = x.to(accum_dtype(dtype_));
  at::Tensor var = xf.pow(2).mean(-1, true);
  at::Tensor y = xf * at::rsqrt(var + config_.rms_norm_eps);
  return weight * y.to(x.scalar_type());
}

std::pair<at::Tensor, at::Tensor> Model::rope_tables(const at::Tensor& positions) const {
  // HF: freqs = positions x inv_freq in float32, emb = cat(freqs, freqs),
  // cos/sin cast to the activations' dtype.
  const at::ScalarType acc = accum_dtype(dtype_);
  at::Tensor angles = positions.to(acc).unsqueeze(1) * inv_freq_.to(acc).unsqueeze(0);  // (N, D/2)
  at::Tensor emb = at::cat({angles, angles}, -1);                                         // (N, D)
  return {emb.cos().to(dtype_).contiguous(), emb.sin().to(dtype_).contiguous()};
}

at::Tensor Model::apply_rope(const at::Tensor& x, const std::pair<at::Tensor, at::Tensor>& tables) const {
  // x * cos + rotate_half(x) * sin
  if (fused_inference(x) && tables.first.scalar_type() == x.scalar_type()) {
    at::Tensor y = x;  // a fresh activation under no-grad: rotated in place
    dispatch::rope_(y, tables.first, tables.second);
    return y;
  }
  const at::Tensor cos = tables.first.to(x.scalar_type()).unsqueeze(1), sin = tables.second.to(x.scalar_type()).unsqueeze(1);
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

at::Tensor dense(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b) {
  const bool one_row = x.dim() == 2 && x.size(0) == 1 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble);
  if (!one_row) return at::linear(x, W, b);
  at::Tensor y = b.defined() ? at::addmv(b, W, x[0]) : at::mv(W, x[0]);
  return y.unsqueeze(0);
}

at::Tensor invariant_linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b) {
  const int64_t N = x.size(0), T = kInvariantTileRows;
  if (N == T) return at::linear(x, W, b);
  const int64_t padded = (N + T - 1) / T * T;
  at::Tensor xp = x;
  if (padded != N) {
    xp = at::zeros({padded, x.size(1)}, x.options());
    xp.slice(0, 0, N).copy_(x);
  }
  at::Tensor out = at::empty({padded, W.size(0)}, x.options());
  for (int64_t a = 0; a < padded; a += T) out.slice(0, a, a + T).copy_(at::linear(xp.slice(0, a, a + T), W, b));
  return padded == N ? out : out.slice(0, 0, N);
}

at::Tensor Model::forward_hidden(const at::Tensor& ids, const at::Tensor& positions,
                                 const AttentionFn& attention, bool batch_invariant) const {
  const ModelConfig& c = config_;
  const int64_t N = ids.size(0);
  const at::Tensor pos = positions.to(device_);  // the same tensor when already there
  auto linear = [this, batch_invariant](const at::Tensor& x, const at::Tensor& W, const at::Tensor& b) {
    return project(x, W, b, batch_invariant);
  };
  at::Tensor x = at::embedding(embed_, ids.to(device_));  // (N, hidden)
  const auto rope = rope_tables(pos);                      // the same for every layer
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const Layer& L = layers_[l];
    at::Tensor h = rms_norm(x, L.input_norm);
    at::Tensor q = linear(h, L.q_w, L.q_b).view({N, c.num_attention_heads, c.head_dim});
    at::Tensor k = linear(h, L.k_w, L.k_b).view({N, c.num_key_value_heads, c.head_dim});
    at::Tensor v = linear(h, L.v_w, L.v_b).view({N, c.num_key_value_heads, c.head_dim});
    if (c.qk_norm) {
      q = rms_norm(q, L.q_norm);
      k = rms_norm(k, L.k_norm);
    }
    q = apply_rope(q, rope);
    k = apply_rope(k, rope);
    at::Tensor a = attention(l, q, k, v);
    x = x + linear(a, L.o_w, L.o_b);
    h = rms_norm(x, L.post_norm);
    x = x + linear(at::silu(linear(h, L.gate_w, L.gate_b)) * linear(h, L.up_w, L.up_b), L.down_w, L.down_b);
  }
  return x;
}

at::Tensor Model::logits(const at::Tensor& hidden_rows, bool batch_invariant) const {
  at::Tensor h = rms_norm(hidden_rows, final_norm_);
  return project(h, lm_head_, at::Tensor(), batch_invariant);
}

at::Tensor Model::project(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b, bool batch_invariant) const {
  // The kernel reads W (and b) in place: they must be contiguous host
  // tensors of x's dtype (a model's own weights always are; anything else
  // takes the torch path rather than an error).
  const auto in_place = [&x](const at::Tensor& t) {
    return dispatch::fused_inference_supported(t) && t.scalar_type() == x.scalar_type();
  };
  if (x.dim() == 2 && fused_inference(x) && W.dim() == 2 && in_place(W) && (!b.defined() || in_place(b)) &&
      (batch_invariant || (x.size(0) >= kFusedLinearMinRows && x.size(0) <= kFusedLinearMaxRows)))
    return dispatch::linear(x, W, b);
  return batch_invariant ? invariant_linear(x, W, b) : dense(x, W, b);
}

}  // namespace model
}  // namespace arpo
