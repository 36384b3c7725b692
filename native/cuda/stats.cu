// CUDA fused logits -> stats (logits_stats) and the Gumbel-max sampler
// (sample_tokens). logits_stats fuses scale-by-temperature -> max -> sum-exp
// -> entropy -> target logprob into ONE read of each row (16-byte loads,
// online rescaling); it never materialises softmax or any (T, V) temporary.
// Short batches split each row over a thread-block cluster so that few rows
// still fill the GPU.
#include <string>

#include "cuda/common.cuh"
#include "kernels/rng.h"
#include "kernels/row_stats.h"

namespace arpo {
namespace cuda {
namespace detail {
namespace {

// ---------------------------------------------------------------- logits_stats
__global__ void validate_targets(const int32_t* targets, int64_t T, int64_t V, Status* status) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < T;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (targets[t] >= V) fail(status, kTargetOutsideVocab, t, targets[t], V);
}

// One row per cluster of `cluster` blocks (blockIdx.x = row * cluster + rank).
template <typename T>
__global__ void __launch_bounds__(1024) stats_rows(float* logsumexp, float* entropy, float* entropy_norm,
                                                   float* target_logprob, const T* logits, const int32_t* targets,
                                                   int64_t V, float inv_t, double log_v, int cluster,
                                                   const Status* status) {
  __shared__ Online scratch[33];
  __shared__ Online slot;
  if (status->code != kOk) return;  // uniform over the grid: no cluster barrier is left waiting
  constexpr int N = Elem<T>::kPerVec;
  const int64_t t = blockIdx.x / cluster;
  const int rank = static_cast<int>(blockIdx.x % cluster);
  const T* row = logits + t * V;
  int64_t b, e;
  row_slice(V, rank, cluster, &b, &e);
  Online acc = online_empty();
  for_slice<T, 4, false>(
      row, b, e,
      [&](const float* x, int64_t) {
        float z[N];
#pragma unroll
        for (int i = 0; i < N; ++i) z[i] = x[i] * inv_t;
        online_add<N>(acc, z);
      },
      [&](float x, int64_t) {
        const float z = x * inv_t;
        online_add<1>(acc, &z);
      });
  acc = block_merge(acc, scratch);
  acc = cluster_merge(acc, &slot, scratch, cluster);
  if (rank != 0 || threadIdx.x != 0) return;
  const double lse = online_lse(acc), h = online_entropy(acc);
  if (logsumexp) logsumexp[t] = static_cast<float>(lse);
  if (entropy) entropy[t] = static_cast<float>(h);
  if (entropy_norm) entropy_norm[t] = V > 1 ? static_cast<float>(h / log_v) : 0.0f;
  if (target_logprob) {
    const int32_t tgt = targets ? targets[t] : -1;
    if (tgt < 0) {
      target_logprob[t] = 0.0f;
    } else {
      const float zt = Elem<T>::to_float(row[tgt]) * inv_t;
      target_logprob[t] = (zt == kNegInf || lse == -HUGE_VAL) ? kNegInf : static_cast<float>(static_cast<double>(zt) - lse);
    }
  }
}

// ---------------------------------------------------------------- sampling
// Order-preserving map float -> uint32 (larger float, larger key; -0 < +0).
__device__ __forceinline__ uint32_t float_key(float z) {
  const uint32_t b = __float_as_uint(z);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// exp(z - m) for the top-p masses, as the CPU's exp_nonpos: 0 below -87.3.
__device__ __forceinline__ double mass_of(float z, float m) {
  const float y = z - m;
  return y < -87.3f ? 0.0 : static_cast<double>(expf(y));
}

// Upper bound of rng::gumbel (u <= 1 - 2^-54 gives < 37.43): a value with
// z + kGumbelMax < best cannot win and skips its two logs (as on the CPU).
constexpr double kGumbelMax = 38.0;

// Block-wide (max z, lowest index) and (max value, lowest index) reductions.
struct ArgMax {
  double v;
  int64_t j;
};
__device__ __forceinline__ bool better(const ArgMax& a, const ArgMax& b) { return a.v > b.v || (a.v == b.v && a.j < b.j); }
__device__ __forceinline__ ArgMax block_argmax(ArgMax a, ArgMax* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    ArgMax b{__shfl_xor_sync(0xffffffffu, a.v, off), __shfl_xor_sync(0xffffffffu, a.j, off)};
    if (better(b, a)) a = b;
  }
  if (lane == 0) scratch[warp] = a;
  __syncthreads();
  if (warp == 0) {
    ArgMax b = lane < nwarps ? scratch[lane] : ArgMax{-HUGE_VAL, INT64_MAX};
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      ArgMax c{__shfl_xor_sync(0xffffffffu, b.v, off), __shfl_xor_sync(0xffffffffu, b.j, off)};
      if (better(c, b)) b = c;
    }
    if (lane == 0) scratch[32] = b;
  }
  __syncthreads();
  const ArgMax r = scratch[32];
  __syncthreads();
  return r;
}

// Visits every z = x * inv_t of the row with this block's threads.
template <typename T, typename Fn>
__device__ __forceinline__ void for_row_z(const T* row, int64_t V, float inv_t, Fn&& fn) {
  constexpr int N = Elem<T>::kPerVec;
  for_slice<T, 4, false>(
      row, 0, V,
      [&](const float* x, int64_t j0) {
#pragma unroll
        for (int i = 0; i < N; ++i) fn(x[i] * inv_t, j0 + i);
      },
      [&](float x, int64_t j) { fn(x * inv_t, j); });
}

// One block per row. Pass 1: statistics and the lowest-index argmax. Then,
// only when restricted, the top-k threshold (the k-th largest z, ties kept:
// the largest key K with count(key >= K) >= k) and the top-p threshold (the
// largest z value v with mass(z >= v) >= top_p * mass(z >= thr_k)), each a
// binary search over the 32-bit key space with block-wide counts / double
// mass sums (the row stays in L2 between passes). Last pass: Gumbel-max over
// the allowed tokens, in double, exactly as the CPU sampler.
template <typename T>
__global__ void __launch_bounds__(1024) sample_rows(int32_t* tokens, float* logprobs, float* entropy,
                                                    float* entropy_norm, const T* logits, int64_t V,
                                                    const uint64_t* streams, const int64_t* positions, float inv_t,
                                                    int greedy, int32_t top_k, float top_p, uint64_t seed,
                                                    double log_v, Status* status) {
  __shared__ Online scratch[33];
  __shared__ ArgMax arg_scratch[33];
  __shared__ double sum_scratch[33];
  const int64_t t = blockIdx.x;
  const T* row = logits + t * V;
  Online acc = online_empty();
  ArgMax top{-HUGE_VAL, INT64_MAX};  // (max z, lowest index)
  constexpr int N = Elem<T>::kPerVec;
  for_slice<T, 4, false>(
      row, 0, V,
      [&](const float* x, int64_t j0) {
        float z[N];
#pragma unroll
        for (int i = 0; i < N; ++i) {
          z[i] = x[i] * inv_t;
          if (z[i] > top.v) top = ArgMax{z[i], j0 + i};  // indices grow per thread: first max kept
        }
        online_add<N>(acc, z);
      },
      [&](float x, int64_t j) {
        const float z = x * inv_t;
        if (z > top.v) top = ArgMax{z, j};
        online_add<1>(acc, &z);
      });
  acc = block_merge(acc, scratch);
  top = block_argmax(top, arg_scratch);
  const double lse = online_lse(acc), h = online_entropy(acc);
  if (lse != lse || lse == HUGE_VAL) {
    if (threadIdx.x == 0) fail(status, kRowNotFinite, t, 0);
    return;
  }
  int64_t tok = 0;  // all -inf: token 0 with logprob -inf (as the CPU)
  if (top.j != INT64_MAX) {
    const float zmax = static_cast<float>(top.v);
    if (greedy) {
      tok = top.j;
    } else {
      float thr = kNegInf;
      if (top_k > 0 && top_k < V) {
        uint64_t lo = 0, hi = static_cast<uint64_t>(float_key(zmax)) + 1;  // count(>= lo) = V >= k, count(>= hi) = 0
        while (hi - lo > 1) {
          const uint32_t mid = static_cast<uint32_t>(lo + (hi - lo) / 2);
          int local = 0;
          for_row_z(row, V, inv_t, [&](float z, int64_t) { local += float_key(z) >= mid ? 1 : 0; });
          const double cnt = block_sum(static_cast<double>(local), sum_scratch);
          if (cnt >= top_k) lo = mid;
          else hi = mid;
        }
        thr = key_float(static_cast<uint32_t>(lo));
      }
      if (top_p < 1.0f) {
        double total = 0;
        for_row_z(row, V, inv_t, [&](float z, int64_t) { total += z >= thr ? mass_of(z, zmax) : 0.0; });
        total = block_sum(total, sum_scratch);
        const double need = static_cast<double>(top_p) * total;
        uint64_t lo = thr == kNegInf ? 0 : float_key(thr), hi = static_cast<uint64_t>(float_key(zmax)) + 1;
        while (hi - lo > 1) {
          const uint32_t mid = static_cast<uint32_t>(lo + (hi - lo) / 2);
          double mass = 0;
          for_row_z(row, V, inv_t, [&](float z, int64_t) { mass += float_key(z) >= mid ? mass_of(z, zmax) : 0.0; });
          mass = block_sum(mass, sum_scratch);
          if (mass >= need) lo = mid;
          else hi = mid;
        }
        if (lo != 0) thr = key_float(static_cast<uint32_t>(lo));
      }
      const uint64_t key = rng::row_key(seed, streams[t], positions[t]);
      const double best0 = static_cast<double>(zmax) + rng::gumbel(key, top.j);  // the argmax is always allowed
      ArgMax best{-HUGE_VAL, INT64_MAX};
      for_row_z(row, V, inv_t, [&](float z, int64_t j) {
        if (z < thr || z == kNegInf || static_cast<double>(z) + kGumbelMax < best0) return;
        const double u = rng::uniform(key, j);
        if (static_cast<double>(z) + rng::gumbel_bound_of(u) < best0) return;  // cannot win: no logs
        const ArgMax c{static_cast<double>(z) + rng::gumbel_of(u), j};
        if (better(c, best)) best = c;
      });
      tok = block_argmax(best, arg_scratch).j;
    }
  }
  if (threadIdx.x != 0) return;
  tokens[t] = static_cast<int32_t>(tok);
  if (logprobs) {
    const float zt = Elem<T>::to_float(row[tok]) * inv_t;
    logprobs[t] = (zt == kNegInf || lse == -HUGE_VAL) ? kNegInf : static_cast<float>(static_cast<double>(zt) - lse);
  }
  if (entropy) entropy[t] = static_cast<float>(h);
  if (entropy_norm) entropy_norm[t] = V > 1 ? static_cast<float>(h / log_v) : 0.0f;
}

// Blocks per row for logits_stats: enough rows*cluster to fill the GPU, but
// no slice under 8K elements; clusters need sm_90.
RowLaunch stats_geometry(int64_t T, int64_t V, const char* op) {
  const DeviceInfo& dev = device_info(op);
  RowLaunch g;
  g.threads = 512;
  const int64_t want = static_cast<int64_t>(dev.sm_count) * 4;  // 4 blocks of 512 per SM
  if (dev.major >= 9 && T < want) {
    int64_t c = (want + T - 1) / T;
    c = std::min<int64_t>(c, std::max<int64_t>(1, V / 8192));
    g.cluster = static_cast<int>(c >= 8 ? 8 : c >= 4 ? 4 : c >= 2 ? 2 : 1);
  }
  g = apply_tuning(g, 0);
  if (dev.major < 9) g.cluster = 1;
  return g;
}

std::string n(long long v) { return std::to_string(v); }

}  // namespace
}  // namespace detail

void logits_stats(float* logsumexp, float* entropy, float* entropy_norm, float* target_logprob, const Logits& logits,
                  const int32_t* targets, float temperature, void* stream_ptr) {
  using namespace detail;
  const char* op = "logits_stats";
  kernels::detail::check_logits(logits, "logits_stats (cuda)");
  if (!(temperature > 0.0f) || !std::isfinite(temperature))
    throw Error("logits_stats (cuda): temperature must be finite and > 0, got " + std::to_string(temperature));
  const int64_t T = logits.rows, V = logits.vocab;
  if (T == 0) return;
  const cudaStream_t stream = as_stream(stream_ptr);
  auto* status = reinterpret_cast<Status*>(workspace(kStatusBytes, kStatusBytes, stream, op));
  if (target_logprob && targets) {
    const int blocks = static_cast<int>(std::min<int64_t>((T + 255) / 256, 1024));
    validate_targets<<<blocks, 256, 0, stream>>>(targets, T, V, status);
    check_launch(op, "validate_targets");
  }
  const float inv_t = 1.0f / temperature;
  const double log_v = std::log(static_cast<double>(V));
  const RowLaunch g = stats_geometry(T, V, op);
  if (logits.dtype == kernels::DType::F32)
    launch_rows(stats_rows<float>, T, g, stream, op, "stats_rows<f32>", logsumexp, entropy, entropy_norm,
                target_logprob, static_cast<const float*>(logits.data), targets, V, inv_t, log_v, g.cluster,
                static_cast<const Status*>(status));
  else
    launch_rows(stats_rows<uint16_t>, T, g, stream, op, "stats_rows<bf16>", logsumexp, entropy, entropy_norm,
                target_logprob, static_cast<const uint16_t*>(logits.data), targets, V, inv_t, log_v, g.cluster,
                static_cast<const Status*>(status));
  const Status st = read_status(status, stream, op);
  if (st.code == kTargetOutsideVocab)
    throw Error("logits_stats (cuda): targets[" + n(st.index) + "] = " + n(st.value) + " is outside the vocabulary [0, " +
                n(st.extra) + ")");
  if (st.code != kOk) throw Error("logits_stats (cuda): device reported status " + n(st.code));
}

void sample_tokens(int32_t* tokens, float* logprobs, float* entropy, float* entropy_norm, const Logits& logits,
                   const uint64_t* streams, const int64_t* positions, const SamplingParams& params, void* stream_ptr) {
  using namespace detail;
  const char* op = "sample_tokens";
  kernels::detail::check_logits(logits, "sample_tokens (cuda)");
  const int64_t T = logits.rows, V = logits.vocab;
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature))
    throw Error("sample_tokens (cuda): temperature must be finite and >= 0 (0 = greedy), got " +
                std::to_string(params.temperature));
  if (!(params.top_p > 0.0f)) throw Error("sample_tokens (cuda): top_p must be in (0, 1], got " + std::to_string(params.top_p));
  if (params.temperature > 0.0f && 1.0f / params.temperature == HUGE_VALF)
    throw Error("sample_tokens (cuda): temperature " + std::to_string(params.temperature) +
                " is too small (1/temperature overflows)");
  if (T == 0) return;
  if (!tokens) throw Error("sample_tokens (cuda): tokens output is null");
  const bool greedy = params.temperature == 0.0f;
  if (!greedy && (!streams || !positions))
    throw Error("sample_tokens (cuda): streams and positions are required when temperature > 0");
  if (T > 0x7fffffffLL) throw Error("sample_tokens (cuda): too many rows: " + n(T));
  const cudaStream_t stream = as_stream(stream_ptr);
  auto* status = reinterpret_cast<Status*>(workspace(kStatusBytes, kStatusBytes, stream, op));
  const float inv_t = greedy ? 1.0f : 1.0f / params.temperature;
  const double log_v = std::log(static_cast<double>(V));
  const dim3 grid(static_cast<unsigned>(T)), block(1024);
  if (logits.dtype == kernels::DType::F32)
    sample_rows<float><<<grid, block, 0, stream>>>(tokens, logprobs, entropy, entropy_norm,
                                                   static_cast<const float*>(logits.data), V, streams, positions, inv_t,
                                                   greedy ? 1 : 0, params.top_k, params.top_p, params.seed, log_v, status);
  else
    sample_rows<uint16_t><<<grid, block, 0, stream>>>(tokens, logprobs, entropy, entropy_norm,
                                                      static_cast<const uint16_t*>(logits.data), V, streams, positions,
                                                      inv_t, greedy ? 1 : 0, params.top_k, params.top_p, params.seed,
                                                      log_v, status);
  check_launch(op, "sample_rows");
  const Status st = read_status(status, stream, op);
  if (st.code == kRowNotFinite)
    throw Error("sample_tokens (cuda): logits row " + n(st.index) + " contains NaN or +inf");
  if (st.code != kOk) throw Error("sample_tokens (cuda): device reported status " + n(st.code));
}

}  // namespace cuda
}  // namespace arpo
