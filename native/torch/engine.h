// The generation engine: a paged KV cache whose paths fork by sharing blocks
// (copy-on-write of a shared partial block only), batched extend-and-sample
// over many paths at once, and cache-free scoring of whole sequences.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kernels/kernels.h"
#include "torch/model.h"

namespace arpo {
namespace model {

// Block pools per layer, K and V each (num_blocks, block_size, kv_heads,
// head_dim); a path is a block table plus a length. Slot s of a pool is row
// s of its flat view (num_blocks * block_size, kv_heads, head_dim): position
// p of a path lives in slot blocks[p / block_size] * block_size + p % block_size.
class KVCache {
 public:
  struct Options {
    int64_t block_size = 16;
    int64_t initial_blocks = 64;
    int64_t max_blocks = 0;  // 0: grow without limit
  };
  struct Stats {
    int64_t block_size = 0;
    int64_t blocks_total = 0;     // allocated in the pools
    int64_t blocks_used = 0;      // refcount > 0
    int64_t bytes_per_block = 0;  // K + V over all layers
    int64_t bytes_used = 0;       // blocks_used * bytes_per_block
    int64_t bytes_unshared = 0;   // what the live paths would use with private copies
    int64_t paths = 0;            // live paths
    int64_t tokens = 0;           // sum of live path lengths
  };

  // The pools live on `device` (the model's).
  KVCache(int64_t layers, int64_t kv_heads, int64_t head_dim, at::ScalarType dtype, Options options,
          at::Device device = at::Device(at::kCPU));

  int32_t new_path(uint64_t stream);
  // A path sharing `parent`'s first `prefix` positions: refcounts only; the
  // shared partial block (if any) is copied later by whichever writes first.
  int32_t fork(int32_t parent, int64_t prefix, uint64_t stream);
  void free_path(int32_t path);
  int64_t length(int32_t path) const { return get(path).length; }
  uint64_t stream(int32_t path) const { return get(path).stream; }
  bool has_path(int32_t path) const { return paths_.count(path) != 0; }

  // Makes positions [length, length + n) of `path` writable: allocates
  // blocks (growing the pools, or throwing at max_blocks) and privatises a
  // shared block that those positions fall into (copy-on-write).
  void reserve(int32_t path, int64_t n);
  // Slots of positions [begin, end) of `path` (reserved ones included).
  void slots(int32_t path, int64_t begin, int64_t end, int64_t* out) const;
  void advance(int32_t path, int64_t n) { paths_.at(path).length += n; }

  // Flat pool views (num_blocks * block_size, kv_heads, head_dim) of a layer.
  at::Tensor keys(int64_t layer) const;
  at::Tensor values(int64_t layer) const;
  Stats stats() const;
  int64_t block_size() const { return options_.block_size; }
  // Refcount of the block holding position `pos` of `path` (tests).
  int32_t block_refcount(int32_t path, int64_t pos) const;

 private:
  struct Path {
    std::vector<int32_t> blocks;
    int64_t length = 0;
    uint64_t stream = 0;
  };
  const Path& get(int32_t path) const;
  int32_t allocate_block();
  void grow(int64_t min_free);

  int64_t layers_, kv_heads_, head_dim_;
  at::ScalarType dtype_;
  Options options_;
  at::Device device_;
  std::vector<at::Tensor> k_, v_;  // per layer (num_blocks, block_size, kv_heads, head_dim)
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_blocks_;
  std::unordered_map<int32_t, Path> paths_;
  int32_t next_path_ = 0;
};

// Packed sequences for cache-free forwards. Token t of a sequence (t >= 1) is
// predicted by the row of token t - 1: `rows` lists those packed rows, and
// `targets` / `target_index` the predicted tokens and their packed index.
struct PackedSequences {
  at::Tensor ids, positions;          // (N) int64
  std::vector<int64_t> offsets;       // (S + 1)
  at::Tensor rows;                    // (R = N - S) int64: rows whose logits predict a token
  std::vector<int32_t> targets;       // (R)
  std::vector<int64_t> target_index;  // (R) packed index of the predicted token
  std::vector<int32_t> seq_of_row;    // (R) sequence index
};
// Validates tokens (in [0, vocab)) and lengths (>= 1, summing to tokens.size(),
// each <= max_positions); `what` names the call in errors.
PackedSequences pack_sequences(const std::vector<int32_t>& tokens, const std::vector<int64_t>& lengths,
                               int64_t vocab, int64_t max_positions, const char* what);

struct TokenStats {
  std::vector<float> logprobs;   // (N) aligned to tokens; 0 at each sequence's first token
  std::vector<float> entropies;  // (N) entropy (nats) of the distribution that predicted the token
};
// Per-token logprob and entropy of given sequences under softmax(logits / T):
// one no-grad forward, then logits in row chunks through kernels::logits_stats
// (so no (N, V) buffer is held at once).
TokenStats score_sequences(const Model& model, const PackedSequences& packed, float temperature, int32_t threads);
// The LM head and kernels::logits_stats over selected hidden rows (R, hidden)
// in row chunks of ~64 MiB of logits, no grad: logprobs[r] of targets[r] and
// entropies[r] (nats), each (R).
void score_rows(float* logprobs, float* entropies, const Model& model, const at::Tensor& hidden_rows,
                const int32_t* targets, float temperature, int32_t threads);

// Whether an engine call of `tokens` input tokens sampling `sampled_rows`
// rows keeps OpenBLAS on the calling thread: its largest single matmul is at
// most 2^24 multiply-adds (~0.3 ms on one core). Below that, waking
// OpenBLAS's worker (tens of microseconds on a VM whose idle vCPU halts) for
// each of a layer's seven matmuls cost more than the second core saved. The
// rule before (the call's total at most 2^22) sent demo-model calls of 5+
// rows to OpenBLAS's worker; against it, interleaved call by call in one
// process: 8 rows 0.92x the time, 16 rows 0.97x, 2 and 32-128 rows 1.00x.
// A 0.5B model's LM head alone is 136M multiply-adds per row, so its calls
// always use the worker. Numbers can depend on it: on some CPUs OpenBLAS's
// sgemm gives other bits on 1 and on n threads (device_test prints which),
// within float rounding; so the batch-invariant engine asks the rule for one
// invariant tile (kInvariantTileRows rows), the same answer for every call.
bool blas_on_calling_thread(const ModelConfig& c, int64_t tokens, int64_t sampled_rows);

// Whether an engine call is small enough for the addon to run it on the
// calling (JavaScript) thread instead of the libuv pool: at most 2^22
// multiply-adds in all (the layers' matmuls for every token and the LM head
// for every sampled row; 1-4 tokens of the demo model, ~0.25 ms, never a
// token of a 0.5B one). Handing such a call to a pool thread and its result
// back took two thread wake-ups, about as long as the call itself.
bool runs_inline(const ModelConfig& c, int64_t tokens, int64_t sampled_rows);

struct DecodeResult {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs, entropies, norm_entropies;
};

class Engine {
 public:
  Engine(const Model& model, KVCache::Options options, int32_t threads);
  KVCache& cache() { return cache_; }
  const KVCache& cache() const { return cache_; }
  void set_threads(int32_t threads) { threads_ = threads; }
  // Batch-invariant decoding (train.deterministic): a path's logits are
  // bitwise the same whichever paths share its calls. Linear layers run in
  // fixed-shape tiles (invariant_linear) and every path attends on its own
  // over its exact context (no padded batch), at some cost in throughput.
  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }

  // Appends inputs[i] to paths[i], then returns the float32 logits (P, V), on
  // the model's device, of each path's last position. All new tokens go
  // through the linear layers as one packed batch; attention reads each
  // path's cached K/V. The step's index data (token ids, positions, cache
  // slots, block tables) reaches the device in one host-to-device copy.
  at::Tensor extend_logits(const std::vector<int32_t>& paths, const std::vector<std::vector<int32_t>>& inputs);
  // extend_logits, then the sampler (dispatch::sample_tokens) keyed by
  // (seed, stream of the path, path length after the append); its results
  // come back in one device-to-host copy.
  DecodeResult extend(const std::vector<int32_t>& paths, const std::vector<std::vector<int32_t>>& inputs,
                      const kernels::SamplingParams& sampling);

 private:
  const Model& model_;
  KVCache cache_;
  int32_t threads_;
  bool batch_invariant_ = false;
  // Each path's sampling stream and position for the last extend_logits call:
  // views of that call's index block, on the device.
  at::Tensor sample_streams_, sample_positions_;
};

}  // namespace model
}  // namespace arpo
