// CUDA versions of the arpo fused kernels (native/kernels/kernels.h): the
// same functions, arguments and semantics, on DEVICE pointers, plus a
// trailing stream (a cudaStream_t passed as void*, so this header needs no
// CUDA headers; nullptr = the legacy default stream).
//
// Every function validates like its CPU twin (same messages, with "(cuda)"
// after the operation name), checks every CUDA call and launch, and throws
// arpo::kernels::Error; nothing aborts. Data-dependent checks (targets, spans,
// parents) run on the device and are reported when the function synchronises
// its stream before returning: every call here is synchronous with respect to
// the host (policy_loss must return its host-side result anyway; a rejected
// call leaves its outputs untouched). Pointers must be device (or managed)
// memory on the current device; `Threads` arguments do not exist here.
//
// How the torch layer calls these (native/torch, under #ifdef ARPO_WITH_CUDA,
// for tensors with .is_cuda()):
//   #include <c10/cuda/CUDAGuard.h>
//   #include <ATen/cuda/CUDAContext.h>
//   #include "cuda/kernels_cuda.h"
//   const c10::cuda::CUDAGuard guard(logits.device());     // right device
//   auto x = logits.contiguous();                           // (T, V) row-major
//   arpo::kernels::Logits lg{x.data_ptr(), x.scalar_type() == at::kBFloat16 ?
//       arpo::kernels::DType::BF16 : arpo::kernels::DType::F32, x.size(0), x.size(1)};
//   arpo::cuda::logits_stats(lse.data_ptr<float>(), ..., lg, targets.data_ptr<int32_t>(),
//       temperature, at::cuda::getCurrentCUDAStream().stream());
// Outputs are float32 / int32 tensors allocated on the same device (torch's
// caching allocator); the kernels allocate only a small cached workspace of
// their own (O(T) for policy_loss and sample_tokens, O(P) for tree_expand).
// For autograd, call policy_loss with grad = a fresh float32 (T, V) tensor
// (or the float32 logits themselves when they are not needed afterwards) in
// forward, save it, and return grad_output * saved_grad in backward.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace arpo {
namespace cuda {

using kernels::Logits;
using kernels::PolicyLossConfig;
using kernels::PolicyLossResult;
using kernels::SamplingParams;

// True when the CUDA runtime sees at least one device (never throws).
bool available();

// 1. Fused logits -> stats (one read of each row; see kernels.h section 1).
void logits_stats(float* logsumexp, float* entropy, float* entropy_norm, float* target_logprob,
                  const Logits& logits, const int32_t* targets, float temperature, void* stream);

// 2. Stats + one sampled token per row, bit-identical to the CPU sampler's
// choice (same counter-based Gumbel noise in double, same top-k / top-p
// thresholds with ties kept) up to floating-point ties.
void sample_tokens(int32_t* tokens, float* logprobs, float* entropy, float* entropy_norm, const Logits& logits,
                   const uint64_t* streams, const int64_t* positions, const SamplingParams& params, void* stream);

// 3. Windowed entropy change after tool calls.
void entropy_delta(float* window_mean, int32_t* window_count, float* delta, const float* entropy, int64_t T,
                   const int64_t* starts, const int64_t* ends, const int32_t* baseline, int64_t S, int32_t k,
                   void* stream);

// 4. Clipped-ratio policy loss forward + backward; `result` is HOST memory,
// everything else device memory. grad may alias float32 logits.
void policy_loss(PolicyLossResult* result, float* grad, float* logprobs, float* entropy, const Logits& logits,
                 const int32_t* targets, const float* old_logprobs, const float* advantages, const float* mask,
                 const int32_t* seq_ids, int64_t num_seqs, const float* ref_logprobs, const PolicyLossConfig& config,
                 void* stream);

// 4b. The same loss over rows standing for several copies of one token
// (kernels.h 4b): `sums` holds DEVICE arrays of T doubles each.
void policy_loss_copies(PolicyLossResult* result, float* grad, float* logprobs, float* entropy, const Logits& logits,
                        const int32_t* targets, const float* old_logprobs, const kernels::TokenCopySums& sums,
                        int64_t num_seqs, const float* ref_logprobs, const PolicyLossConfig& config, void* stream);

// 5. Tree advantage reduction and per-token expansion.
void tree_reduce(float* node_sum, float* node_mean, int32_t* node_count, const int32_t* parent, int64_t N,
                 const int32_t* leaf_node, const float* leaf_adv, int64_t L, void* stream);
void tree_expand(float* token_value, int64_t P, const float* node_value, const int64_t* token_offset,
                 const int64_t* token_count, int64_t N, void* stream);

// Benchmark baseline: device-to-device copy of `bytes` (cudaMemcpyAsync),
// the bandwidth ceiling the kernels are reported against.
void copy_baseline(void* dst, const void* src, int64_t bytes, void* stream);

// Benchmark/test data: dst[i] = scale * N(0, 1) drawn from the counter-based
// RNG (rng.h, Box-Muller), as float32 or bfloat16 bits; n elements.
void fill_normal(void* dst, kernels::DType dtype, int64_t n, float scale, uint64_t seed, void* stream);

// Launch-geometry overrides for benchmarks and tuning sweeps (0 = the
// built-in choice). Process-wide; not for concurrent use.
struct Tuning {
  int stats_threads = 0;      // threads per block of logits_stats
  int stats_cluster = 0;      // blocks (cluster size, 1..8) per row of logits_stats
  int loss_threads = 0;       // threads per block of policy_loss
  int loss_cluster = 0;       // blocks per row of policy_loss
  int loss_blocks_per_sm = 0; // cap on resident policy_loss blocks per SM (via unused shared memory)
};
void set_tuning(const Tuning& tuning);
Tuning get_tuning();

}  // namespace cuda
}  // namespace arpo
