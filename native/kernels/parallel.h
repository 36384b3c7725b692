// Row-parallel loops for the CPU kernels: a fixed split of [0, n) into
// contiguous chunks, one std::thread each (no pool: kernel calls are coarse,
// and a deterministic split keeps every result independent of timing).
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

// Calls fn(begin, end) on disjoint chunks covering [0, n). Exceptions thrown
// by fn are rethrown on the caller's thread (the first one wins).
template <typename Fn>
void parallel_for(int64_t n, int32_t threads, Fn&& fn) {
  if (n <= 0) return;
  const int32_t t = std::max<int32_t>(1, std::min<int64_t>(threads, n));
  if (t == 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(t);
  pool.reserve(t - 1);
  const int64_t chunk = (n + t - 1) / t;
  for (int32_t i = 1; i < t; ++i) {
    const int64_t b = i * chunk, e = std::min(n, b + chunk);
    if (b >= e) break;
    pool.emplace_back([&, i, b, e] {
      try {
        fn(b, e);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  try {
    fn(int64_t{0}, std::min(n, chunk));
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& th : pool) th.join();
  for (auto& err : errors)
    if (err) std::rethrow_exception(err);
}

}  // namespace kernels
}  // namespace arpo
