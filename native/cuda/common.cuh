// Device building blocks shared by the arpo CUDA kernels: error checks, the
// device-side status word (validation errors thrown on the host), a cached
// workspace, 16-byte row traversal, and the online softmax statistics with
// their warp / block / cluster reductions.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "cuda/kernels_cuda.h"
#include "kernels/kernels.h"

namespace arpo {
namespace cuda {
namespace detail {

using kernels::Error;

// ---------------------------------------------------------------- host side
inline void check(cudaError_t err, const char* op, const char* what) {
  if (err != cudaSuccess)
    throw Error(std::string(op) + " (cuda): " + what + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}
// After every launch: launch-configuration errors show up here.
inline void check_launch(const char* op, const char* kernel) { check(cudaGetLastError(), op, kernel); }

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Validation errors found on the device: the first failing thread claims
// `code` (atomicCAS from 0) and records what failed; the host reads it back
// after the stream synchronises and throws with the same wording as the CPU
// kernels. Kernels that write outputs check `code` first, so a rejected call
// leaves its outputs untouched (as on the CPU).
struct Status {
  int32_t code;
  int32_t pad;
  long long index;  // which element (t, segment, node, leaf)
  long long value;  // the offending value
  long long extra;  // a second value (span end, ...)
};

// Status codes (the host turns each into the CPU kernel's message).
enum StatusCode : int32_t {
  kOk = 0,
  kTargetOutsideVocab = 1,  // index t, value target, extra V
  kRowNotFinite = 2,        // index t (NaN or +inf logits in sample_tokens)
  kMaskNotFinite = 3,       // index t, value float bits of mask[t]
  kLossTarget = 4,          // index t, value target, extra V
  kSeqId = 5,               // index t, value seq id, extra num_seqs
  kSegmentSpan = 6,         // index s, value start, extra end
  kBaseline = 7,            // index s, value baseline
  kParent = 8,              // index n, value parent[n]
  kLeafNode = 9,            // index l, value leaf_node[l]
  kTokenSpan = 10,          // index n, value offset, extra count
  kCopySum = 11,            // index t, value which copy-sum array (0..5), extra double bits of the value
};

__device__ inline void fail(Status* st, int32_t code, long long index, long long value, long long extra = 0) {
  if (atomicCAS(&st->code, 0, code) == 0) {
    st->index = index;
    st->value = value;
    st->extra = extra;
  }
}

// Grow-only device buffer, one per host thread and device: every public
// function synchronises its stream before returning, so the next call on the
// same thread may reuse it. Returns at least `bytes`, the first `zero_bytes`
// zero-filled on `stream`. Layout: [Status | 256-byte aligned slices...].
char* workspace(size_t bytes, size_t zero_bytes, cudaStream_t stream, const char* op);

// Bytes of a slice rounded up so the next one stays 256-byte aligned.
constexpr size_t aligned(size_t bytes) { return (bytes + 255) & ~size_t{255}; }
constexpr size_t kStatusBytes = aligned(sizeof(Status));

// Copies the status back (synchronising `stream`) and returns it.
Status read_status(const Status* dev, cudaStream_t stream, const char* op);

// Device properties read once per device (multiprocessors, cluster support).
struct DeviceInfo {
  int sm_count = 1;
  int major = 0;
};
const DeviceInfo& device_info(const char* op);

// Row-kernel launch geometry: `threads` per block, `cluster` blocks per row
// (a thread-block cluster on sm_90; 1 = plain launch), optional unused
// dynamic shared memory `pad_smem` that caps blocks per multiprocessor.
struct RowLaunch {
  int threads = 512;
  int cluster = 1;
  int pad_smem = 0;
};

// Launches kernel<<<rows * cluster, threads>>> as clusters of `cluster` blocks.
template <typename... KArgs, typename... Args>
void launch_rows(void (*kernel)(KArgs...), int64_t rows, const RowLaunch& g, cudaStream_t stream, const char* op,
                 const char* name, Args&&... args) {
  if (rows <= 0) return;
  if (rows * g.cluster > 0x7fffffffLL) throw Error(std::string(op) + " (cuda): too many rows: " + std::to_string(rows));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(rows * g.cluster), 1, 1);
  cfg.blockDim = dim3(static_cast<unsigned>(g.threads), 1, 1);
  cfg.dynamicSmemBytes = static_cast<size_t>(g.pad_smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  cfg.attrs = attr;
  cfg.numAttrs = 0;
  if (g.cluster > 1) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(g.cluster);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.numAttrs = 1;
  }
  if (g.pad_smem > 48 * 1024)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, g.pad_smem), op, name);
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), op, name);
  check_launch(op, name);
}

// Tuning overrides (see kernels_cuda.h) applied to a default geometry.
RowLaunch apply_tuning(RowLaunch g, int which);

// ---------------------------------------------------------------- device side
constexpr float kNegInf = -INFINITY;
// As the CPU kernels: z - max is clamped to >= -100 before exp so that
// e * (z - max) stays 0 (not 0 * inf = NaN) for -inf logits.
constexpr float kExpFloor = -100.0f;

__device__ __forceinline__ float bf16_to_float(uint16_t bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 16); }

// Element type of a logits row: float32 or bfloat16 bits. A 16-byte vector
// holds kPerVec of them.
template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static constexpr int kPerVec = 4;
  __device__ __forceinline__ static float to_float(float x) { return x; }
  __device__ __forceinline__ static void unpack(const uint4& v, float* out) {
    out[0] = __uint_as_float(v.x);
    out[1] = __uint_as_float(v.y);
    out[2] = __uint_as_float(v.z);
    out[3] = __uint_as_float(v.w);
  }
};
template <>
struct Elem<uint16_t> {
  static constexpr int kPerVec = 8;
  __device__ __forceinline__ static float to_float(uint16_t x) { return bf16_to_float(x); }
  __device__ __forceinline__ static void unpack(const uint4& v, float* out) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);             // low half = element 2i (little endian)
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);  // high half = element 2i + 1
    }
  }
};

// Plain 16-byte load (may alias a buffer this kernel writes: no .nc path).
__device__ __forceinline__ uint4 load16(const void* p) { return *static_cast<const uint4*>(p); }
// Last read of data: evict-first, so the (T, V) stream does not push out
// what other blocks are about to re-read.
__device__ __forceinline__ uint4 load16_last(const void* p) { return __ldcs(static_cast<const uint4*>(p)); }

// Visits elements [begin, end) of `row` owned by this block's threads, with
// coalesced 16-byte loads: a head of < kPerVec elements up to the first
// 16-byte boundary, then aligned vectors (U of them loaded before any is
// used, so U * 16 bytes per thread are in flight), then a tail. Calls
// vec(values, j0) for an aligned vector of kPerVec values starting at index
// j0 and one(value, j) for single head/tail elements. `Last` selects the
// evict-first load for a final read. Each element is visited by the same
// thread for the same (begin, end, blockDim) so a second traversal may
// overwrite what the first one read.
template <typename T, int U, bool Last, typename VecFn, typename OneFn>
__device__ __forceinline__ void for_slice(const T* row, int64_t begin, int64_t end, VecFn&& vec, OneFn&& one) {
  constexpr int N = Elem<T>::kPerVec;
  const int tid = threadIdx.x, nt = blockDim.x;
  if (end <= begin) return;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(row + begin);
  int64_t head = static_cast<int64_t>(((16 - (addr & 15)) & 15) / sizeof(T));
  if ((addr % sizeof(T)) != 0) head = end - begin;  // not element-aligned: scalar path only
  if (head > end - begin) head = end - begin;
  if (tid < head) one(Elem<T>::to_float(row[begin + tid]), begin + tid);
  const int64_t vbeg = begin + head;
  const int64_t nvec = (end - vbeg) / N;
  const T* vrow = row + vbeg;
  int64_t v = tid;
  for (; v + static_cast<int64_t>(U - 1) * nt < nvec; v += static_cast<int64_t>(U) * nt) {
    uint4 raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) raw[u] = Last ? load16_last(vrow + (v + u * nt) * N) : load16(vrow + (v + u * nt) * N);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float x[N];
      Elem<T>::unpack(raw[u], x);
      vec(x, vbeg + (v + u * nt) * N);
    }
  }
  for (; v < nvec; v += nt) {
    float x[N];
    Elem<T>::unpack(Last ? load16_last(vrow + v * N) : load16(vrow + v * N), x);
    vec(x, vbeg + v * N);
  }
  const int64_t tail = vbeg + nvec * N;
  if (tail + tid < end) one(Elem<T>::to_float(row[tail + tid]), tail + tid);
}

// Online softmax statistics of a set of z values (Milakov & Gimelshein 2018,
// extended with the exp-weighted sum for the entropy), with y = (z - m) log2 e
// so each element costs one ex2 (exp2f) and no extra scaling:
//   m = max z,  s = sum 2^y = sum exp(z - m),  w = sum 2^y y  (w <= 0)
// so logsumexp = m + ln s and entropy = ln s - ln2 * w / s. Centring on m
// keeps the entropy free of cancellation for large |z| (z - m is exact for
// nearby values). m = -inf means "empty". NaN or +inf logits make s NaN, so
// the row's statistics are NaN (as on the CPU).
struct Online {
  float m;
  float s;
  float w;
};
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;
// y is clamped to >= kExpFloor * log2 e before multiplying by e = 2^y, so a
// -inf logit adds 0 * (-144.3) = 0 to w instead of 0 * inf = NaN.
constexpr float kExp2Floor = kExpFloor * kLog2e;
__device__ __forceinline__ Online online_empty() { return Online{kNegInf, 0.0f, 0.0f}; }

// Absorbs N values: one rescale per batch (not per element).
template <int N>
__device__ __forceinline__ void online_add(Online& a, const float* z) {
  float bm = z[0];
#pragma unroll
  for (int i = 1; i < N; ++i) bm = fmaxf(bm, z[i]);
  if (bm != bm) a.s = NAN;  // fmaxf skips NaN, so only an all-NaN batch lands here
  if (bm > a.m) {
    if (a.m != kNegInf) {
      // sum 2^y' y' with y' = y + d: c (w + d s), c = 2^d, d = (m_old - m_new) log2 e
      const float d = (a.m - bm) * kLog2e, c = exp2f(d);
      a.w = c * fmaf(d, a.s, a.w);
      a.s *= c;
    }
    a.m = bm;
  }
  if (a.m == kNegInf) return;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float y = (z[i] - a.m) * kLog2e;  // NaN for NaN z or when m = +inf
    const float e = exp2f(y);
    a.s += e;
    a.w = fmaf(e, fmaxf(y, kExp2Floor), a.w);
  }
}

__device__ __forceinline__ void online_absorb(Online& r, const Online& x) {
  if (x.m == kNegInf) {
    r.s += x.s;  // 0, or NaN from an all-NaN part
    return;
  }
  const float d = (x.m - r.m) * kLog2e, c = exp2f(d);
  r.s += c * x.s;
  r.w += c * fmaf(d, x.s, x.w);
}

__device__ __forceinline__ Online online_merge(const Online& a, const Online& b) {
  const float m = fmaxf(a.m, b.m);
  if (m == kNegInf) return Online{kNegInf, a.s + b.s, 0.0f};
  Online r{m, 0.0f, 0.0f};
  online_absorb(r, a);
  online_absorb(r, b);
  return r;
}

__device__ __forceinline__ Online warp_merge(Online a) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    Online b;
    b.m = __shfl_xor_sync(0xffffffffu, a.m, off);
    b.s = __shfl_xor_sync(0xffffffffu, a.s, off);
    b.w = __shfl_xor_sync(0xffffffffu, a.w, off);
    a = online_merge(a, b);
  }
  return a;
}

// Block-wide merge; every thread gets the result. `scratch` holds >= 33 entries.
__device__ __forceinline__ Online block_merge(Online a, Online* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  a = warp_merge(a);
  if (lane == 0) scratch[warp] = a;
  __syncthreads();
  if (warp == 0) {
    Online b = lane < nwarps ? scratch[lane] : online_empty();
    b = warp_merge(b);
    if (lane == 0) scratch[32] = b;
  }
  __syncthreads();
  const Online r = scratch[32];
  __syncthreads();  // scratch may be reused right after
  return r;
}

// Cluster-wide merge of the per-block results (distributed shared memory):
// each block publishes its merge in `slot`, the cluster synchronises, warp 0
// of every block reads all slots and merges them in rank order (so every
// block gets bit-identical statistics), and a second cluster barrier keeps
// the slots alive until every block has read them.
__device__ __forceinline__ Online cluster_merge(Online block_result, Online* slot, Online* scratch, int cluster) {
  if (cluster <= 1) return block_result;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters need sm_90; the host launches cluster > 1 only there
  return block_result;
#else
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  if (threadIdx.x == 0) *slot = block_result;
  cl.sync();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    Online b = online_empty();
    if (lane < cluster) b = *cl.map_shared_rank(slot, lane);
    // Fixed merge order: lane 0..cluster-1 as a tree (identical in every block).
    b = warp_merge(b);
    if (lane == 0) scratch[32] = b;
  }
  cl.sync();
  const Online r = scratch[32];
  __syncthreads();
  return r;
#endif
}

// Block-wide sum of a double (every thread gets the result; fixed order).
__device__ __forceinline__ double block_sum(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double b = lane < nwarps ? scratch[lane] : 0.0;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) b += __shfl_xor_sync(0xffffffffu, b, off);
    if (lane == 0) scratch[32] = b;
  }
  __syncthreads();
  const double r = scratch[32];
  __syncthreads();
  return r;
}

// Slice of a row handled by cluster rank `rank` of `cluster`: boundaries on
// multiples of 8 elements so each slice keeps whole 16-byte vectors when the
// row is aligned.
__device__ __forceinline__ void row_slice(int64_t V, int rank, int cluster, int64_t* begin, int64_t* end) {
  const int64_t per = ((V + cluster - 1) / cluster + 7) & ~int64_t{7};
  *begin = min(V, per * rank);
  *end = min(V, per * (rank + 1));
}

// Final per-row values from merged statistics (double, as the CPU).
__device__ __forceinline__ double online_lse(const Online& a) {
  return a.m == kNegInf ? static_cast<double>(a.s != a.s ? NAN : -INFINITY)
                        : static_cast<double>(a.m) + log(static_cast<double>(a.s));
}
__device__ __forceinline__ double online_entropy(const Online& a) {
  if (a.s != a.s) return NAN;
  if (a.m == kNegInf) return 0.0;
  const double s = a.s, h = log(s) - 0.693147180559945309 * static_cast<double>(a.w) / s;
  return h < 0 ? 0.0 : h;  // rounding below the true minimum 0
}

}  // namespace detail
}  // namespace cuda
}  // namespace arpo
