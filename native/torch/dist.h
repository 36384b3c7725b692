// Data-parallel communication over PyTorch's c10d (issue 16): a TCPStore
// rendezvous at MASTER_ADDR:MASTER_PORT and a Gloo process group (CPU); the
// only file that calls c10d, so the libtorch 1.13 / 2.x differences stay here.
// Every error is a std::runtime_error that starts with "rank <r>: ".
// Built without Gloo headers (libgloo-dev), a world of 1 still works and a
// larger one fails with the fix in its message.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace arpo {
namespace dist {

struct Config {
  int rank = 0;
  int world = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Rendezvous and every collective: a rank that died or hangs makes the others fail after this long.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// True when this build has c10d's Gloo backend.
bool have_gloo();

class Group {
 public:
  // Joins the group (blocks until every rank has joined, or throws after the timeout).
  static std::unique_ptr<Group> create(const Config& config);
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // In place: every rank ends with the elementwise sum over ranks (CPU, contiguous, same shapes and dtypes on every rank).
  virtual void allreduce_sum(std::vector<torch::Tensor>& tensors) = 0;
  // In place: every rank ends with rank `root`'s values.
  virtual void broadcast(std::vector<torch::Tensor>& tensors, int root) = 0;
  virtual void barrier() = 0;
};

}  // namespace dist
}  // namespace arpo
