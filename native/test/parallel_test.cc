// kernels::parallel_for on the worker pool against a serial reference: every
// index once, the documented chunk split, results equal to a serial loop;
// workers reused (not one thread per call), woken after sleeping, shared by
// concurrent callers and nested loops without deadlock, exceptions passed on,
// and a forked child getting a pool of its own.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "kernels/parallel.h"

using namespace arpo::kernels;

namespace {

// Runs parallel_for(n, t) and checks each index is visited once, by the
// chunk (b, e) the split formula gives: chunk = ceil(n / t), part i covers
// [i * chunk, min(n, (i + 1) * chunk)).
bool split_ok(int64_t n, int32_t t) {
  std::vector<std::atomic<int32_t>> seen(static_cast<size_t>(n));
  std::vector<int64_t> begin_of(static_cast<size_t>(n), -1), end_of(static_cast<size_t>(n), -1);
  parallel_for(n, t, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      seen[static_cast<size_t>(i)].fetch_add(1);
      begin_of[static_cast<size_t>(i)] = b;
      end_of[static_cast<size_t>(i)] = e;
    }
  });
  const int64_t tt = std::max<int64_t>(1, std::min<int64_t>(t, n));
  const int64_t chunk = (n + tt - 1) / tt;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i / chunk * chunk, e = std::min(n, b + chunk);
    if (seen[static_cast<size_t>(i)].load() != 1 || begin_of[static_cast<size_t>(i)] != b || end_of[static_cast<size_t>(i)] != e) return false;
  }
  return true;
}

// Sum of f(i) over [0, n) through parallel_for with per-chunk partials.
int64_t parallel_sum(int64_t n, int32_t t) {
  std::vector<int64_t> part(static_cast<size_t>(std::max<int32_t>(t, 1)), 0);
  const int64_t tt = std::max<int64_t>(1, std::min<int64_t>(t, n)), chunk = n > 0 ? (n + tt - 1) / tt : 1;
  parallel_for(n, t, [&](int64_t b, int64_t e) {
    int64_t s = 0;
    for (int64_t i = b; i < e; ++i) s += i * i % 1009;
    part[static_cast<size_t>(b / chunk)] += s;
  });
  int64_t s = 0;
  for (int64_t v : part) s += v;
  return s;
}

int64_t serial_sum(int64_t n) {
  int64_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += i * i % 1009;
  return s;
}

void test_split_and_results() {
  for (int32_t t = 1; t <= 9; ++t)
    for (int64_t n : {0, 1, 2, 3, 7, 8, 9, 64, 100, 1001}) CHECK(split_ok(n, t));
  // Many back-to-back jobs (workers mostly spinning) and a few after a pause
  // (workers asleep on the condition variable): every sum right.
  int bad = 0;
  for (int rep = 0; rep < 20000; ++rep) {
    const int64_t n = 1 + rep % 97;
    const int32_t t = 2 + rep % 3;
    if (parallel_sum(n, t) != serial_sum(n)) ++bad;
  }
  CHECK(bad == 0);
  for (int rep = 0; rep < 5; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(parallel_sum(5000, 4) == serial_sum(5000));
  }
  // The pool kept its workers: at most the largest job's parts - 1 (8 for t = 9).
  CHECK(pool_workers() >= 1);
  CHECK(pool_workers() <= 8);
}

void test_concurrent_and_nested() {
  // Four threads running loops at once: one gets the pool, the others start
  // their own threads; nobody waits for anybody, every sum right.
  std::atomic<int> bad{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 500; ++rep) {
        const int64_t n = 50 + (rep * 7 + c) % 200;
        if (parallel_sum(n, 2 + (rep + c) % 3) != serial_sum(n)) bad.fetch_add(1);
      }
    });
  for (auto& th : callers) th.join();
  CHECK(bad.load() == 0);
  // A loop inside a chunk (on a pool worker and on the caller).
  std::vector<int64_t> inner(4, 0);
  parallel_for(4, 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) inner[static_cast<size_t>(i)] = parallel_sum(300 + i, 3);
  });
  for (int64_t i = 0; i < 4; ++i) CHECK(inner[static_cast<size_t>(i)] == serial_sum(300 + i));
}

void test_exceptions() {
  bool caught = false;
  try {
    parallel_for(10, 3, [](int64_t b, int64_t) {
      if (b >= 4) throw std::runtime_error("chunk at " + std::to_string(b));
    });
  } catch (const std::runtime_error& e) {
    caught = std::string(e.what()) == "chunk at 4";  // the first failing chunk's, whatever finished first
  }
  CHECK(caught);
  CHECK(parallel_sum(1000, 3) == serial_sum(1000));  // the pool still works
}

void test_fork() {
  CHECK(parallel_sum(2000, 3) == serial_sum(2000));  // the parent's pool has workers
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);  // a deadlock in the child fails the test instead of hanging it
    const bool ok = parallel_sum(2000, 3) == serial_sum(2000) && split_ok(77, 4);
    _exit(ok ? 0 : 1);
  }
  CHECK(pid > 0);
  int status = -1;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(parallel_sum(2000, 3) == serial_sum(2000));
}

}  // namespace

int main() {
  test_split_and_results();
  test_concurrent_and_nested();
  test_exceptions();
  test_fork();
  return arpo_test::summary();
}
