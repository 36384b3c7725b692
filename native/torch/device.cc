// Device names and the kernel dispatch point (see device.h). The CUDA half
// compiles only with ARPO_WITH_CUDA (libtorch with CUDA + the arpo CUDA
// kernels); a CPU build rejects CUDA devices at parse time with a clear error.
#include "torch/device.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/parallel.h"
#include "torch/compat.h"
#include "torch/model.h"

#ifdef ARPO_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>

#include "cuda/kernels_cuda.h"
#endif

namespace arpo {
namespace model {

bool cuda_build() { return compat::kCudaBuild; }

at::Device parse_device(const std::string& name, const char* field) {
  if (name == "cpu") return at::Device(at::kCPU);
  int64_t index = -1;
  if (name == "cuda") {
    index = 0;
  } else if (name.rfind("cuda:", 0) == 0 && name.size() > 5 && name.size() <= 8 &&
             name.find_first_not_of("0123456789", 5) == std::string::npos) {
    index = std::stoll(name.substr(5));
  }
  if (index < 0)
    throw ModelError(std::string("expected cpu, cuda or cuda:N for ") + field + " but received \"" + name + "\"");
  if (!cuda_build())
    throw ModelError(std::string(field) + " is \"" + name + "\" but this build of arpo has no CUDA (built against libtorch " +
                     compat::torch_version() +
                     " without CUDA, or without nvcc): build against a PyTorch with CUDA (TORCH_DIR, or python3 -c "
                     "'import torch' on PATH) with nvcc installed, then npm run build:native");
#ifdef ARPO_WITH_CUDA
  const int64_t count = static_cast<int64_t>(c10::cuda::device_count());
  if (index >= count)
    throw ModelError(std::string(field) + " is \"" + name + "\" but " + std::to_string(count) +
                     " CUDA device(s) are visible (check CUDA_VISIBLE_DEVICES and nvidia-smi)");
#endif
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

std::string device_name(const at::Device& device) {
  if (device.is_cpu()) return "cpu";
  return device.str();
}

namespace dispatch {
namespace {

kernels::Logits logits_view(const at::Tensor& logits, const char* op) {
  if (!logits.defined() || logits.dim() != 2 || logits.scalar_type() != at::kFloat || !logits.is_contiguous())
    throw ModelError(std::string(op) + ": expected contiguous float32 (rows, vocab) logits");
  return kernels::Logits{logits.data_ptr<float>(), kernels::DType::F32, logits.size(0), logits.size(1)};
}

#ifdef ARPO_WITH_CUDA
// Host arrays bound for one kernel call, sent to the device in one transfer.
class Upload {
 public:
  template <class T>
  int add(const T* p, int64_t n) {
    entries_.push_back({p, p ? static_cast<size_t>(n) * sizeof(T) : 0, total_});
    total_ += (entries_.back().bytes + 255) & ~size_t{255};
    return static_cast<int>(entries_.size() - 1);
  }
  void send(const at::Device& device) {
    at::Tensor host = at::empty({static_cast<int64_t>(std::max<size_t>(total_, 1))}, at::kByte);
    uint8_t* h = host.data_ptr<uint8_t>();
    for (const Entry& e : entries_)
      if (e.bytes) std::memcpy(h + e.offset, e.host, e.bytes);
    dev_ = host.to(device);
  }
  template <class T>
  T* get(int slot) const {
    const Entry& e = entries_[slot];
    return e.host ? reinterpret_cast<T*>(dev_.data_ptr<uint8_t>() + e.offset) : nullptr;
  }

 private:
  struct Entry {
    const void* host;
    size_t bytes, offset;
  };
  std::vector<Entry> entries_;
  size_t total_ = 0;
  at::Tensor dev_;
};

// Device outputs of one call: `count` float32 arrays of n, back in one transfer.
struct Downloads {
  Downloads(const at::Device& device, int count, int64_t n)
      : n_(n), dev_(at::empty({count, std::max<int64_t>(n, 1)}, at::TensorOptions().dtype(at::kFloat).device(device))) {}
  float* dev(int i) { return dev_[i].data_ptr<float>(); }
  void fetch(std::initializer_list<void*> host) {
    at::Tensor h = dev_.to(at::kCPU);
    int i = 0;
    for (void* out : host) {
      if (out) std::memcpy(out, h[i].data_ptr<float>(), static_cast<size_t>(n_) * 4);
      ++i;
    }
  }
  int64_t n_;
  at::Tensor dev_;
};
#endif

}  // namespace

void logits_stats(float* logprobs, float* entropies, const at::Tensor& logits, const int32_t* targets,
                  float temperature, int32_t threads) {
  const kernels::Logits L = logits_view(logits, "logits_stats");
  if (logits.is_cpu()) {
    kernels::logits_stats(nullptr, entropies, nullptr, logprobs, L, targets, temperature, threads);
    return;
  }
#ifdef ARPO_WITH_CUDA
  const compat::DeviceGuard guard(logits.device());
  const int64_t R = L.rows;
  Upload up;
  const int t = up.add(targets, R);
  up.send(logits.device());
  Downloads out(logits.device(), 2, R);
  cuda::logits_stats(nullptr, entropies ? out.dev(1) : nullptr, nullptr, logprobs ? out.dev(0) : nullptr, L,
                     up.get<int32_t>(t), temperature, compat::current_stream(logits.device()));
  out.fetch({logprobs, entropies});
#else
  throw ModelError("logits_stats: logits on " + device_name(logits.device()) + " in a build without CUDA");
#endif
}

void sample_tokens(int32_t* tokens, float* logprobs, float* entropies, float* norm_entropies, const at::Tensor& logits,
                   const at::Tensor& streams, const at::Tensor& positions, const kernels::SamplingParams& params,
                   int32_t threads) {
  const kernels::Logits L = logits_view(logits, "sample_tokens");
  if (streams.device() != logits.device() || positions.device() != logits.device() ||
      streams.scalar_type() != at::kLong || positions.scalar_type() != at::kLong || !streams.is_contiguous() ||
      !positions.is_contiguous() || streams.numel() != L.rows || positions.numel() != L.rows)
    throw ModelError("sample_tokens: streams and positions must be contiguous int64 (rows) on the logits' device");
  const auto* s = reinterpret_cast<const uint64_t*>(streams.data_ptr<int64_t>());
  const int64_t* p = positions.data_ptr<int64_t>();
  if (logits.is_cpu()) {
    kernels::sample_tokens(tokens, logprobs, entropies, norm_entropies, L, s, p, params, threads);
    return;
  }
#ifdef ARPO_WITH_CUDA
  const compat::DeviceGuard guard(logits.device());
  Downloads out(logits.device(), 4, L.rows);  // tokens travel as int32 bits in the float32 block
  cuda::sample_tokens(reinterpret_cast<int32_t*>(out.dev(0)), out.dev(1), out.dev(2), out.dev(3), L, s, p, params,
                      compat::current_stream(logits.device()));
  out.fetch({tokens, logprobs, entropies, norm_entropies});
#else
  throw ModelError("sample_tokens: logits on " + device_name(logits.device()) + " in a build without CUDA");
#endif
}

void policy_loss(kernels::PolicyLossResult* result, float* logprobs, at::Tensor& logits, const int32_t* targets,
                 const float* old_logprobs, const float* advantages, const float* mask, const int32_t* seq_ids,
                 int64_t num_seqs, const float* ref_logprobs, const kernels::PolicyLossConfig& config,
                 int32_t threads) {
  const kernels::Logits L = logits_view(logits, "policy_loss");
  float* grad = logits.data_ptr<float>();
  if (logits.is_cpu()) {
    kernels::policy_loss(result, grad, logprobs, nullptr, L, targets, old_logprobs, advantages, mask, seq_ids, num_seqs,
                         ref_logprobs, config, threads);
    return;
  }
#ifdef ARPO_WITH_CUDA
  const compat::DeviceGuard guard(logits.device());
  const int64_t R = L.rows;
  Upload up;
  const int t = up.add(targets, R), o = up.add(old_logprobs, R), a = up.add(advantages, R), m = up.add(mask, R),
            q = up.add(seq_ids, R), r = up.add(ref_logprobs, R);
  up.send(logits.device());
  Downloads out(logits.device(), 1, R);
  cuda::policy_loss(result, grad, logprobs ? out.dev(0) : nullptr, nullptr, L, up.get<int32_t>(t), up.get<float>(o),
                    up.get<float>(a), up.get<float>(m), up.get<int32_t>(q), num_seqs, up.get<float>(r), config,
                    compat::current_stream(logits.device()));
  if (logprobs) out.fetch({logprobs});
#else
  throw ModelError("policy_loss: logits on " + device_name(logits.device()) + " in a build without CUDA");
#endif
}

void policy_loss_copies(kernels::PolicyLossResult* result, at::Tensor& logits, const int32_t* targets,
                        const float* old_logprobs, const kernels::TokenCopySums& sums, int64_t num_seqs,
                        const float* ref_logprobs, const kernels::PolicyLossConfig& config, int32_t threads) {
  const kernels::Logits L = logits_view(logits, "policy_loss_copies");
  float* grad = logits.data_ptr<float>();
  if (logits.is_cpu()) {
    kernels::policy_loss_copies(result, grad, nullptr, nullptr, L, targets, old_logprobs, sums, num_seqs, ref_logprobs,
                                config, threads);
    return;
  }
#ifdef ARPO_WITH_CUDA
  const compat::DeviceGuard guard(logits.device());
  const int64_t R = L.rows;
  Upload up;
  const int t = up.add(targets, R), o = up.add(old_logprobs, R), r = up.add(ref_logprobs, R);
  const int sp = up.add(sums.adv_pos, R), sn = up.add(sums.adv_neg, R), sw = up.add(sums.weight, R),
            cp = up.add(sums.count_pos, R), cn = up.add(sums.count_neg, R), ct = up.add(sums.count, R);
  up.send(logits.device());
  const kernels::TokenCopySums dev{up.get<double>(sp), up.get<double>(sn), up.get<double>(sw),
                                   up.get<double>(cp), up.get<double>(cn), up.get<double>(ct)};
  cuda::policy_loss_copies(result, grad, nullptr, nullptr, L, up.get<int32_t>(t), up.get<float>(o), dev, num_seqs,
                           up.get<float>(r), config, compat::current_stream(logits.device()));
#else
  throw ModelError("policy_loss_copies: logits on " + device_name(logits.device()) + " in a build without CUDA");
#endif
}

bool fused_inference_supported(const at::Tensor& x) {
  return x.defined() && x.is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble) &&
         x.is_contiguous();
}

namespace {

void expect_like(const at::Tensor& t, const at::Tensor& x, const char* op, const char* name) {
  if (!t.defined() || !t.is_cpu() || t.scalar_type() != x.scalar_type() || !t.is_contiguous())
    throw ModelError(std::string(op) + ": expected " + name + " as a contiguous CPU tensor of " +
                     c10::toString(x.scalar_type()));
}

// Rows per parallel chunk so a chunk does ~64k scalar operations.
int64_t grain(int64_t per_item) { return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, per_item)); }

// The addon is not compiled with OpenMP, so at::parallel_for in its code runs
// on the calling thread alone (it did, for every kernel here, until this was
// found with perf): the CPU kernels split their rows over std::threads
// (kernels/parallel.h), as many as libtorch's intra-op setting (model.threads),
// each with at least `grain_rows` rows.
template <class Fn>
void parallel_rows(int64_t n, int64_t grain_rows, Fn&& fn) {
  kernels::parallel_for(n, kernels::resolve_threads(at::get_num_threads(), n, grain_rows), std::forward<Fn>(fn));
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (!fused_inference_supported(x) || x.dim() < 1) throw ModelError("rms_norm: expected a contiguous float or double CPU tensor");
  const int64_t dim = x.size(-1), rows = dim > 0 ? x.numel() / dim : 0;
  expect_like(weight, x, "rms_norm", "weight");
  if (weight.numel() != dim) throw ModelError("rms_norm: weight has " + std::to_string(weight.numel()) + " elements but rows have " + std::to_string(dim));
  at::Tensor out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    parallel_rows(rows, grain(dim), [&](int64_t b, int64_t e) { kernels::rms_norm_rows(op, xp, wp, dim, eps, b, e); });
  });
  return out;
}

void rope_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (!fused_inference_supported(x) || x.dim() != 3) throw ModelError("rope_: expected a contiguous (N, heads, D) float or double CPU tensor");
  const int64_t N = x.size(0), heads = x.size(1), D = x.size(2);
  expect_like(cos, x, "rope_", "cos");
  expect_like(sin, x, "rope_", "sin");
  if (cos.numel() != N * D || sin.numel() != N * D || D % 2 != 0)
    throw ModelError("rope_: expected (" + std::to_string(N) + ", " + std::to_string(D) + ") tables and an even head dim");
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rope_", [&] {
    scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* cp = cos.data_ptr<scalar_t>();
    const scalar_t* sp = sin.data_ptr<scalar_t>();
    parallel_rows(N, grain(heads * D * 4), [&](int64_t b, int64_t e) { kernels::rope_rows(xp, cp, sp, heads, D, b, e); });
  });
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& bias) {
  if (!fused_inference_supported(x) || x.dim() != 2) throw ModelError("linear: expected x as a contiguous (M, K) float or double CPU tensor");
  expect_like(W, x, "linear", "the weight");
  const int64_t M = x.size(0), K = x.size(1), N = W.dim() == 2 ? W.size(0) : -1;
  if (W.dim() != 2 || W.size(1) != K)
    throw ModelError("linear: weight " + c10::str(W.sizes()) + " does not match rows of " + std::to_string(K));
  if (bias.defined()) {
    expect_like(bias, x, "linear", "the bias");
    if (bias.numel() != N) throw ModelError("linear: bias has " + std::to_string(bias.numel()) + " elements for " + std::to_string(N) + " outputs");
  }
  at::Tensor out = at::empty({M, N}, x.options());
  constexpr int64_t kBlock = 16;  // outputs per work item (a multiple of the kernel's span: 16 with AVX-512, 8 without)
  // Multiply-adds per thread: below this a call runs on the calling thread.
  // A pool worker the OS has not scheduled (on 2 cores, behind tool processes
  // or another pool's spinning) stalls the whole call until it runs; measured
  // in a demo rollout, 2-row decode calls took 1.96 ms split over 2 threads
  // against 1.19 ms with the packing GEMM on one.
  constexpr int64_t kLinearThreadWork = int64_t{1} << 21;
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "linear", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* wp = W.data_ptr<scalar_t>();
    const scalar_t* bp = bias.defined() ? bias.data_ptr<scalar_t>() : nullptr;
    scalar_t* op = out.data_ptr<scalar_t>();
    parallel_rows(blocks, std::max<int64_t>(1, kLinearThreadWork / std::max<int64_t>(1, M * K * kBlock)), [&](int64_t b, int64_t e) {
      kernels::linear_rows(op, xp, wp, bp, M, K, N, b * kBlock, std::min(N, e * kBlock));
    });
  });
  return out;
}

void decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& kpool, const at::Tensor& vpool,
                      const at::Tensor& rows, const at::Tensor& slots, const at::Tensor& lengths, double scale,
                      const at::Tensor& offsets, const at::Tensor& counts) {
  if (!fused_inference_supported(q) || q.dim() != 3) throw ModelError("decode_attention: expected q as a contiguous (N, H, D) float or double CPU tensor");
  expect_like(out, q, "decode_attention", "out");
  expect_like(kpool, q, "decode_attention", "the key pool");
  expect_like(vpool, q, "decode_attention", "the value pool");
  const bool flat = offsets.defined();
  for (const at::Tensor* t : {&rows, &slots, &lengths, &offsets, &counts})
    if (t->defined() && (!t->is_cpu() || t->scalar_type() != at::kLong || !t->is_contiguous()))
      throw ModelError("decode_attention: expected rows, slots, lengths, offsets and counts as contiguous int64 CPU tensors");
  kernels::DecodeAttention a;
  a.paths = rows.numel();
  if (counts.defined()) {
    if (!flat || counts.numel() != a.paths)
      throw ModelError("decode_attention: counts (" + std::to_string(counts.numel()) + ") need offsets and one per group (" +
                       std::to_string(a.paths) + ")");
    a.counts = counts.data_ptr<int64_t>();
    for (int64_t b = 0; b < a.paths; ++b) {
      if (a.counts[b] < 1) throw ModelError("decode_attention: group " + std::to_string(b) + " has " + std::to_string(a.counts[b]) + " rows");
    }
  }
  if (flat) {
    if (offsets.numel() != a.paths || lengths.numel() != a.paths)
      throw ModelError("decode_attention: " + std::to_string(a.paths) + " rows but " + std::to_string(offsets.numel()) +
                       " offsets and " + std::to_string(lengths.numel()) + " lengths");
    // The longest list a row reads: its group's last row's.
    const int64_t* lp = lengths.data_ptr<int64_t>();
    for (int64_t b = 0; b < a.paths; ++b) a.max_ctx = std::max(a.max_ctx, lp[b] + (a.counts ? a.counts[b] : 1) - 1);
    a.offsets = offsets.data_ptr<int64_t>();
    a.slot_count = slots.numel();
  } else {
    a.max_ctx = a.paths > 0 ? slots.numel() / a.paths : 0;
  }
  a.heads = q.size(1);
  a.head_dim = q.size(2);
  a.kv_heads = kpool.dim() == 3 ? kpool.size(1) : 0;
  a.pool_slots = kpool.dim() == 3 ? kpool.size(0) : 0;
  a.scale = scale;
  if (a.paths == 0) return;
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0 || kpool.size(2) != a.head_dim || !vpool.sizes().equals(kpool.sizes()) ||
      lengths.numel() != a.paths || (!flat && slots.numel() != a.paths * a.max_ctx) || out.numel() != q.numel())
    throw ModelError("decode_attention: inconsistent shapes (q " + shape_string(q.sizes()) + ", pool " + shape_string(kpool.sizes()) +
                     ", slots " + shape_string(slots.sizes()) + ", out " + shape_string(out.sizes()) + ")");
  a.rows = rows.data_ptr<int64_t>();
  a.slots = slots.data_ptr<int64_t>();
  a.lengths = lengths.data_ptr<int64_t>();
  for (int64_t b = 0; b < a.paths; ++b)
    if (a.rows[b] < 0 || a.rows[b] + (a.counts ? a.counts[b] : 1) > q.size(0))
      throw ModelError("decode_attention: row " + std::to_string(a.rows[b]) + " outside q");
  // Work items (group, kv head) cost ~ rows x keys; they are cut into one
  // contiguous range per thread of about equal cost (an even split by count
  // would hand one thread every tool-result group of a call). Each row's
  // numbers do not depend on the cut.
  const int64_t items = a.paths * a.kv_heads, unit = (a.heads / a.kv_heads) * a.head_dim * 2;
  std::vector<int64_t> cost(static_cast<size_t>(a.paths));
  int64_t total = 0;
  for (int64_t b = 0; b < a.paths; ++b) {
    const int64_t n = a.counts ? a.counts[b] : 1;
    cost[b] = n * (a.lengths[b] + (n - 1) / 2) * unit;
    total += cost[b] * a.kv_heads;
  }
  // A part is at least ~2^20 multiply-adds (~0.1 ms): waking a pool worker for less cost more than it saved
  // (2^19 measured no better with the pool; without a split, calls of 32+ rows ran 1.3x longer).
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>({static_cast<int64_t>(at::get_num_threads()), items, total >> 20}));
  std::vector<int64_t> cut{0};
  for (int64_t i = 0, acc = 0; i < items && static_cast<int64_t>(cut.size()) < parts; ++i) {
    acc += cost[i / a.kv_heads];
    if (acc * parts >= total * static_cast<int64_t>(cut.size())) cut.push_back(i + 1);
  }
  while (static_cast<int64_t>(cut.size()) <= parts) cut.push_back(items);
  cut.back() = items;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "decode_attention", [&] {
    scalar_t* op = out.data_ptr<scalar_t>();
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = kpool.data_ptr<scalar_t>();
    const scalar_t* vp = vpool.data_ptr<scalar_t>();
    kernels::parallel_for(parts, static_cast<int32_t>(parts), [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) kernels::paged_decode_attention(op, qp, kp, vp, a, cut[p], cut[p + 1]);
    });
  });
}

}  // namespace dispatch
}  // namespace model
}  // namespace arpo
