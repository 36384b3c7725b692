// Where a model lives, and the one dispatch point from the torch layer to
// the fused kernels: each function takes the logits as a tensor and calls
// arpo::kernels (CPU tensors, on the host threads) or arpo::cuda (CUDA
// tensors, on the current stream of the tensor's device) by its device.
// Nothing else in native/torch names a device or calls a kernel directly.
//
// Per-row inputs the callers hold on the host (targets, old log-probs,
// advantages, copy sums) are host pointers: used in place on the CPU, copied
// to the device in one transfer on CUDA. The engine's per-step index data is
// already on the device (one packed transfer, engine.cc), so sample_tokens
// takes its streams and positions as tensors beside the logits. Outputs are
// host pointers (one device-to-host transfer on CUDA).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "kernels/kernels.h"

namespace arpo {
namespace model {

// "cpu" | "cuda" | "cuda:N" -> a device. `field` names the setting in
// errors (model.device). CUDA needs a build with CUDA (compat::kCudaBuild) and
// a visible device N; otherwise ModelError says which is missing.
at::Device parse_device(const std::string& name, const char* field = "model.device");
std::string device_name(const at::Device& device);
// Whether this build can place models on CUDA devices.
bool cuda_build();

namespace dispatch {

// logits (R, V) float32 contiguous; targets (R) host or null.
void logits_stats(float* logprobs, float* entropies, const at::Tensor& logits, const int32_t* targets,
                  float temperature, int32_t threads);

// logits (P, V) float32 contiguous; streams, positions (P) int64 on the
// logits' device (streams hold the uint64 bits).
void sample_tokens(int32_t* tokens, float* logprobs, float* entropies, float* norm_entropies, const at::Tensor& logits,
                   const at::Tensor& streams, const at::Tensor& positions, const kernels::SamplingParams& params,
                   int32_t threads);

// The flat fused loss (kernels.h section 4): logits (R, V) float32
// contiguous are overwritten with d loss / d logits. Row inputs are host
// arrays of R (seq_ids, ref_logprobs may be null); logprobs (R) host out or null.
void policy_loss(kernels::PolicyLossResult* result, float* logprobs, at::Tensor& logits, const int32_t* targets,
                 const float* old_logprobs, const float* advantages, const float* mask, const int32_t* seq_ids,
                 int64_t num_seqs, const float* ref_logprobs, const kernels::PolicyLossConfig& config,
                 int32_t threads);

// The copy-sum loss over tree rows (kernels.h section 4b), likewise; the
// sums are host arrays of R doubles.
void policy_loss_copies(kernels::PolicyLossResult* result, at::Tensor& logits, const int32_t* targets,
                        const float* old_logprobs, const kernels::TokenCopySums& sums, int64_t num_seqs,
                        const float* ref_logprobs, const kernels::PolicyLossConfig& config, int32_t threads);

// Decode-time ops (kernels.h section 5; Model::fused_inference decides when).
// CPU kernels only: on CUDA (and for bfloat16) the model composes torch ops,
// so fused_inference_supported is false there.
bool fused_inference_supported(const at::Tensor& x);
// x (..., dim) contiguous -> a new tensor of x's shape.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// x (N, heads, D) contiguous, rotated in place; cos/sin (N, D) of x's dtype.
void rope_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// x (M, K) contiguous, W (N, K) and bias (N, or undefined) of x's dtype ->
// a new (M, N) tensor x W^T + bias (kernels::linear_rows).
at::Tensor linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& bias);
// Paged attention of query rows over cached context
// (kernels::paged_decode_attention) into rows of out (N, H * D): q (N, H, D),
// pools (slots, KVH, D), rows (B), slots (B, max_ctx) and lengths (B) int64,
// all on the CPU. With offsets (B), slots is one flat list and row b reads
// slots[offsets[b] ..][:lengths[b]]; with counts (B) too, b is a group of
// counts[b] rows rows[b] + t reading lengths[b] + t keys of that list (the
// rows of a multi-token path: causal attention).
void decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& kpool, const at::Tensor& vpool,
                      const at::Tensor& rows, const at::Tensor& slots, const at::Tensor& lengths, double scale,
                      const at::Tensor& offsets = at::Tensor(), const at::Tensor& counts = at::Tensor());

}  // namespace dispatch
}  // namespace model
}  // namespace arpo
