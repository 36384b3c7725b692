// CUDA rollout-tree kernels: the windowed entropy change after tool calls
// (ARPO.md section 1) and the shared-prefix advantage reduction / per-token
// expansion (ARPO.md section 2), with the semantics of native/kernels/tree.cc.
// Validation runs on the device first; the kernels that write outputs skip
// all work when it failed, so a rejected call writes nothing (as on the CPU).
#include <string>

#include "cuda/common.cuh"

namespace arpo {
namespace cuda {
namespace detail {
namespace {

std::string s(long long v) { return std::to_string(v); }

inline int grid_for(int64_t n, int threads) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 4096)));
}

#define ARPO_GRID_STRIDE(i, n)                                                           \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---------------------------------------------------------------- entropy_delta
__global__ void validate_segments(const int64_t* starts, const int64_t* ends, const int32_t* baseline, int64_t T,
                                  int64_t S, Status* status) {
  ARPO_GRID_STRIDE(i, S) {
    if (starts[i] < 0 || ends[i] > T || starts[i] > ends[i]) fail(status, kSegmentSpan, i, starts[i], ends[i]);
    if (baseline && baseline[i] >= S) fail(status, kBaseline, i, baseline[i]);
  }
}

// mean of entropy over the first min(k, length) tokens of segment i, summed
// in double in token order (bit-identical to the CPU).
__device__ __forceinline__ double window_of(const float* entropy, const int64_t* starts, const int64_t* ends, int64_t i,
                                            int32_t k, int64_t* count) {
  const int64_t n = min(static_cast<int64_t>(k), ends[i] - starts[i]);
  double sum = 0;
  for (int64_t t = starts[i]; t < starts[i] + n; ++t) sum += entropy[t];
  *count = n;
  return n > 0 ? sum / n : 0.0;
}

__global__ void segment_windows(float* window_mean, int32_t* window_count, float* delta, const float* entropy,
                                const int64_t* starts, const int64_t* ends, const int32_t* baseline, int64_t S,
                                int32_t k, const Status* status) {
  if (status->code != kOk) return;
  ARPO_GRID_STRIDE(i, S) {
    int64_t n = 0;
    const double mean = window_of(entropy, starts, ends, i, k, &n);
    window_mean[i] = static_cast<float>(mean);
    if (window_count) window_count[i] = static_cast<int32_t>(n);
    if (delta) {
      const int32_t b = baseline ? baseline[i] : -1;
      if (b < 0 || b == i) {
        delta[i] = 0.0f;
      } else {
        int64_t nb = 0;
        delta[i] = static_cast<float>(mean - window_of(entropy, starts, ends, b, k, &nb));
      }
    }
  }
}

// ---------------------------------------------------------------- tree_reduce
__global__ void validate_tree(const int32_t* parent, int64_t N, const int32_t* leaf_node, int64_t L, Status* status) {
  ARPO_GRID_STRIDE(i, N + L) {
    if (i < N) {
      if (parent[i] < -1 || parent[i] >= i) fail(status, kParent, i, parent[i], 0);
    } else {
      const int64_t l = i - N;
      if (leaf_node[l] < 0 || leaf_node[l] >= N) fail(status, kLeafNode, l, leaf_node[l], N);
    }
  }
}

// Each leaf adds its advantage to every node on its path to the root
// (O(L x depth); parents are validated to be earlier nodes, so the walk ends).
__global__ void accumulate_leaves(double* sum, unsigned long long* count, const int32_t* parent,
                                  const int32_t* leaf_node, const float* leaf_adv, int64_t L, const Status* status) {
  if (status->code != kOk) return;
  ARPO_GRID_STRIDE(l, L) {
    const double adv = leaf_adv[l];
    for (int64_t n = leaf_node[l]; n >= 0; n = parent[n]) {
      atomicAdd(&sum[n], adv);
      atomicAdd(&count[n], 1ull);
    }
  }
}

__global__ void write_nodes(float* node_sum, float* node_mean, int32_t* node_count, const double* sum,
                            const unsigned long long* count, int64_t N, const Status* status) {
  if (status->code != kOk) return;
  ARPO_GRID_STRIDE(n, N) {
    const double s_n = __ldcg(&sum[n]);
    const unsigned long long c = __ldcg(&count[n]);
    if (node_sum) node_sum[n] = static_cast<float>(s_n);
    if (node_mean) node_mean[n] = c > 0 ? static_cast<float>(s_n / static_cast<double>(c)) : 0.0f;
    if (node_count) node_count[n] = static_cast<int32_t>(c);
  }
}

// ---------------------------------------------------------------- tree_expand
// One block per node (grid-stride): validate its span, then claim its tokens
// with atomicMax, so where spans overlap the LAST node wins, as in the CPU's
// sequential loop.
__global__ void claim_tokens(int32_t* owner, const int64_t* token_offset, const int64_t* token_count, int64_t N,
                             int64_t P, Status* status) {
  for (int64_t nd = blockIdx.x; nd < N; nd += gridDim.x) {
    const int64_t o = token_offset[nd], c = token_count[nd];
    if (o < 0 || c < 0 || o > P || c > P - o) {
      if (threadIdx.x == 0) fail(status, kTokenSpan, nd, o, c);
      continue;
    }
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) atomicMax(&owner[o + i], static_cast<int32_t>(nd));
  }
}

__global__ void fill_tokens(float* token_value, const float* node_value, const int32_t* owner, int64_t P,
                            const Status* status) {
  if (status->code != kOk) return;
  ARPO_GRID_STRIDE(i, P) {
    const int32_t nd = __ldcg(&owner[i]);
    if (nd >= 0) token_value[i] = node_value[nd];
  }
}

}  // namespace
}  // namespace detail

void entropy_delta(float* window_mean, int32_t* window_count, float* delta, const float* entropy, int64_t T,
                   const int64_t* starts, const int64_t* ends, const int32_t* baseline, int64_t S, int32_t k,
                   void* stream_ptr) {
  using namespace detail;
  const char* op = "entropy_delta";
  if (k < 1) throw Error("entropy_delta (cuda): k must be >= 1, got " + s(k));
  if (T < 0) throw Error("entropy_delta (cuda): T must be >= 0, got " + s(T));
  if (S < 0) throw Error("entropy_delta (cuda): S must be >= 0, got " + s(S));
  if (S == 0) return;
  if (!window_mean || !starts || !ends) throw Error("entropy_delta (cuda): window_mean, starts and ends are required");
  if (T > 0 && !entropy) throw Error("entropy_delta (cuda): entropy is null with T = " + s(T));
  const cudaStream_t stream = as_stream(stream_ptr);
  auto* status = reinterpret_cast<Status*>(workspace(kStatusBytes, kStatusBytes, stream, op));
  validate_segments<<<grid_for(S, 256), 256, 0, stream>>>(starts, ends, baseline, T, S, status);
  check_launch(op, "validate_segments");
  segment_windows<<<grid_for(S, 256), 256, 0, stream>>>(window_mean, window_count, delta, entropy, starts, ends,
                                                        baseline, S, k, status);
  check_launch(op, "segment_windows");
  const Status st = read_status(status, stream, op);
  if (st.code == kSegmentSpan)
    throw Error("entropy_delta (cuda): segment " + s(st.index) + " = [" + s(st.value) + ", " + s(st.extra) +
                ") is not inside [0, " + s(T) + ") or is reversed");
  if (st.code == kBaseline)
    throw Error("entropy_delta (cuda): baseline[" + s(st.index) + "] = " + s(st.value) +
                " is not a segment index (S = " + s(S) + ")");
  if (st.code != kOk) throw Error("entropy_delta (cuda): device reported status " + s(st.code));
}

void tree_reduce(float* node_sum, float* node_mean, int32_t* node_count, const int32_t* parent, int64_t N,
                 const int32_t* leaf_node, const float* leaf_adv, int64_t L, void* stream_ptr) {
  using namespace detail;
  const char* op = "tree_reduce";
  if (N < 0) throw Error("tree_reduce (cuda): N must be >= 0, got " + s(N));
  if (L < 0) throw Error("tree_reduce (cuda): L must be >= 0, got " + s(L));
  if (N > 0 && !parent) throw Error("tree_reduce (cuda): parent is null with N = " + s(N));
  if (L > 0 && (!leaf_node || !leaf_adv)) throw Error("tree_reduce (cuda): leaf_node and leaf_adv are required with L = " + s(L));
  if (N > 0x7fffffffLL) throw Error("tree_reduce (cuda): N must be < 2^31, got " + s(N));
  if (N == 0 && L == 0) return;
  const cudaStream_t stream = as_stream(stream_ptr);
  const size_t o_sum = kStatusBytes, o_count = o_sum + aligned(sizeof(double) * static_cast<size_t>(N));
  const size_t total = o_count + aligned(sizeof(unsigned long long) * static_cast<size_t>(N));
  char* ws = workspace(total, total, stream, op);
  auto* status = reinterpret_cast<Status*>(ws);
  auto* sum = reinterpret_cast<double*>(ws + o_sum);
  auto* count = reinterpret_cast<unsigned long long*>(ws + o_count);
  validate_tree<<<grid_for(N + L, 256), 256, 0, stream>>>(parent, N, leaf_node, L, status);
  check_launch(op, "validate_tree");
  if (L > 0) {
    accumulate_leaves<<<grid_for(L, 256), 256, 0, stream>>>(sum, count, parent, leaf_node, leaf_adv, L, status);
    check_launch(op, "accumulate_leaves");
  }
  if (N > 0) {
    write_nodes<<<grid_for(N, 256), 256, 0, stream>>>(node_sum, node_mean, node_count, sum, count, N, status);
    check_launch(op, "write_nodes");
  }
  const Status st = read_status(status, stream, op);
  if (st.code == kParent)
    throw Error("tree_reduce (cuda): parent[" + s(st.index) + "] = " + s(st.value) +
                " must be -1 (root) or an earlier node in [0, " + s(st.index) + ")");
  if (st.code == kLeafNode)
    throw Error("tree_reduce (cuda): leaf_node[" + s(st.index) + "] = " + s(st.value) + " is outside [0, " + s(N) + ")");
  if (st.code != kOk) throw Error("tree_reduce (cuda): device reported status " + s(st.code));
}

void tree_expand(float* token_value, int64_t P, const float* node_value, const int64_t* token_offset,
                 const int64_t* token_count, int64_t N, void* stream_ptr) {
  using namespace detail;
  const char* op = "tree_expand";
  if (P < 0) throw Error("tree_expand (cuda): P must be >= 0, got " + s(P));
  if (N < 0) throw Error("tree_expand (cuda): N must be >= 0, got " + s(N));
  if (N == 0) return;
  if (!node_value || !token_offset || !token_count)
    throw Error("tree_expand (cuda): node_value, token_offset and token_count are required");
  if (P > 0 && !token_value) throw Error("tree_expand (cuda): token_value is null with P = " + s(P));
  if (N > 0x7fffffffLL) throw Error("tree_expand (cuda): N must be < 2^31, got " + s(N));
  const cudaStream_t stream = as_stream(stream_ptr);
  const size_t o_owner = kStatusBytes, total = o_owner + aligned(sizeof(int32_t) * static_cast<size_t>(P));
  char* ws = workspace(total, kStatusBytes, stream, op);
  auto* status = reinterpret_cast<Status*>(ws);
  auto* owner = reinterpret_cast<int32_t*>(ws + o_owner);
  if (P > 0) check(cudaMemsetAsync(owner, 0xff, sizeof(int32_t) * static_cast<size_t>(P), stream), op, "cudaMemsetAsync");
  claim_tokens<<<static_cast<int>(std::min<int64_t>(N, 4096)), 256, 0, stream>>>(owner, token_offset, token_count, N, P,
                                                                                status);
  check_launch(op, "claim_tokens");
  if (P > 0) {
    fill_tokens<<<grid_for(P, 256), 256, 0, stream>>>(token_value, node_value, owner, P, status);
    check_launch(op, "fill_tokens");
  }
  const Status st = read_status(status, stream, op);
  if (st.code == kTokenSpan)
    throw Error("tree_expand (cuda): node " + s(st.index) + " span [" + s(st.value) + ", " + s(st.value) + " + " +
                s(st.extra) + ") is outside [0, " + s(P) + ")");
  if (st.code != kOk) throw Error("tree_expand (cuda): device reported status " + s(st.code));
}

}  // namespace cuda
}  // namespace arpo
