// The policy model: a Qwen2 / Qwen3 / Llama decoder on libtorch (ATen), with
// HF tensor names, random init, and a packed forward whose attention is
// supplied by the caller (dense causal per sequence for training, paged KV
// cache for generation: see engine.h).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace arpo {
namespace model {

// Every model-layer failure (bad config, bad weights, bad path id, exhausted
// cache); the N-API layer turns it into a JS exception.
struct ModelError : std::runtime_error {
  explicit ModelError(const std::string& what) : std::runtime_error(what) {}
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// RoPE scaling: "llama3" (HF rope_type llama3: frequency-dependent), "linear"
// (positions / factor, i.e. every frequency / factor); "none" (or "default")
// leaves the frequencies alone.
struct RopeScaling {
  std::string type = "none";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// The fields of a HF config.json the model relies on (TS parses config.json
// and passes them; validate() re-checks them here).
struct ModelConfig {
  std::string model_type = "qwen2";  // qwen2 | qwen3 | llama
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // GQA: divides num_attention_heads
  int64_t head_dim = 0;             // 0 -> hidden_size / num_attention_heads
  int64_t max_position_embeddings = 32768;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool qkv_bias = true;              // q/k/v biases (qwen2: always; llama/qwen3: attention_bias)
  bool output_bias = false;          // o_proj bias (llama/qwen3: attention_bias; qwen2: never)
  bool mlp_bias = false;             // gate/up/down biases (llama mlp_bias)
  bool qk_norm = false;              // per-head RMSNorm on q and k (qwen3)
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  RopeScaling rope_scaling;

  // Throws ModelError naming the first bad field and its value; fills head_dim.
  void validate();
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
};

// Compute dtype from its name: "float32" | "bfloat16" | "float64".
at::ScalarType parse_dtype(const std::string& name);
const char* dtype_name(at::ScalarType dtype);

// Attention of one layer, supplied by the caller of Model::forward:
// q (N, H, D), k and v (N, KVH, D) for the N packed new tokens, already
// normed and rotated; returns (N, H * D).
using AttentionFn = std::function<at::Tensor(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v)>;

// Causal softmax attention of n queries over Lk keys of one sequence:
// q (n, H, D), k and v (Lk, KVH, D); query i sits at absolute position
// q_offset + i and sees keys j <= q_offset + i. GQA without copying K/V: head
// h reads kv head h / (H / KVH) (HF repeat_kv order). Softmax in float32 (or
// float64 for float64 models), as HF's eager attention does.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t q_offset);

// Dense attention for packed training sequences: sequence s spans rows
// [offsets[s], offsets[s + 1]) and attends causally within itself.
AttentionFn packed_causal_attention(std::vector<int64_t> offsets);

// y = x W^T + b for rows x (N, in), W (out, in). A single float32 / float64
// row goes through a matrix-vector product (at::addmv): OpenBLAS's sgemm
// packs W on every call, which for one row costs 3-5x the product itself
// (measured on this CPU, 2 threads: a 4864 x 896 layer 0.77 ms as a GEMM,
// 0.16 ms as a GEMV; the 151,936-row LM head 37 ms vs 10.7 ms), so batch-1
// decoding was GEMM-packing-bound. Several rows keep the GEMM. (Inside the
// engine's fused path, Model::project sends calls of up to
// kFusedLinearMaxRows rows to kernels::linear_rows instead.)
at::Tensor dense(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b);

// Batch-invariant linear layer: y = x W^T + b computed in fixed-shape tiles
// of kInvariantTileRows rows (the last tile zero-padded), so every row's
// result is bitwise the same whatever other rows share the call, and however
// many. A plain GEMM picks kernels and blocking by the number of rows (and
// threads split by shape), so a row's float sums follow the batch: measured
// on OpenBLAS, about half of the rows change bits between batch sizes 1-100.
// The tile size is part of the guarantee, not a tuning knob: 64-row tiles
// were measured NOT invariant here (invariance_test: 33 / 72 decode steps
// equal), 8-row tiles are (72 / 72), at 1.5-1.8x the demo's rollout time.
constexpr int64_t kInvariantTileRows = 8;

// Rows per call for which the fused path's linear layers run
// kernels::linear_rows (W read in place, AVX-512 register tiles) instead of
// dense: OpenBLAS's sgemm packs W on every call (its HASWELL kernels on this
// CPU), and at::mv's dispatch costs more than the product for the demo's
// 128-wide layers. Measured one layer at a time (2 EPYC cores, 1 thread):
// 2-8 rows 2-6x faster on the demo's shapes, 1 row 1.5-8x; the 0.5B's 4864 x
// 896 layers 1.2-7x faster at 1-8 rows (2 threads). Past ~16 rows the demo's
// 1206-row LM head is faster as a packed GEMM. A batch-invariant call takes
// the kernel at any row count: its sums never depend on the batch.
constexpr int64_t kFusedLinearMinRows = 1;
constexpr int64_t kFusedLinearMaxRows = 16;
at::Tensor invariant_linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b);

class Model {
 public:
  // Parameters (and everything the engine and trainer derive from them: KV
  // cache, activations, optimiser state) live on `device` (device.h).
  Model(ModelConfig config, at::ScalarType dtype, at::Device device = at::Device(at::kCPU));

  const ModelConfig& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  const at::Device& device() const { return device_; }

  // normal(0, initializer_range) for matrices and embeddings, 0 for biases,
  // 1 for norms; drawn in float32 from `seed` and then cast, so a seed gives
  // the same model (up to rounding) in every dtype.
  void init_weights(uint64_t seed);

  // Parameters with their HF names, in a fixed order (shares storage).
  const NamedTensors& named_tensors() const { return params_; }
  // Copies every parameter from `tensors` (casting dtype). Every expected
  // name must be present with the config's shape; `lm_head.weight` of a tied
  // model and rotary `inv_freq` buffers are ignored; other extra names throw.
  void load_tensors(const NamedTensors& tensors);
  // Deep copy (e.g. the frozen reference policy), optionally in another dtype,
  // on the same device.
  Model clone(at::ScalarType dtype) const;
  void set_requires_grad(bool requires_grad);
  int64_t num_parameters() const;

  // Hidden states before the final norm, (N, hidden), for packed token ids
  // (N) at absolute positions (N); both int64, on the model's device or the
  // host (then copied over). batch_invariant:
  // every linear layer through invariant_linear (each row's numbers
  // independent of the others; norms, RoPE and activations are row-wise).
  at::Tensor forward_hidden(const at::Tensor& ids, const at::Tensor& positions, const AttentionFn& attention,
                            bool batch_invariant = false) const;
  // Logits (R, V) in the model dtype for selected hidden rows (R, hidden):
  // final RMSNorm then lm_head (the embedding when tied).
  at::Tensor logits(const at::Tensor& hidden_rows, bool batch_invariant = false) const;
  // The two halves of logits(): the final RMSNorm of hidden rows, and the
  // (V, hidden) LM head weight (the embedding when tied), for callers that
  // run the head in row chunks.
  at::Tensor final_norm(const at::Tensor& hidden_rows) const { return rms_norm(hidden_rows, final_norm_); }
  const at::Tensor& lm_head_weight() const { return lm_head_; }

  // RMSNorm as HF computes it: in float32 (float64 for float64 models),
  // y = w * (x / sqrt(mean(x^2) + eps)) cast back to x's dtype.
  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight) const;
  // The RoPE tables of positions (N): cos and sin of cat(angles, angles),
  // (N, D) in the model dtype; forward_hidden computes them once for every layer.
  std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& positions) const;
  // HF rotate_half RoPE on x (N, heads, D) with the tables of its positions.
  at::Tensor apply_rope(const at::Tensor& x, const std::pair<at::Tensor, at::Tensor>& tables) const;

  // Decode-time fast paths (kernels.h section 5, via dispatch::): RMSNorm,
  // RoPE and the engine's paged decode attention run as single CPU kernels
  // instead of torch op compositions inside the engine's extend (a
  // FusedInferenceScope), when x is a contiguous float or double CPU tensor
  // and autograd is off. Train steps and score_sequences (recomputed old
  // log-probs) always compose torch ops. On by default; off, the engine
  // composes too (the reference the tests compare with).
  void set_fused_inference(bool on) { fused_inference_ = on; }
  bool fused_inference_enabled() const { return fused_inference_; }
  bool fused_inference(const at::Tensor& x) const;
  const at::Tensor& inv_freq() const { return inv_freq_; }
  // A linear layer x W^T + b as forward_hidden and logits run it: in the
  // fused path, dispatch::linear (W read in place; row-invariant sums) for
  // calls of kFusedLinearMinRows..kFusedLinearMaxRows rows, and for every
  // batch-invariant call; otherwise invariant_linear when batch_invariant,
  // else dense.
  at::Tensor project(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b, bool batch_invariant) const;

 private:
  struct Layer {
    at::Tensor input_norm, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, q_norm, k_norm, post_norm;
    at::Tensor gate_w, gate_b, up_w, up_b, down_w, down_b;
  };
  at::Tensor& add(const std::string& name, std::vector<int64_t> shape, bool is_norm);
  void bind();

  ModelConfig config_;
  at::ScalarType dtype_;
  at::Device device_;
  NamedTensors params_;
  std::vector<bool> is_norm_;
  std::vector<Layer> layers_;
  at::Tensor embed_, final_norm_, lm_head_;
  at::Tensor inv_freq_;  // (D/2) float64 on the device, scaling applied
  bool fused_inference_ = true;
};

// Marks the current thread as inside the engine's extend (see
// Model::set_fused_inference) for the scope's lifetime.
class FusedInferenceScope {
 public:
  FusedInferenceScope();
  ~FusedInferenceScope();
  FusedInferenceScope(const FusedInferenceScope&) = delete;
  FusedInferenceScope& operator=(const FusedInferenceScope&) = delete;

 private:
  bool previous_;
};

// `config`'s inverse RoPE frequencies 1 / theta^(2i/D), i < D/2, float64, with
// llama3 (HF _compute_llama3_parameters) or linear scaling when configured.
at::Tensor rope_inv_freq(const ModelConfig& config);

// "(2, 3)" for messages.
std::string shape_string(at::IntArrayRef shape);

}  // namespace model
}  // namespace arpo
