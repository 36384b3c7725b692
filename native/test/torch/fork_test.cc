// Forking while BLAS runs on other threads must not hang (torch/fork_guard.h).
// Two worker threads run matrix products through libtorch (OpenBLAS underneath
// on Debian) under ComputeLock while the main thread forks and reaps
// children, as the Node main thread does for every python tool call during a
// rollout. Passes when all forks complete; a hang is caught by ctest's
// TIMEOUT. `fork_test --unguarded [forks] [workers]` runs the same loop
// without the guard: on Debian's pthread OpenBLAS 0.3.21 it deadlocks within
// a few hundred forks, even with one worker.
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "torch/fork_guard.h"

int main(int argc, char** argv) {
  const bool guarded = !(argc > 1 && std::strcmp(argv[1], "--unguarded") == 0);
  const int forks = argc > 2 ? std::atoi(argv[2]) : 400;
  if (guarded) arpo::model::install_fork_guard();
  std::atomic<bool> stop{false};
  std::atomic<long> products{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < (argc > 3 ? std::atoi(argv[3]) : 2); ++w) {
    workers.emplace_back([&] {
      at::Tensor a = at::randn({192, 192}), b = at::randn({192, 192});
      while (!stop.load()) {
        if (guarded) {
          arpo::model::ComputeLock lock;
          a = at::tanh(at::mm(a, b));
        } else {
          a = at::tanh(at::mm(a, b));
        }
        products.fetch_add(1);
      }
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  int failed = 0;
  if (forks == 0) std::this_thread::sleep_for(std::chrono::seconds(5));  // BLAS on the workers only
  for (int i = 0; i < forks; ++i) {
    const pid_t pid = fork();
    if (pid == 0) _exit(7);
    if (pid < 0) {
      std::perror("fork");
      ++failed;
      break;
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 7) ++failed;
  }
  stop = true;
  for (auto& t : workers) t.join();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%d forks with BLAS running on %zu worker threads (%ld products, %s): %.2f s, %d failed\n", forks, workers.size(), products.load(),
              guarded ? "guarded" : "unguarded", sec, failed);
  std::printf("%d passed, %d failed\n", failed == 0 && products.load() > 0 ? 1 : 0, failed == 0 && products.load() > 0 ? 0 : 1);
  return failed == 0 && products.load() > 0 ? 0 : 1;
}
