// c10d process groups for data-parallel training; see dist.h.
#include "torch/dist.h"

#include <cstdlib>
#include <mutex>
#include <stdexcept>

#ifdef ARPO_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

namespace arpo {
namespace dist {

namespace {

std::runtime_error rank_error(int rank, const std::string& what) {
  return std::runtime_error("rank " + std::to_string(rank) + ": " + what);
}

// The message without libtorch's C++ backtrace.
std::string message(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

void check_tensors(int rank, const std::vector<torch::Tensor>& tensors, const char* op) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous())
      throw rank_error(rank, std::string(op) + ": tensor " + std::to_string(i) + " must be a defined, contiguous CPU tensor");
  }
}

// One process: every collective is the identity.
class LocalGroup : public Group {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  void allreduce_sum(std::vector<torch::Tensor>& tensors) override { check_tensors(0, tensors, "allreduce"); }
  void broadcast(std::vector<torch::Tensor>& tensors, int root) override {
    if (root != 0) throw rank_error(0, "broadcast: root " + std::to_string(root) + " is outside a world of 1");
    check_tensors(0, tensors, "broadcast");
  }
  void barrier() override {}
};

#ifdef ARPO_WITH_GLOO
class GlooGroup : public Group {
 public:
  explicit GlooGroup(const Config& c) : config_(c) {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(c.master_port);
    opts.isServer = c.rank == 0;
    opts.numWorkers = static_cast<size_t>(c.world);
    opts.waitWorkers = true;
    opts.timeout = c.timeout;
    const std::string where = c.master_addr + ":" + std::to_string(c.master_port);
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(c.master_addr, opts);
    } catch (const std::exception& e) {
      throw rank_error(c.rank, "rendezvous at " + where + " failed (every rank must join within " +
                                   std::to_string(c.timeout.count()) + " ms): " + message(e));
    }
    auto options = c10d::ProcessGroupGloo::Options::create(c.timeout);
    // Where this rank listens: GLOO_SOCKET_IFNAME's interface (as torch does), loopback for a
    // local run, else this host's resolved address (falling back to loopback).
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    const bool local = c.master_addr == "127.0.0.1" || c.master_addr == "localhost";
    options->devices.push_back(ifname && *ifname ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                               : local        ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                              : c10d::ProcessGroupGloo::createDefaultDevice());
    options->threads = 1;
    try {
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("arpo", store_), c.rank, c.world, options);
    } catch (const std::exception& e) {
      throw rank_error(c.rank, "the Gloo process group did not form at " + where + " within " + std::to_string(c.timeout.count()) +
                                   " ms (did every rank start, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE?): " + message(e));
    }
  }
  int rank() const override { return config_.rank; }
  int world() const override { return config_.world; }

  void allreduce_sum(std::vector<torch::Tensor>& tensors) override {
    check_tensors(config_.rank, tensors, "allreduce");
    for (auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      run("allreduce", [&] { return pg_->allreduce(one); });
    }
  }
  void broadcast(std::vector<torch::Tensor>& tensors, int root) override {
    if (root < 0 || root >= config_.world)
      throw rank_error(config_.rank, "broadcast: root " + std::to_string(root) + " is outside a world of " + std::to_string(config_.world));
    check_tensors(config_.rank, tensors, "broadcast");
    c10d::BroadcastOptions o;
    o.rootRank = root;
    for (auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      run("broadcast", [&] { return pg_->broadcast(one, o); });
    }
  }
  void barrier() override {
    run("barrier", [&] { return pg_->barrier(); });
  }

 private:
  // Every collective is numbered; before starting one a rank records its number
  // in the store (one round trip), so that when a collective fails the others
  // can name the rank that never reached it (dead or hung) instead of a socket.
  template <class F>
  void run(const char* op, F&& start) {
    std::lock_guard<std::mutex> lock(mu_);
    ++seq_;
    try {
      store_->set(seq_key(config_.rank), bytes_of(std::to_string(seq_)));
    } catch (const std::exception& e) {
      throw rank_error(config_.rank, std::string(op) + " #" + std::to_string(seq_) + ": the store at " + where() +
                                         " (hosted by rank 0) is unreachable; rank 0 died or the network failed: " + message(e));
    }
    try {
      auto work = start();
      work->wait(config_.timeout);
    } catch (const std::exception& e) {
      throw rank_error(config_.rank, std::string(op) + " #" + std::to_string(seq_) + " failed" + laggards() + " (timeout " +
                                         std::to_string(config_.timeout.count()) + " ms): " + message(e));
    }
  }
  static std::string seq_key(int rank) { return "arpo/seq/" + std::to_string(rank); }
  static std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
  std::string where() const { return config_.master_addr + ":" + std::to_string(config_.master_port); }
  // ": rank 1 never reached it (last at #7), ..." from the store, or a guess when the store is gone too.
  std::string laggards() {
    std::string out;
    try {
      for (int q = 0; q < config_.world; ++q) {
        if (q == config_.rank) continue;
        int64_t at = 0;
        if (store_->check({seq_key(q)})) {
          const auto v = store_->get(seq_key(q));
          at = std::stoll(std::string(v.begin(), v.end()));
        }
        if (at < seq_) out += (out.empty() ? "" : ", ") + std::string("rank ") + std::to_string(q) + " (last at #" + std::to_string(at) + ")";
      }
    } catch (const std::exception&) {
      return ": the store (hosted by rank 0) is gone too, so rank 0 died or the network failed";
    }
    if (out.empty()) {
      // Every rank got this far: one of the others died (or failed) inside it.
      std::string peers;
      for (int q = 0; q < config_.world; ++q)
        if (q != config_.rank) peers += (peers.empty() ? "" : ", ") + std::to_string(q);
      return config_.world == 2 ? ": rank " + peers + " reached it and then died or failed inside it"
                                : ": every rank reached it, so one of ranks " + peers + " died or failed inside it";
    }
    return ": " + out + (out.find(',') == std::string::npos ? " never reached it: that rank died or hangs" : " never reached it: those ranks died or hang");
  }
  std::mutex mu_;
  int64_t seq_ = 0;
  Config config_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};
#endif

}  // namespace

bool have_gloo() {
#ifdef ARPO_WITH_GLOO
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Group> Group::create(const Config& c) {
  if (c.world < 1) throw rank_error(c.rank, "world size " + std::to_string(c.world) + " must be >= 1");
  if (c.rank < 0 || c.rank >= c.world)
    throw rank_error(c.rank, "rank " + std::to_string(c.rank) + " is outside [0, " + std::to_string(c.world) + ")");
  if (c.master_port < 1 || c.master_port > 65535) throw rank_error(c.rank, "MASTER_PORT " + std::to_string(c.master_port) + " is not a TCP port");
  if (c.world == 1) return std::make_unique<LocalGroup>();
#ifdef ARPO_WITH_GLOO
  return std::make_unique<GlooGroup>(c);
#else
  throw rank_error(c.rank, "a world of " + std::to_string(c.world) +
                               " ranks needs c10d's Gloo backend, which this build lacks: install the Gloo headers "
                               "(apt-get install libgloo-dev; scripts/install-deps.sh does) and rebuild (npm run build:native)");
#endif
}

}  // namespace dist
}  // namespace arpo
