#include "torch/fork_guard.h"

#include <pthread.h>

#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>

namespace arpo {
namespace model {

namespace {

// `busy` is the lock itself; the mutex only guards the fields for a moment,
// so it is never held across fork() (except by a thread that is between two
// statements here, which the child, about to exec, never notices).
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  bool busy = false;
  int forks_waiting = 0;
};
Gate& gate() {
  static Gate g;
  return g;
}

void acquire(bool for_fork) {
  Gate& g = gate();
  std::unique_lock<std::mutex> lk(g.m);
  if (for_fork) ++g.forks_waiting;
  g.cv.wait(lk, [&] { return !g.busy && (for_fork || g.forks_waiting == 0); });
  if (for_fork) --g.forks_waiting;
  g.busy = true;
}
void release() {
  Gate& g = gate();
  {
    std::lock_guard<std::mutex> lk(g.m);
    g.busy = false;
  }
  g.cv.notify_all();
}

void prepare() { acquire(true); }
void parent() { release(); }
// The child has one thread and execs (or exits) right away; it only clears the flag.
void child() { gate().busy = false; }

}  // namespace

void install_fork_guard() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int rc = pthread_atfork(prepare, parent, child);
    if (rc != 0) throw std::runtime_error("pthread_atfork failed with code " + std::to_string(rc));
  });
}

ComputeLock::ComputeLock() { acquire(false); }
ComputeLock::~ComputeLock() { release(); }

}  // namespace model
}  // namespace arpo
