// Timing of the CUDA kernels against a device-to-device copy of the same
// bytes and (when built against a CUDA libtorch) the libtorch composition,
// plus a correctness check of both against a float64 libtorch reference.
//   gpu_bench            small sizes, checks only (ctest; exit 77 without a GPU)
//   gpu_bench --bench    full sizes + tuning sweep; prints a table last
// Bytes counted are the fewest the operation must move: logits read once
// (+ the float32 gradient written once for the loss).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda/kernels_cuda.h"

#if defined(ARPO_BENCH_TORCH) || (defined(ARPO_WITH_TORCH) && defined(ARPO_WITH_CUDA))
#define ARPO_HAVE_TORCH_BENCH 1
#include <torch/torch.h>
#endif

namespace {

using arpo::kernels::DType;
using arpo::kernels::Logits;

int failures = 0;
void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}
void expect(bool cond, const std::string& what) {
  std::printf("%s %s\n", cond ? "ok  " : "FAIL", what.c_str());
  if (!cond) ++failures;
}

// Median of `reps` timed runs (device events) after `warm` untimed ones.
double time_ms(const std::function<void()>& fn, int warm, int reps) {
  for (int i = 0; i < warm; ++i) fn();
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "event");
  ok(cudaEventCreate(&b), "event");
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    ok(cudaEventRecord(a, nullptr), "record");
    fn();
    ok(cudaEventRecord(b, nullptr), "record");
    ok(cudaEventSynchronize(b), "sync");
    float t = 0;
    ok(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Row {
  std::string kernel, shape;
  double ms, gbps, pct_copy, speedup;  // speedup vs libtorch (0 = not measured)
};
std::vector<Row> table;
double copy_gbps = 0;

void add_row(const std::string& k, const std::string& shape, double ms, double bytes, double torch_ms) {
  const double gbps = bytes / (ms * 1e-3) / 1e9;
  table.push_back({k, shape, ms, gbps, copy_gbps > 0 ? 100.0 * gbps / copy_gbps : 0, torch_ms > 0 ? torch_ms / ms : 0});
}

// Random logits normal(0, 2), generated on the device (no host RNG time on the lease).
void* random_device_logits(int64_t T, int64_t V, DType dt, uint64_t seed) {
  const size_t n = static_cast<size_t>(T * V);
  void* d = nullptr;
  ok(cudaMalloc(&d, n * (dt == DType::F32 ? 4 : 2)), "malloc logits");
  arpo::cuda::fill_normal(d, dt, static_cast<int64_t>(n), 2.0f, seed, nullptr);
  ok(cudaDeviceSynchronize(), "fill_normal");
  return d;
}

template <typename T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  ok(cudaMalloc(&d, std::max<size_t>(1, h.size()) * sizeof(T)), "malloc");
  ok(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return d;
}

void measure_copy(int64_t bytes) {
  void *a = nullptr, *b = nullptr;
  ok(cudaMalloc(&a, bytes), "malloc");
  ok(cudaMalloc(&b, bytes), "malloc");
  ok(cudaMemset(a, 1, bytes), "memset");
  const double ms = time_ms([&] { arpo::cuda::copy_baseline(b, a, bytes, nullptr); }, 3, 20);
  copy_gbps = 2.0 * bytes / (ms * 1e-3) / 1e9;  // bytes read + bytes written
  table.push_back({"copy (D2D)", std::to_string(bytes >> 20) + " MiB", ms, copy_gbps, 100.0, 0});
  cudaFree(a);
  cudaFree(b);
}

// ---------------------------------------------------------------- stats
void bench_stats(int64_t T, int64_t V, DType dt, bool full) {
  void* d = random_device_logits(T, V, dt, 7 + T);
  Logits lg{d, dt, T, V};
  std::vector<int32_t> tg(T);
  for (int64_t t = 0; t < T; ++t) tg[t] = static_cast<int32_t>((t * 7919) % V);
  int32_t* d_tg = upload(tg);
  float *lse, *ent, *tlp;
  ok(cudaMalloc(&lse, T * 4), "malloc");
  ok(cudaMalloc(&ent, T * 4), "malloc");
  ok(cudaMalloc(&tlp, T * 4), "malloc");
  auto run = [&] { arpo::cuda::logits_stats(lse, ent, nullptr, tlp, lg, d_tg, 1.0f, nullptr); };
  const std::string shape = std::to_string(T) + "x" + std::to_string(V) + (dt == DType::F32 ? " f32" : " bf16");
  const double bytes = static_cast<double>(T) * V * (dt == DType::F32 ? 4 : 2);
  double torch_ms = 0;
#ifdef ARPO_HAVE_TORCH_BENCH
  {
    auto opts = torch::TensorOptions().device(torch::kCUDA);
    auto x = torch::from_blob(d, {T, V}, opts.dtype(dt == DType::F32 ? torch::kFloat32 : torch::kBFloat16));
    auto targets = torch::from_blob(d_tg, {T}, opts.dtype(torch::kInt32)).to(torch::kInt64);
    // verl's composition: log_softmax in float32, gather, entropy from softmax.
    auto torch_stats = [&](const torch::Tensor& z) {
      auto lsm = torch::log_softmax(z, -1);
      auto lse_t = torch::logsumexp(z, -1);
      auto ent_t = -(lsm.exp() * lsm).sum(-1);
      auto tlp_t = lsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
      return std::vector<torch::Tensor>{lse_t, ent_t, tlp_t};
    };
    torch::NoGradGuard ng;
    run();
    auto ref = torch_stats(x.to(torch::kFloat64));
    auto ours = std::vector<torch::Tensor>{torch::from_blob(lse, {T}, opts.dtype(torch::kFloat32)),
                                           torch::from_blob(ent, {T}, opts.dtype(torch::kFloat32)),
                                           torch::from_blob(tlp, {T}, opts.dtype(torch::kFloat32))};
    const char* names[] = {"logsumexp", "entropy", "target_logprob"};
    for (int i = 0; i < 3; ++i) {
      const double err = ((ours[i].to(torch::kFloat64) - ref[i]).norm() / ref[i].norm()).item<double>();
      expect(err < 1e-5, "stats " + shape + " " + names[i] + " vs float64 libtorch: rel err " + std::to_string(err));
    }
    if (full) torch_ms = time_ms([&] { torch_stats(x.to(torch::kFloat32)); }, 2, 10);
  }
#endif
  if (full) {
    const double ms = time_ms(run, 3, 20);
    add_row("logits_stats", shape, ms, bytes, torch_ms);
  } else {
    run();
    std::vector<float> h(T);
    ok(cudaMemcpy(h.data(), lse, T * 4, cudaMemcpyDeviceToHost), "download");
    expect(std::all_of(h.begin(), h.end(), [](float v) { return std::isfinite(v); }), "stats " + shape + " finite");
  }
  cudaFree(d);
  cudaFree(d_tg);
  cudaFree(lse);
  cudaFree(ent);
  cudaFree(tlp);
}

// ---------------------------------------------------------------- loss
void bench_loss(int64_t T, int64_t V, DType dt, bool full, const std::string& label) {
  void* d = random_device_logits(T, V, dt, 11 + T);
  Logits lg{d, dt, T, V};
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int32_t> tg(T), seq(T);
  std::vector<float> mask(T), adv(T), old(T);
  for (int64_t t = 0; t < T; ++t) {
    tg[t] = static_cast<int32_t>((t * 7919) % V);
    seq[t] = static_cast<int32_t>(t * 8 / T);
    mask[t] = t % 9 == 4 ? 0.0f : 1.0f;
    adv[t] = normal(rng);
    old[t] = -12.5f + 0.3f * normal(rng);  // near log(1/V) for these logits: ratios around 1
  }
  int32_t *d_tg = upload(tg), *d_seq = upload(seq);
  float *d_mask = upload(mask), *d_adv = upload(adv), *d_old = upload(old);
  float* grad = nullptr;
  ok(cudaMalloc(&grad, static_cast<size_t>(T * V) * 4), "malloc grad");
  arpo::kernels::PolicyLossConfig cfg;  // token-mean, dual clip 3, no KL, no entropy bonus (the reference scripts)
  arpo::kernels::PolicyLossResult res;
  auto run = [&] {
    arpo::cuda::policy_loss(&res, grad, nullptr, nullptr, lg, d_tg, d_old, d_adv, d_mask, d_seq, 8, nullptr, cfg, nullptr);
  };
  const std::string shape = std::to_string(T) + "x" + std::to_string(V) + (dt == DType::F32 ? " f32" : " bf16");
  const double bytes = static_cast<double>(T) * V * ((dt == DType::F32 ? 4 : 2) + 4);
  double torch_ms = 0;
#ifdef ARPO_HAVE_TORCH_BENCH
  {
    auto opts = torch::TensorOptions().device(torch::kCUDA);
    auto x = torch::from_blob(d, {T, V}, opts.dtype(dt == DType::F32 ? torch::kFloat32 : torch::kBFloat16));
    auto targets = torch::from_blob(d_tg, {T}, opts.dtype(torch::kInt32)).to(torch::kInt64);
    auto A = torch::from_blob(d_adv, {T}, opts.dtype(torch::kFloat32));
    auto old_lp = torch::from_blob(d_old, {T}, opts.dtype(torch::kFloat32));
    auto m = torch::from_blob(d_mask, {T}, opts.dtype(torch::kFloat32));
    // verl compute_policy_loss (vanilla) + token-mean agg_loss, with autograd.
    auto torch_loss = [&](torch::Tensor logits) {
      auto leaf = logits.detach().requires_grad_(true);
      auto lsm = torch::log_softmax(leaf, -1);
      auto logp = lsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
      auto old_c = old_lp.to(logp.scalar_type()), A_c = A.to(logp.scalar_type()), m_c = m.to(logp.scalar_type());
      auto ratio = torch::exp(torch::clamp(logp - old_c, -20.0, 20.0));
      auto pg1 = -A_c * ratio, pg2 = -A_c * torch::clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
      auto clipped = torch::maximum(pg1, pg2);
      auto pg3 = -A_c * cfg.dual_clip_c;
      auto pg = torch::where(A_c < 0, torch::minimum(pg3, clipped), clipped);
      auto loss = (pg * m_c).sum() / m_c.sum();
      loss.backward();
      return std::make_pair(loss, leaf.grad());
    };
    run();
    auto ref = torch_loss(x.to(torch::kFloat64));
    const double loss_err = std::fabs(res.loss - ref.first.item<double>()) / std::max(1e-12, std::fabs(ref.first.item<double>()));
    expect(loss_err < 1e-4, "loss " + shape + " vs float64 libtorch autograd: rel err " + std::to_string(loss_err));
    auto g = torch::from_blob(grad, {T, V}, opts.dtype(torch::kFloat32)).to(torch::kFloat64);
    const double gerr = ((g - ref.second).norm() / ref.second.norm()).item<double>();
    expect(gerr < 1e-4, "loss " + shape + " grad vs float64 libtorch autograd: rel err " + std::to_string(gerr));
    if (full) torch_ms = time_ms([&] { torch_loss(x.to(torch::kFloat32)); }, 2, 10);
  }
#endif
  if (full) {
    const double ms = time_ms(run, 3, 20);
    add_row("policy_loss" + label, shape, ms, bytes, torch_ms);
  } else {
    run();
    expect(std::isfinite(res.loss) && res.tokens > 0, "loss " + shape + " finite");
  }
  cudaFree(d);
  cudaFree(grad);
  cudaFree(d_tg);
  cudaFree(d_seq);
  cudaFree(d_mask);
  cudaFree(d_adv);
  cudaFree(d_old);
}

}  // namespace

int main(int argc, char** argv) {
  const bool full = argc > 1 && std::strcmp(argv[1], "--bench") == 0;
  if (!arpo::cuda::available()) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0), "props");
  std::printf("device: %s, %d SMs, L2 %d MB%s\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
#ifdef ARPO_HAVE_TORCH_BENCH
              ", libtorch comparison ON"
#else
              ", libtorch comparison OFF (built without a CUDA libtorch)"
#endif
  );
  try {
    if (!full) {
      bench_stats(64, 151936, DType::F32, false);
      bench_stats(64, 151936, DType::BF16, false);
      bench_loss(64, 151936, DType::F32, false, "");
      bench_loss(64, 151936, DType::BF16, false, "");
      std::printf("%d failed\n", failures);
      return failures == 0 ? 0 : 1;
    }
    measure_copy(int64_t{1} << 31);
    const int64_t V = 151936;
    bench_stats(4096, V, DType::F32, true);
    bench_stats(4096, V, DType::BF16, true);
    bench_stats(16, V, DType::BF16, true);  // decode-sized batch: clusters of 8
    bench_loss(2048, V, DType::F32, true, "");
    bench_loss(2048, V, DType::BF16, true, "");
    // Sweep of the launch geometry (threads, cluster, blocks/SM) for the loss and stats.
    using arpo::cuda::Tuning;
    for (const Tuning& t : {Tuning{0, 0, 512, 8, 1}, Tuning{0, 0, 512, 8, 3}, Tuning{0, 0, 1024, 8, 1},
                            Tuning{0, 0, 256, 4, 4}, Tuning{0, 0, 512, 1, 0}}) {
      arpo::cuda::set_tuning(t);
      bench_loss(2048, V, DType::F32, true,
                 " [t" + std::to_string(t.loss_threads) + " c" + std::to_string(t.loss_cluster) + " b" +
                     std::to_string(t.loss_blocks_per_sm) + "]");
    }
    for (const Tuning& t : {Tuning{256, 1, 0, 0, 0}, Tuning{1024, 1, 0, 0, 0}, Tuning{512, 2, 0, 0, 0}}) {
      arpo::cuda::set_tuning(t);
      bench_stats(4096, V, DType::BF16, true);
      table.back().kernel += " [t" + std::to_string(t.stats_threads) + " c" + std::to_string(t.stats_cluster) + "]";
    }
    arpo::cuda::set_tuning(Tuning{});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("\n%-34s %-20s %9s %9s %8s %9s\n", "kernel", "shape", "ms", "GB/s", "%copy", "x torch");
  for (const Row& r : table)
    std::printf("%-34s %-20s %9.3f %9.1f %7.1f%% %9s\n", r.kernel.c_str(), r.shape.c_str(), r.ms, r.gbps, r.pct_copy,
                r.speedup > 0 ? (std::to_string(r.speedup).substr(0, 5) + "x").c_str() : "-");
  std::printf("%d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
