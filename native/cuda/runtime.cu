// Host-side runtime of the arpo CUDA kernels: device queries, the cached
// per-thread workspace, status read-back, tuning overrides and the copy
// baseline used by the benchmark.
#include <mutex>
#include <string>

#include "cuda/common.cuh"
#include "kernels/rng.h"

namespace arpo {
namespace cuda {
namespace detail {

namespace {

struct CachedBuffer {
  char* ptr = nullptr;
  size_t size = 0;
  int device = -1;
  ~CachedBuffer() {
    // At process exit the runtime may already be gone; the error is ignored.
    if (ptr) {
      int current = -1;
      if (cudaGetDevice(&current) == cudaSuccess && current != device) cudaSetDevice(device);
      cudaFree(ptr);
    }
  }
};

Tuning g_tuning;

__global__ void normal_fill(void* dst, int bf16, int64_t n, float scale, uint64_t seed) {
  const uint64_t key = rng::mix64(seed);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // Box-Muller on two uniforms in (0, 1).
    const float u1 = static_cast<float>(rng::uniform(key, 2 * i)), u2 = static_cast<float>(rng::uniform(key, 2 * i + 1));
    const float z = scale * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    if (bf16) {
      const uint32_t u = __float_as_uint(z);
      static_cast<uint16_t*>(dst)[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    } else {
      static_cast<float*>(dst)[i] = z;
    }
  }
}

}  // namespace

char* workspace(size_t bytes, size_t zero_bytes, cudaStream_t stream, const char* op) {
  thread_local CachedBuffer buf;
  int device = 0;
  check(cudaGetDevice(&device), op, "cudaGetDevice");
  if (buf.ptr && (buf.device != device || buf.size < bytes)) {
    // The previous call synchronised its stream, so the old buffer is idle.
    int current = device;
    if (buf.device != device) check(cudaSetDevice(buf.device), op, "cudaSetDevice");
    cudaFree(buf.ptr);
    if (buf.device != device) check(cudaSetDevice(current), op, "cudaSetDevice");
    buf.ptr = nullptr;
    buf.size = 0;
  }
  if (!buf.ptr) {
    const size_t want = bytes < (size_t{1} << 20) ? (size_t{1} << 20) : bytes + bytes / 4;
    void* p = nullptr;
    check(cudaMalloc(&p, want), op, ("cudaMalloc of a " + std::to_string(want) + "-byte workspace").c_str());
    buf.ptr = static_cast<char*>(p);
    buf.size = want;
    buf.device = device;
  }
  if (zero_bytes > 0) check(cudaMemsetAsync(buf.ptr, 0, zero_bytes, stream), op, "cudaMemsetAsync");
  return buf.ptr;
}

Status read_status(const Status* dev, cudaStream_t stream, const char* op) {
  Status host{};
  check(cudaMemcpyAsync(&host, dev, sizeof host, cudaMemcpyDeviceToHost, stream), op, "cudaMemcpyAsync (status)");
  check(cudaStreamSynchronize(stream), op, "cudaStreamSynchronize");
  return host;
}

const DeviceInfo& device_info(const char* op) {
  static std::mutex mu;
  static DeviceInfo cache[64];
  static bool filled[64] = {};
  int device = 0;
  check(cudaGetDevice(&device), op, "cudaGetDevice");
  if (device < 0 || device >= 64) throw Error(std::string(op) + " (cuda): device index out of range: " + std::to_string(device));
  std::lock_guard<std::mutex> lock(mu);
  if (!filled[device]) {
    int v = 0;
    check(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device), op, "cudaDeviceGetAttribute");
    cache[device].sm_count = v > 0 ? v : 1;
    check(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, device), op, "cudaDeviceGetAttribute");
    cache[device].major = v;
    filled[device] = true;
  }
  return cache[device];
}

RowLaunch apply_tuning(RowLaunch g, int which) {
  const Tuning t = g_tuning;
  const int threads = which == 0 ? t.stats_threads : t.loss_threads;
  const int cluster = which == 0 ? t.stats_cluster : t.loss_cluster;
  if (threads > 0) g.threads = threads;
  if (cluster > 0) g.cluster = cluster;
  if (which == 1 && t.loss_blocks_per_sm > 0) {
    // 227 KB of shared memory per SM on sm_90 (1 KB of it reserved per block).
    const int per_block = 227 * 1024 / t.loss_blocks_per_sm - 1024 - 2048;
    g.pad_smem = per_block > 0 ? per_block : 0;
  }
  return g;
}

}  // namespace detail

bool available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

void copy_baseline(void* dst, const void* src, int64_t bytes, void* stream) {
  if (bytes < 0) throw kernels::Error("copy_baseline (cuda): bytes must be >= 0, got " + std::to_string(bytes));
  detail::check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, detail::as_stream(stream)),
                "copy_baseline", "cudaMemcpyAsync");
}

void fill_normal(void* dst, kernels::DType dtype, int64_t n, float scale, uint64_t seed, void* stream) {
  if (n < 0) throw kernels::Error("fill_normal (cuda): n must be >= 0, got " + std::to_string(n));
  if (n == 0) return;
  if (!dst) throw kernels::Error("fill_normal (cuda): dst is null");
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 65536));
  detail::normal_fill<<<blocks, 256, 0, detail::as_stream(stream)>>>(dst, dtype == kernels::DType::BF16 ? 1 : 0, n, scale, seed);
  detail::check_launch("fill_normal", "normal_fill");
}

void set_tuning(const Tuning& tuning) {
  auto bad = [](int v, int lo, int hi) { return v != 0 && (v < lo || v > hi); };
  if (bad(tuning.stats_threads, 32, 1024) || (tuning.stats_threads % 32) != 0)
    throw kernels::Error("set_tuning (cuda): stats_threads must be 0 or a multiple of 32 in [32, 1024], got " +
                         std::to_string(tuning.stats_threads));
  if (bad(tuning.loss_threads, 32, 1024) || (tuning.loss_threads % 32) != 0)
    throw kernels::Error("set_tuning (cuda): loss_threads must be 0 or a multiple of 32 in [32, 1024], got " +
                         std::to_string(tuning.loss_threads));
  if (bad(tuning.stats_cluster, 1, 8))
    throw kernels::Error("set_tuning (cuda): stats_cluster must be 0 or in [1, 8], got " + std::to_string(tuning.stats_cluster));
  if (bad(tuning.loss_cluster, 1, 8))
    throw kernels::Error("set_tuning (cuda): loss_cluster must be 0 or in [1, 8], got " + std::to_string(tuning.loss_cluster));
  if (bad(tuning.loss_blocks_per_sm, 1, 32))
    throw kernels::Error("set_tuning (cuda): loss_blocks_per_sm must be 0 or in [1, 32], got " +
                         std::to_string(tuning.loss_blocks_per_sm));
  detail::g_tuning = tuning;
}

Tuning get_tuning() { return detail::g_tuning; }

}  // namespace cuda
}  // namespace arpo
