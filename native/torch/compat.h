// The one place where libtorch versions and builds differ for arpo's torch
// layer: Debian's libtorch 1.13 (CPU) and a pip-installed PyTorch 2.x
// (CPU or CUDA) both build the same sources. Everything that depends on the
// version, or on libtorch's CUDA headers, is spelled here; the rest of
// native/torch uses only ATen / autograd / c10d API common to both.
//
// What differs, and how each is handled:
// - c10::optional is its own class in 1.13 and an alias of std::optional in
//   2.x: arpo's own interfaces use std::optional, never c10's.
// - Pip wheels choose _GLIBCXX_USE_CXX11_ABI (0 before 2.7, 1 since): CMake
//   applies TORCH_CXX_FLAGS to every arpo target, not only to the torch layer,
//   so std::string crosses between them with one ABI.
// - The BLAS behind libtorch: pip wheels use MKL, whose threads
//   at::set_num_threads sets; Debian's libtorch uses OpenBLAS, whose own
//   thread pool it does not. set_compute_threads sets both.
// - libtorch with CUDA: ARPO_WITH_CUDA is defined (CMake) only when libtorch
//   has CUDA and the arpo CUDA kernels were built; then and only then the
//   CUDA stream and device-guard headers are included, here.
#pragma once

#include <torch/version.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <dlfcn.h>

#include <algorithm>
#include <mutex>
#include <thread>

#define ARPO_TORCH_VERSION (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR)
static_assert(ARPO_TORCH_VERSION >= 113, "arpo needs libtorch 1.13 or newer");

#ifdef ARPO_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace arpo {
namespace compat {

// "1.13" / "2.11": the libtorch this build compiled against.
inline const char* torch_version() { return TORCH_VERSION; }

// Whether this build runs models on CUDA devices (see ARPO_WITH_CUDA above).
constexpr bool kCudaBuild =
#ifdef ARPO_WITH_CUDA
    true;
#else
    false;
#endif

// The intra-op threads of this process: at::set_num_threads and, where
// libtorch's BLAS is OpenBLAS, openblas_set_num_threads (found at run time;
// absent under MKL). Without the second, a model set to 1 thread still runs
// every matmul on OpenBLAS's own pool of one thread per core: two data-parallel
// ranks on 2 cores then keep 4 BLAS threads busy-waiting on each other.
// n <= 0 means every core: libtorch's own default is its count of physical
// cores as cpuinfo sees them, which on a 2-vCPU VM was 1 (so model.threads 0
// ran libtorch's ops and the addon's kernels on one thread).
// OpenBLAS's thread-count calls, found at run time (null where libtorch's
// BLAS is another, e.g. MKL).
struct OpenBlasThreads {
  void (*set)(int) = nullptr;
  int (*get)() = nullptr;
};
inline const OpenBlasThreads& openblas_threads() {
  static const OpenBlasThreads a = [] {
    OpenBlasThreads x;
    x.set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    x.get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    return x;
  }();
  return a;
}

inline void set_compute_threads(int n) {
  if (n <= 0) n = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  at::set_num_threads(n);
  if (openblas_threads().set != nullptr) openblas_threads().set(n);
}

// For its scope, OpenBLAS runs matmuls on the calling thread alone (a no-op
// where libtorch's BLAS is not OpenBLAS, e.g. MKL, which sizes its own
// threads). OpenBLAS splits even a one-row matmul over its whole pool, and
// with the loader's OPENBLAS_THREAD_TIMEOUT=4 its idle workers sleep, so
// waking them cost a one-token decode call of the demo model 0.3 of its
// 0.8 ms. Overlapping scopes on several threads share one count: the first
// in sets 1, the last out restores what was set before.
class SingleThreadBlas {
 public:
  SingleThreadBlas() {
    const OpenBlasThreads& a = openblas_threads();
    if (a.set == nullptr || a.get == nullptr) return;
    std::lock_guard<std::mutex> lock(state().m);
    if (state().depth++ == 0) {
      state().saved = a.get();
      if (state().saved > 1) a.set(1);
    }
    active_ = true;
  }
  ~SingleThreadBlas() {
    if (!active_) return;
    std::lock_guard<std::mutex> lock(state().m);
    if (--state().depth == 0 && state().saved > 1) openblas_threads().set(state().saved);
  }
  SingleThreadBlas(const SingleThreadBlas&) = delete;
  SingleThreadBlas& operator=(const SingleThreadBlas&) = delete;

 private:
  struct State {
    std::mutex m;
    int depth = 0;
    int saved = 0;
  };
  static State& state() {
    static State s;
    return s;
  }
  bool active_ = false;
};

#ifdef ARPO_WITH_CUDA
// Makes `device` current for the scope (a no-op guard for CPU tensors).
using DeviceGuard = c10::cuda::OptionalCUDAGuard;
// The current CUDA stream of `device` as the void* the arpo::cuda kernels take.
inline void* current_stream(const at::Device& device) {
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
}
#endif

}  // namespace compat
}  // namespace arpo
