// Paged KV cache with forking, batched extend-and-sample, and cache-free
// sequence scoring (see engine.h for the slot layout and the contracts).
#include "torch/engine.h"

#include "torch/compat.h"
#include "torch/device.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <unordered_set>

namespace arpo {
namespace model {

// ---------------------------------------------------------------- KVCache

KVCache::KVCache(int64_t layers, int64_t kv_heads, int64_t head_dim, at::ScalarType dtype, Options options,
                 at::Device device)
    : layers_(layers), kv_heads_(kv_heads), head_dim_(head_dim), dtype_(dtype), options_(options), device_(device) {
  if (options_.block_size < 1) throw ModelError("expected a positive block_size but received " + std::to_string(options_.block_size));
  if (options_.initial_blocks < 1) options_.initial_blocks = 1;
  if (options_.max_blocks < 0) throw ModelError("expected max_blocks >= 0 but received " + std::to_string(options_.max_blocks));
  if (options_.max_blocks > 0) options_.initial_blocks = std::min(options_.initial_blocks, options_.max_blocks);
  k_.resize(layers_);
  v_.resize(layers_);
  grow(options_.initial_blocks);
}

const KVCache::Path& KVCache::get(int32_t path) const {
  auto it = paths_.find(path);
  if (it == paths_.end()) throw ModelError("unknown or freed path " + std::to_string(path));
  return it->second;
}

void KVCache::grow(int64_t min_free) {
  const int64_t have = static_cast<int64_t>(refcount_.size());
  int64_t want = std::max<int64_t>(have * 2, have + min_free);
  if (options_.max_blocks > 0) want = std::min(want, options_.max_blocks);
  if (want - have < min_free || want <= have)
    throw ModelError("KV cache exhausted: " + std::to_string(have) + " blocks of " + std::to_string(options_.block_size) +
                     " tokens in use and max_blocks is " + std::to_string(options_.max_blocks) +
                     " (free paths, or raise max_blocks)");
  const auto opts = at::TensorOptions().dtype(dtype_).device(device_);
  for (int64_t l = 0; l < layers_; ++l) {
    at::Tensor k = at::zeros({want, options_.block_size, kv_heads_, head_dim_}, opts);
    at::Tensor v = at::zeros({want, options_.block_size, kv_heads_, head_dim_}, opts);
    if (have > 0) {
      k.slice(0, 0, have).copy_(k_[l]);
      v.slice(0, 0, have).copy_(v_[l]);
    }
    k_[l] = k;
    v_[l] = v;
  }
  refcount_.resize(want, 0);
  // Free list is a stack: push high ids first so low ids are handed out first.
  for (int64_t b = want - 1; b >= have; --b) free_blocks_.push_back(static_cast<int32_t>(b));
}

int32_t KVCache::allocate_block() {
  if (free_blocks_.empty()) grow(1);
  const int32_t b = free_blocks_.back();
  free_blocks_.pop_back();
  refcount_[b] = 1;
  return b;
}

int32_t KVCache::new_path(uint64_t stream) {
  const int32_t id = next_path_++;
  Path p;
  p.stream = stream;
  paths_.emplace(id, std::move(p));
  return id;
}

int32_t KVCache::fork(int32_t parent, int64_t prefix, uint64_t stream) {
  const Path& src = get(parent);
  if (prefix < 0 || prefix > src.length)
    throw ModelError("fork: expected prefixLength in [0, " + std::to_string(src.length) + "] for path " +
                     std::to_string(parent) + " but received " + std::to_string(prefix));
  Path child;
  child.stream = stream;
  child.length = prefix;
  const int64_t nblocks = (prefix + options_.block_size - 1) / options_.block_size;
  child.blocks.assign(src.blocks.begin(), src.blocks.begin() + nblocks);
  for (int32_t b : child.blocks) ++refcount_[b];
  const int32_t id = next_path_++;
  paths_.emplace(id, std::move(child));
  return id;
}

void KVCache::free_path(int32_t path) {
  const Path& p = get(path);
  for (int32_t b : p.blocks)
    if (--refcount_[b] == 0) free_blocks_.push_back(b);
  paths_.erase(path);
}

void KVCache::reserve(int32_t path, int64_t n) {
  get(path);
  Path& p = paths_.at(path);
  const int64_t bs = options_.block_size;
  if (n <= 0) return;
  const int64_t first = p.length / bs, last = (p.length + n - 1) / bs;
  for (int64_t b = first; b <= last; ++b) {
    if (b < static_cast<int64_t>(p.blocks.size())) {
      const int32_t old = p.blocks[b];
      if (refcount_[old] > 1) {
        // Copy-on-write: another path shares this block; rows before p.length
        // are ours and must survive, rows at or after it are about to be written.
        const int32_t fresh = allocate_block();
        for (int64_t l = 0; l < layers_; ++l) {
          k_[l][fresh].copy_(k_[l][old]);
          v_[l][fresh].copy_(v_[l][old]);
        }
        --refcount_[old];
        p.blocks[b] = fresh;
      }
    } else {
      p.blocks.push_back(allocate_block());
    }
  }
}

void KVCache::slots(int32_t path, int64_t begin, int64_t end, int64_t* out) const {
  const Path& p = get(path);
  const int64_t bs = options_.block_size;
  if (begin < 0 || end < begin || (end + bs - 1) / bs > static_cast<int64_t>(p.blocks.size()))
    throw ModelError("slots: positions [" + std::to_string(begin) + ", " + std::to_string(end) +
                     ") are not reserved for path " + std::to_string(path));
  for (int64_t pos = begin; pos < end; ++pos) *out++ = static_cast<int64_t>(p.blocks[pos / bs]) * bs + pos % bs;
}

at::Tensor KVCache::keys(int64_t layer) const { return k_[layer].view({-1, kv_heads_, head_dim_}); }
at::Tensor KVCache::values(int64_t layer) const { return v_[layer].view({-1, kv_heads_, head_dim_}); }

int32_t KVCache::block_refcount(int32_t path, int64_t pos) const {
  const Path& p = get(path);
  const int64_t b = pos / options_.block_size;
  if (pos < 0 || b >= static_cast<int64_t>(p.blocks.size())) return 0;
  return refcount_[p.blocks[b]];
}

KVCache::Stats KVCache::stats() const {
  Stats s;
  s.block_size = options_.block_size;
  s.blocks_total = static_cast<int64_t>(refcount_.size());
  for (int32_t r : refcount_) s.blocks_used += r > 0;
  s.bytes_per_block = 2 * layers_ * options_.block_size * kv_heads_ * head_dim_ * static_cast<int64_t>(c10::elementSize(dtype_));
  s.bytes_used = s.blocks_used * s.bytes_per_block;
  s.paths = static_cast<int64_t>(paths_.size());
  for (const auto& [id, p] : paths_) {
    s.tokens += p.length;
    s.bytes_unshared += (p.length + options_.block_size - 1) / options_.block_size * s.bytes_per_block;
  }
  return s;
}

// ---------------------------------------------------------------- packing and scoring

PackedSequences pack_sequences(const std::vector<int32_t>& tokens, const std::vector<int64_t>& lengths,
                               int64_t vocab, int64_t max_positions, const char* what) {
  PackedSequences p;
  const int64_t N = static_cast<int64_t>(tokens.size());
  int64_t total = 0;
  p.offsets.push_back(0);
  for (size_t s = 0; s < lengths.size(); ++s) {
    if (lengths[s] < 1 || lengths[s] > max_positions)
      throw ModelError(std::string(what) + ": expected sequence lengths in [1, " + std::to_string(max_positions) +
                       "] but sequence " + std::to_string(s) + " has " + std::to_string(lengths[s]));
    total += lengths[s];
    p.offsets.push_back(total);
  }
  if (total != N)
    throw ModelError(std::string(what) + ": sequence lengths sum to " + std::to_string(total) + " but " +
                     std::to_string(N) + " tokens were given");
  p.ids = at::empty({N}, at::kLong);
  p.positions = at::empty({N}, at::kLong);
  int64_t* ids = p.ids.data_ptr<int64_t>();
  int64_t* pos = p.positions.data_ptr<int64_t>();
  std::vector<int64_t> rows;
  for (size_t s = 0; s + 1 < p.offsets.size(); ++s) {
    for (int64_t i = p.offsets[s]; i < p.offsets[s + 1]; ++i) {
      const int32_t t = tokens[i];
      if (t < 0 || t >= vocab)
        throw ModelError(std::string(what) + ": expected token ids in [0, " + std::to_string(vocab) +
                         ") but token " + std::to_string(i) + " is " + std::to_string(t));
      ids[i] = t;
      pos[i] = i - p.offsets[s];
      if (i + 1 < p.offsets[s + 1]) {
        rows.push_back(i);
        p.targets.push_back(tokens[i + 1]);
        p.target_index.push_back(i + 1);
        p.seq_of_row.push_back(static_cast<int32_t>(s));
      }
    }
  }
  p.rows = at::empty({static_cast<int64_t>(rows.size())}, at::kLong);
  std::copy(rows.begin(), rows.end(), p.rows.data_ptr<int64_t>());
  return p;
}

void score_rows(float* logprobs, float* entropies, const Model& model, const at::Tensor& hidden_rows,
                const int32_t* targets, float temperature, int32_t threads) {
  at::NoGradGuard no_grad;
  const int64_t R = hidden_rows.size(0), V = model.config().vocab_size;
  // Chunk rows so one float32 logits chunk stays near 64 MiB: 64 MiB / (4 V)
  // rows (e.g. 110 rows at V = 151,936).
  const int64_t chunk = std::max<int64_t>(1, (int64_t{64} << 20) / (4 * V));
  for (int64_t a = 0; a < R; a += chunk) {
    const int64_t b = std::min(R, a + chunk);
    at::Tensor logits = model.logits(hidden_rows.slice(0, a, b)).to(at::kFloat).contiguous();
    dispatch::logits_stats(logprobs + a, entropies + a, logits, targets + a, temperature, threads);
  }
}

TokenStats score_sequences(const Model& model, const PackedSequences& packed, float temperature, int32_t threads) {
  at::NoGradGuard no_grad;
  const int64_t N = packed.ids.size(0), R = packed.rows.size(0);
  TokenStats out;
  out.logprobs.assign(N, 0.0f);
  out.entropies.assign(N, 0.0f);
  if (R == 0) return out;
  at::Tensor hidden = model.forward_hidden(packed.ids, packed.positions, packed_causal_attention(packed.offsets));
  std::vector<float> lp(R), ent(R);
  score_rows(lp.data(), ent.data(), model, hidden.index_select(0, packed.rows.to(hidden.device())), packed.targets.data(),
             temperature, threads);
  for (int64_t r = 0; r < R; ++r) {
    out.logprobs[packed.target_index[r]] = lp[r];
    out.entropies[packed.target_index[r]] = ent[r];
  }
  return out;
}

// ---------------------------------------------------------------- Engine

Engine::Engine(const Model& model, KVCache::Options options, int32_t threads)
    : model_(model),
      cache_(model.config().num_hidden_layers, model.config().num_key_value_heads, model.config().head_dim,
             model.dtype(), options, model.device()),
      threads_(threads) {}

bool blas_on_calling_thread(const ModelConfig& c, int64_t tokens, int64_t sampled_rows) {
  const int64_t h = c.hidden_size;
  const int64_t weight = std::max({h * c.q_dim(), h * c.kv_dim(), h * c.intermediate_size});  // q/o, k/v, gate/up/down
  const double largest = std::max(static_cast<double>(tokens) * static_cast<double>(weight),
                                  static_cast<double>(sampled_rows) * static_cast<double>(c.vocab_size) * static_cast<double>(h));
  return largest <= static_cast<double>(int64_t{1} << 24);
}

bool runs_inline(const ModelConfig& c, int64_t tokens, int64_t sampled_rows) {
  const double h = static_cast<double>(c.hidden_size);
  const double per_token = static_cast<double>(c.num_hidden_layers) *
                           h * static_cast<double>(2 * c.q_dim() + 2 * c.kv_dim() + 3 * c.intermediate_size);
  const double total = static_cast<double>(tokens) * per_token + static_cast<double>(sampled_rows) * static_cast<double>(c.vocab_size) * h;
  return total <= static_cast<double>(int64_t{1} << 22);
}

at::Tensor Engine::extend_logits(const std::vector<int32_t>& paths, const std::vector<std::vector<int32_t>>& inputs) {
  const ModelConfig& c = model_.config();
  const int64_t P = static_cast<int64_t>(paths.size());
  if (P == 0) throw ModelError("extend: expected at least one path");
  if (inputs.size() != paths.size())
    throw ModelError("extend: " + std::to_string(paths.size()) + " paths but " + std::to_string(inputs.size()) + " inputs");
  std::unordered_set<int32_t> seen;
  int64_t N = 0;
  for (int64_t i = 0; i < P; ++i) {
    const int32_t path = paths[i];
    if (!cache_.has_path(path)) throw ModelError("extend: unknown or freed path " + std::to_string(path));
    if (!seen.insert(path).second) throw ModelError("extend: path " + std::to_string(path) + " appears twice");
    const auto& in = inputs[i];
    if (in.empty()) throw ModelError("extend: inputs[" + std::to_string(i) + "] (path " + std::to_string(path) + ") is empty");
    const int64_t end = cache_.length(path) + static_cast<int64_t>(in.size());
    if (end > c.max_position_embeddings)
      throw ModelError("extend: path " + std::to_string(path) + " would reach " + std::to_string(end) +
                       " tokens, beyond max_position_embeddings " + std::to_string(c.max_position_embeddings));
    for (size_t j = 0; j < in.size(); ++j)
      if (in[j] < 0 || in[j] >= c.vocab_size)
        throw ModelError("extend: expected token ids in [0, " + std::to_string(c.vocab_size) + ") but inputs[" +
                         std::to_string(i) + "][" + std::to_string(j) + "] is " + std::to_string(in[j]));
    N += static_cast<int64_t>(in.size());
  }
  for (int64_t i = 0; i < P; ++i) cache_.reserve(paths[i], static_cast<int64_t>(inputs[i].size()));

  // Everything the step indexes with goes to the device in one int64 block
  // (a view of host memory on the CPU): for the N new tokens their ids,
  // positions and cache slots; per path its last row and, for sampling, its
  // stream and position; per decode path its row, context length and
  // context slots (B x max_ctx); per prefill path its context slots.
  // With the CPU's fused kernels every query row attends in one kernel
  // call (rows of a multi-token path over growing prefixes of its slot
  // list). Otherwise single-token (decode) paths attend as one padded
  // batch and multi-token (prefill) paths one by one, each over its own
  // cached context (every path so when batch-invariant: a padded softmax
  // sums in another order).
  std::vector<int64_t> row_begin(P), past(P), decode, prefill;
  int64_t max_ctx = 0, prefill_total = 0;
  for (int64_t i = 0, r = 0; i < P; ++i) {
    row_begin[i] = r;
    past[i] = cache_.length(paths[i]);
    r += static_cast<int64_t>(inputs[i].size());
    if (inputs[i].size() == 1 && !batch_invariant_) {
      decode.push_back(i);
      max_ctx = std::max(max_ctx, past[i] + 1);
    } else {
      prefill.push_back(i);
      prefill_total += past[i] + static_cast<int64_t>(inputs[i].size());
    }
  }
  const int64_t B = static_cast<int64_t>(decode.size());
  const int64_t o_ids = 0, o_pos = N, o_write = 2 * N, o_last = 3 * N, o_stream = o_last + P, o_spos = o_stream + P;
  const int64_t o_drows = o_spos + P, o_dlen = o_drows + B, o_dslots = o_dlen + B, o_pslots = o_dslots + B * max_ctx;
  at::Tensor block = at::zeros({o_pslots + prefill_total}, at::kLong);
  int64_t* h = block.data_ptr<int64_t>();
  for (int64_t i = 0; i < P; ++i) {
    const int64_t len = past[i], n = static_cast<int64_t>(inputs[i].size()), r0 = row_begin[i];
    cache_.slots(paths[i], len, len + n, h + o_write + r0);
    for (int64_t j = 0; j < n; ++j) {
      h[o_ids + r0 + j] = inputs[i][j];
      h[o_pos + r0 + j] = len + j;
    }
    h[o_last + i] = r0 + n - 1;
    h[o_stream + i] = static_cast<int64_t>(cache_.stream(paths[i]));
    h[o_spos + i] = len + n;  // the sampled token's position
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t i = decode[b];
    h[o_drows + b] = row_begin[i];
    h[o_dlen + b] = past[i] + 1;
    cache_.slots(paths[i], 0, past[i] + 1, h + o_dslots + b * max_ctx);
  }
  std::vector<int64_t> prefill_at, prefill_len;  // where each prefill path's context slots sit in the block
  for (int64_t i : prefill) {
    prefill_at.push_back(prefill_at.empty() ? o_pslots : prefill_at.back() + prefill_len.back());
    prefill_len.push_back(past[i] + static_cast<int64_t>(inputs[i].size()));
    cache_.slots(paths[i], 0, prefill_len.back(), h + prefill_at.back());
  }
  const at::Tensor dev = block.to(model_.device());  // the one host-to-device copy (none on the CPU)
  const at::Tensor ids = dev.slice(0, o_ids, o_ids + N), positions = dev.slice(0, o_pos, o_pos + N);
  const at::Tensor write_slots = dev.slice(0, o_write, o_write + N), last_rows = dev.slice(0, o_last, o_last + P);
  sample_streams_ = dev.slice(0, o_stream, o_stream + P);
  sample_positions_ = dev.slice(0, o_spos, o_spos + P);
  const at::Tensor decode_rows = dev.slice(0, o_drows, o_drows + B);
  const at::Tensor decode_slots = dev.slice(0, o_dslots, o_dslots + B * max_ctx).view({B, max_ctx});
  const at::Tensor decode_lengths = dev.slice(0, o_dlen, o_dlen + B);
  at::Tensor decode_pad;  // the plain path's mask (made on first use)
  std::vector<at::Tensor> prefill_slots;
  for (size_t j = 0; j < prefill.size(); ++j) prefill_slots.push_back(dev.slice(0, prefill_at[j], prefill_at[j] + prefill_len[j]));

  const int64_t H = c.num_attention_heads, KVH = c.num_key_value_heads, D = c.head_dim, G = H / KVH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const at::ScalarType acc = model_.dtype() == at::kDouble ? at::kDouble : at::kFloat;
  // The fused path's query groups: each decode row over its padded slot
  // list, each prefill path's rows in groups of up to 16 over prefixes of
  // its list (causal attention; the kernel reuses each key tile across a
  // group's rows), all in one kernel call.
  at::Tensor g_rows, g_lengths, g_offsets, g_counts;
  const at::Tensor all_slots = dev.slice(0, o_dslots);
  auto fused_groups = [&] {
    constexpr int64_t kGroupRows = 16;
    std::vector<int64_t> gr, gl, go, gc;
    for (int64_t b = 0; b < B; ++b) {
      gr.push_back(row_begin[decode[b]]);
      gl.push_back(past[decode[b]] + 1);
      go.push_back(b * max_ctx);
      gc.push_back(1);
    }
    for (size_t j = 0; j < prefill.size(); ++j) {
      const int64_t i = prefill[j], n = static_cast<int64_t>(inputs[i].size());
      for (int64_t t = 0; t < n; t += kGroupRows) {
        gr.push_back(row_begin[i] + t);
        gl.push_back(past[i] + t + 1);
        go.push_back(prefill_at[j] - o_dslots);
        gc.push_back(std::min(kGroupRows, n - t));
      }
    }
    auto tensor = [](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong); };
    g_rows = tensor(gr);
    g_lengths = tensor(gl);
    g_offsets = tensor(go);
    g_counts = tensor(gc);
  };
  AttentionFn attention = [&](int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    at::Tensor kpool = cache_.keys(layer), vpool = cache_.values(layer);
    kpool.index_copy_(0, write_slots, k);
    vpool.index_copy_(0, write_slots, v);
    at::Tensor out = at::empty({N, H * D}, q.options());
    if (model_.fused_inference(q)) {
      // kpool/vpool are read in place at the paths' slots (no gather).
      if (!g_rows.defined()) fused_groups();
      dispatch::decode_attention(out, q, kpool, vpool, g_rows, all_slots, g_lengths, scale, g_offsets, g_counts);
      return out;
    }
    for (size_t j = 0; j < prefill.size(); ++j) {
      const int64_t i = prefill[j], a = row_begin[i], n = static_cast<int64_t>(inputs[i].size());
      const at::Tensor& s = prefill_slots[j];
      out.slice(0, a, a + n).copy_(
          causal_attention(q.slice(0, a, a + n), kpool.index_select(0, s), vpool.index_select(0, s), past[i]));
    }
    if (B > 0) {
      // pad[b][j]: context position j lies beyond decode path b's length.
      if (!decode_pad.defined()) decode_pad = at::arange(max_ctx, dev.options()).unsqueeze(0) >= decode_lengths.unsqueeze(1);
      at::Tensor qd = q.index_select(0, decode_rows).view({B, KVH, G, D});
      at::Tensor kd = kpool.index_select(0, decode_slots.view(-1)).view({B, max_ctx, KVH, D});
      at::Tensor vd = vpool.index_select(0, decode_slots.view(-1)).view({B, max_ctx, KVH, D});
      at::Tensor scores = at::matmul(qd, kd.permute({0, 2, 3, 1})).mul(scale);  // (B, KVH, G, max_ctx)
      scores = scores.masked_fill(decode_pad.view({B, 1, 1, max_ctx}), -std::numeric_limits<double>::infinity());
      at::Tensor probs = at::softmax(scores, -1, acc).to(q.scalar_type());
      at::Tensor o = at::matmul(probs, vd.permute({0, 2, 1, 3}));  // (B, KVH, G, D)
      out.index_copy_(0, decode_rows, o.reshape({B, H * D}));
    }
    return out;
  };

  // Batch-invariant: every matmul is one kInvariantTileRows-row tile, so the rule
  // is asked for one tile and answers the same for every call (OpenBLAS's bits
  // can depend on its thread count; a call's size must not choose them).
  std::optional<compat::SingleThreadBlas> one_blas_thread;
  const bool one_thread = batch_invariant_ ? blas_on_calling_thread(c, kInvariantTileRows, kInvariantTileRows)
                                           : blas_on_calling_thread(c, N, P);
  if (model_.device().is_cpu() && one_thread) one_blas_thread.emplace();
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    const FusedInferenceScope fused;  // the model's own switch still decides
    at::Tensor hidden = model_.forward_hidden(ids, positions, attention, batch_invariant_);
    logits = model_.logits(hidden.index_select(0, last_rows), batch_invariant_).to(at::kFloat).contiguous();
  }
  for (int64_t i = 0; i < P; ++i) cache_.advance(paths[i], static_cast<int64_t>(inputs[i].size()));
  return logits;
}

DecodeResult Engine::extend(const std::vector<int32_t>& paths, const std::vector<std::vector<int32_t>>& inputs,
                            const kernels::SamplingParams& sampling) {
  at::Tensor logits = extend_logits(paths, inputs);
  const int64_t P = static_cast<int64_t>(paths.size());
  DecodeResult out;
  out.tokens.resize(P);
  out.logprobs.resize(P);
  out.entropies.resize(P);
  out.norm_entropies.resize(P);
  dispatch::sample_tokens(out.tokens.data(), out.logprobs.data(), out.entropies.data(), out.norm_entropies.data(), logits,
                          sample_streams_, sample_positions_, sampling, threads_);
  return out;
}

}  // namespace model
}  // namespace arpo
