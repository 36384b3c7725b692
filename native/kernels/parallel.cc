// Thread-count policy and the worker pool of the row-parallel CPU kernels.
#include "kernels/parallel.h"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace arpo {
namespace kernels {

int32_t resolve_threads(int32_t requested, int64_t work_items, int64_t min_items_per_thread) {
  int64_t t = requested > 0 ? requested : static_cast<int64_t>(std::thread::hardware_concurrency());
  if (t < 1) t = 1;
  if (min_items_per_thread < 1) min_items_per_thread = 1;
  const int64_t by_work = (work_items + min_items_per_thread - 1) / min_items_per_thread;
  t = std::min(t, std::max<int64_t>(1, by_work));
  return static_cast<int32_t>(std::min<int64_t>(t, 256));
}

namespace {

// How long an idle worker (and a caller waiting for its parts) spins before
// sleeping (yielding): long enough to bridge the gaps between one layer's
// kernels, short enough that an idle engine gives its cores back at once.
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr int32_t kMaxParts = 256;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Spins on ready() for up to kSpin, checking the clock every 32 pauses.
template <class Ready>
bool spin_until(Ready&& ready) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

thread_local bool tls_pool_worker = false;

// One job at a time (busy_). A job is published as one atomic word,
// generation << 16 | parts, after the job itself: a worker that sees a new
// generation with its index below parts runs its part and counts it off;
// the caller returns (and may publish the next job) only when every part is
// counted off, so a part's job is never overwritten under it.
class Pool {
 public:
  bool run(const detail::PoolJob& job) {
    if (tls_pool_worker || job.parts < 2 || job.parts > kMaxParts) return false;
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    const uint64_t generation = state_.load(std::memory_order_relaxed) >> 16;
    while (workers_.load(std::memory_order_relaxed) < job.parts - 1) {
      const int32_t index = workers_.load(std::memory_order_relaxed) + 1;
      // Started knowing the generation before this job, so it cannot miss it.
      std::thread(&Pool::work, this, index, generation).detach();
      workers_.store(index, std::memory_order_relaxed);
    }
    job_ = job;
    remaining_.store(job.parts - 1, std::memory_order_relaxed);
    state_.store((generation + 1) << 16 | static_cast<uint64_t>(job.parts), std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lk(m_);
      cv_.notify_all();
    }
    job.run(job.ctx, 0);
    auto done = [&] { return remaining_.load(std::memory_order_acquire) == 0; };
    if (!spin_until(done))
      while (!done()) std::this_thread::yield();
    return true;
  }

  int32_t workers() const { return workers_.load(std::memory_order_relaxed); }

 private:
  void work(int32_t index, uint64_t seen) {
    tls_pool_worker = true;
    for (;;) {
      uint64_t word = 0;
      auto changed = [&] {
        word = state_.load(std::memory_order_acquire);
        return (word >> 16) != seen;
      };
      if (!spin_until(changed)) {
        std::unique_lock<std::mutex> lk(m_);
        sleeping_.fetch_add(1, std::memory_order_seq_cst);
        while ((state_.load(std::memory_order_seq_cst) >> 16) == seen) cv_.wait(lk);
        sleeping_.fetch_sub(1, std::memory_order_relaxed);
        word = state_.load(std::memory_order_acquire);
      }
      seen = word >> 16;
      if (index < static_cast<int32_t>(word & 0xffff)) {
        job_.run(job_.ctx, index);
        remaining_.fetch_sub(1, std::memory_order_release);
      }
    }
  }

  std::mutex busy_;
  detail::PoolJob job_;
  std::atomic<uint64_t> state_{0};
  std::atomic<int32_t> remaining_{0};
  std::atomic<int32_t> workers_{0};
  std::atomic<int32_t> sleeping_{0};
  std::mutex m_;
  std::condition_variable cv_;
};

// Never destroyed (detached workers may outlive static destruction). A
// forked child has none of the parent's workers and maybe a copy of a held
// lock: it starts a fresh pool on first use (the old one leaks, once per fork).
std::atomic<Pool*> g_pool{nullptr};

Pool& pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p != nullptr) return *p;
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, [] { g_pool.store(nullptr, std::memory_order_relaxed); }); });
  Pool* fresh = new Pool;
  Pool* expected = nullptr;
  if (g_pool.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;
  return *expected;
}

}  // namespace

namespace detail {
bool pool_run(const PoolJob& job) { return pool().run(job); }
}  // namespace detail

int32_t pool_workers() { return pool().workers(); }

}  // namespace kernels
}  // namespace arpo
