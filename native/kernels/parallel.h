// Row-parallel loops for the CPU kernels: a fixed split of [0, n) into
// contiguous chunks (a deterministic split keeps every result independent of
// timing), run on a persistent pool of worker threads.
//
// Why a pool: the engine calls these kernels for every layer of every decode
// step, and starting a std::thread per chunk cost 26-38 microseconds each
// time (a demo-model step is 4 layers of ~0.2-2 ms). Workers wait for the
// next job spinning for a short while (kSpin, 50 us), then sleep; a caller
// that finds the pool busy (another thread's loop, or a loop nested in a
// chunk) starts its own threads as before, so loops never wait on each other.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace arpo {
namespace kernels {

// Number of worker threads for `work_items` items: `requested` (0 = hardware
// concurrency), never more than the items or than ceil(work / min_per_thread).
int32_t resolve_threads(int32_t requested, int64_t work_items, int64_t min_items_per_thread = 1);

namespace detail {
// A job of `parts` parts: run(ctx, i) for each i in [0, parts).
struct PoolJob {
  void (*run)(void* ctx, int32_t part) = nullptr;
  void* ctx = nullptr;
  int32_t parts = 0;
};
// Runs part 0 on the calling thread and parts 1.. on pool workers, returning
// when all are done; false (nothing run) when the pool is in use by another
// loop or this thread is one of its workers. run must not throw.
bool pool_run(const PoolJob& job);
}  // namespace detail

// Pool workers started so far (for tests).
int32_t pool_workers();

// Calls fn(begin, end) on disjoint chunks covering [0, n). Exceptions thrown
// by fn are rethrown on the caller's thread (the first chunk's wins).
template <typename Fn>
void parallel_for(int64_t n, int32_t threads, Fn&& fn) {
  if (n <= 0) return;
  const int32_t t = std::max<int32_t>(1, std::min<int64_t>(threads, n));
  if (t == 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunk = (n + t - 1) / t;
  struct Ctx {
    Fn* fn;
    int64_t n, chunk;
    std::vector<std::exception_ptr> errors;
  } ctx{&fn, n, chunk, std::vector<std::exception_ptr>(static_cast<size_t>(t))};
  auto part = [](void* p, int32_t i) {
    Ctx& c = *static_cast<Ctx*>(p);
    const int64_t b = i * c.chunk, e = std::min(c.n, b + c.chunk);
    if (b >= e) return;
    try {
      (*c.fn)(b, e);
    } catch (...) {
      c.errors[static_cast<size_t>(i)] = std::current_exception();
    }
  };
  if (!detail::pool_run(detail::PoolJob{part, &ctx, t})) {
    std::vector<std::thread> own;
    own.reserve(static_cast<size_t>(t - 1));
    for (int32_t i = 1; i < t; ++i) own.emplace_back(part, &ctx, i);
    part(&ctx, 0);
    for (auto& th : own) th.join();
  }
  for (auto& err : ctx.errors)
    if (err) std::rethrow_exception(err);
}

}  // namespace kernels
}  // namespace arpo
