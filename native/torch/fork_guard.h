// Fork safety for a process that runs BLAS on worker threads and spawns
// children (the python sandbox, MCP servers) from the Node main thread.
//
// OpenBLAS's pthread build registers a pthread_atfork prepare handler
// (blas_thread_shutdown_) that stops and joins its worker threads. When a
// GEMM is running on another thread at that moment (a model call on the
// libuv pool while the main thread forks for a tool call), a worker can miss
// the wake-up and the join waits forever: the whole process hangs with
// zombie children (seen in ARPO rollouts on Debian's OpenBLAS 0.3.21; the
// class of OpenBLAS issues #2270 / #5947).
//
// The guard: every model computation holds one process-wide lock
// (compute_lock()); install_fork_guard() registers a prepare handler that
// takes it too, so a fork waits for the running call to finish and no call
// starts until the fork is done. The lock is exclusive, not shared, because
// after a fork OpenBLAS restarts its threads on the next call, and two
// threads making that first call together deadlock as well (fork_test with
// two workers); serialising calls across models costs nothing here, where
// one model call already uses every core. A waiting fork goes first: no new
// call starts while one is pending (a plain mutex would let a busy caller
// re-take the lock before the forking thread ever got it). Handlers registered later run their prepare step earlier, so
// ours (registered at addon init, after OpenBLAS's load-time registration)
// runs before OpenBLAS's. Fork is at most one model call late; BLAS keeps
// its threads.
#pragma once


namespace arpo {
namespace model {

/** Registers the atfork handlers (idempotent, thread-safe). */
void install_fork_guard();

/** Held (RAII) for the duration of any computation that may call BLAS. */
class ComputeLock {
 public:
  ComputeLock();
  ~ComputeLock();
  ComputeLock(const ComputeLock&) = delete;
  ComputeLock& operator=(const ComputeLock&) = delete;
};

}  // namespace model
}  // namespace arpo
