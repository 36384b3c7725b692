// Kernel benchmark (issue 8): arpo's fused CPU kernels against the same
// computation composed from libtorch operations, and against a plain sum over
// the same bytes (the memory-bandwidth yardstick). Prints one JSON object.
//
//   kernels_bench time [--quick] [--threads N] [--reps R]
//       every shape: correctness check against libtorch first, then interleaved
//       repetitions (sum, fused, libtorch, sum, fused, ...) -> median, min, max.
//   kernels_bench mem <op> <T> <V> <f32|bf16> [--threads N]
//       one op once in this (fresh) process: peak extra memory = peak RSS after
//       the op - peak RSS before it (inputs allocated and touched, libtorch and
//       the thread pool warmed up on a tiny input first, so code pages and
//       thread stacks are not counted; peak = VmHWM of this process image). ops: stats, stats_torch, loss (separate
//       float32 gradient buffer), loss_inplace (gradient written over the f32
//       logits), loss_torch (autograd), sum.
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kernels/kernels.h"

namespace K = arpo::kernels;

namespace {

// ---------------------------------------------------------------- inputs
// Logits ~ scale * (sum of 4 uniforms - 2) * sqrt(3): roughly normal with
// standard deviation `scale`, generated fast enough for 600M entries.
struct Lcg {
  uint64_t s;
  explicit Lcg(uint64_t seed) : s(seed * 6364136223846793005ull + 1442695040888963407ull) {}
  double uniform() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(s >> 11) * (1.0 / 9007199254740992.0);
  }
};

uint16_t to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// One (T, V) logits buffer plus the per-token inputs of the loss.
struct Inputs {
  int64_t T, V;
  K::DType dtype;
  std::vector<float> f32;       // (T, V) when dtype == F32
  std::vector<uint16_t> bf16;   // (T, V) when dtype == BF16
  std::vector<int32_t> targets; // (T)
  std::vector<float> old_lp, adv, mask;
  const void* data() const { return dtype == K::DType::F32 ? static_cast<const void*>(f32.data()) : bf16.data(); }
  int64_t bytes() const { return T * V * (dtype == K::DType::F32 ? 4 : 2); }
  K::Logits logits() const { return K::Logits{data(), dtype, T, V}; }
  torch::Tensor tensor() const {
    return dtype == K::DType::F32 ? torch::from_blob(const_cast<float*>(f32.data()), {T, V}, torch::kFloat32)
                                  : torch::from_blob(const_cast<uint16_t*>(bf16.data()), {T, V}, torch::kBFloat16);
  }
};

Inputs make_inputs(int64_t T, int64_t V, K::DType dtype, uint64_t seed) {
  Inputs in{T, V, dtype, {}, {}, {}, {}, {}, {}};
  Lcg r(seed);
  const double scale = 3.0 * std::sqrt(3.0);
  auto draw = [&] { return static_cast<float>(scale * (r.uniform() + r.uniform() + r.uniform() + r.uniform() - 2.0)); };
  if (dtype == K::DType::F32) {
    in.f32.resize(static_cast<size_t>(T * V));
    for (auto& v : in.f32) v = draw();
  } else {
    in.bf16.resize(static_cast<size_t>(T * V));
    for (auto& v : in.bf16) v = to_bf16(draw());
  }
  for (int64_t t = 0; t < T; ++t) {
    in.targets.push_back(static_cast<int32_t>(r.uniform() * static_cast<double>(V)) % static_cast<int32_t>(V));
    // old logprobs near a typical target logprob (-log V +- noise) so ratios straddle the clip range
    in.old_lp.push_back(static_cast<float>(-std::log(static_cast<double>(V)) - 4.0 + 2.0 * (r.uniform() - 0.5)));
    in.adv.push_back(static_cast<float>(2.0 * (r.uniform() - 0.5)));
    in.mask.push_back(r.uniform() < 0.9 ? 1.0f : 0.0f);
  }
  if (T > 0) in.mask[0] = 1.0f;  // at least one token counted
  return in;
}

// ---------------------------------------------------------------- the computations
struct StatsOut {
  std::vector<float> lse, ent, norm, logp;
  explicit StatsOut(int64_t T) : lse(T), ent(T), norm(T), logp(T) {}
};

void fused_stats(StatsOut& o, const Inputs& in, int threads) {
  K::logits_stats(o.lse.data(), o.ent.data(), o.norm.data(), o.logp.data(), in.logits(), in.targets.data(), 1.0f, threads);
}

// What a user writes in libtorch for the same four statistics (temperature 1).
struct TorchStats {
  torch::Tensor lse, ent, logp;
};
TorchStats torch_stats(const Inputs& in, const torch::Tensor& idx) {
  torch::NoGradGuard no_grad;
  auto z = in.tensor().to(torch::kFloat32);  // no-op for float32
  auto lp = torch::log_softmax(z, -1);
  TorchStats s;
  s.lse = torch::logsumexp(z, -1);
  s.ent = -(lp.exp() * lp).sum(-1);
  s.logp = lp.gather(1, idx).squeeze(1);
  return s;
}

double plain_sum(const Inputs& in, int threads) {
  // Same bytes as the logits, read as floats (a bf16 buffer is T*V/2 floats).
  return K::plain_sum(static_cast<const float*>(in.data()), in.bytes() / 4, threads);
}

K::PolicyLossConfig loss_config() {
  K::PolicyLossConfig c;  // verl defaults + DAPO clip-higher, as the demo trains
  c.clip_low = 0.2f;
  c.clip_high = 0.28f;
  c.dual_clip_c = 3.0f;
  return c;
}

K::PolicyLossResult fused_loss(float* grad, const Inputs& in, int threads) {
  K::PolicyLossResult r;
  K::policy_loss(&r, grad, nullptr, nullptr, in.logits(), in.targets.data(), in.old_lp.data(), in.adv.data(), in.mask.data(),
                 nullptr, 1, nullptr, loss_config(), threads);
  return r;
}

// verl's compute_policy_loss (dual clip) + token-mean agg_loss, composed in
// libtorch with autograd; returns (loss, d loss / d logits).
std::pair<double, torch::Tensor> torch_loss(const Inputs& in, const torch::Tensor& idx) {
  const K::PolicyLossConfig c = loss_config();
  auto x = in.tensor().detach().requires_grad_(true);
  auto logp_all = torch::log_softmax(x.to(torch::kFloat32), -1);
  auto logp = logp_all.gather(1, idx).squeeze(1);
  auto old = torch::from_blob(const_cast<float*>(in.old_lp.data()), {in.T}, torch::kFloat32);
  auto A = torch::from_blob(const_cast<float*>(in.adv.data()), {in.T}, torch::kFloat32);
  auto mask = torch::from_blob(const_cast<float*>(in.mask.data()), {in.T}, torch::kFloat32);
  auto ratio = torch::exp(torch::clamp(logp - old, -20.0, 20.0));
  auto pg1 = -A * ratio;
  auto pg2 = -A * torch::clamp(ratio, 1.0 - c.clip_low, 1.0 + c.clip_high);
  auto clip1 = torch::maximum(pg1, pg2);
  auto pg = torch::where(A < 0, torch::minimum(-A * c.dual_clip_c, clip1), clip1);
  auto loss = (pg * mask).sum() / mask.sum();
  loss.backward();
  return {loss.item<double>(), x.grad()};
}

// ---------------------------------------------------------------- timing
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Series {
  std::vector<double> ms;
  double median() const {
    std::vector<double> s = ms;
    std::sort(s.begin(), s.end());
    const size_t n = s.size();
    return n == 0 ? 0 : (n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]));
  }
  double min() const { return ms.empty() ? 0 : *std::min_element(ms.begin(), ms.end()); }
  double max() const { return ms.empty() ? 0 : *std::max_element(ms.begin(), ms.end()); }
};

// A timed candidate: `inner` calls per sample, so one sample lasts >= ~5 ms
// even for T = 1 (the clock's resolution stops mattering).
struct Candidate {
  std::string name;
  std::function<void()> fn;
  int inner = 1;
  Series series;
};

void calibrate(Candidate& c) {
  c.fn();  // warm-up (page faults, thread start)
  const double t0 = now_ms();
  c.fn();
  const double one = std::max(1e-4, now_ms() - t0);
  c.inner = static_cast<int>(std::min(2000.0, std::max(1.0, std::ceil(5.0 / one))));
}

// Interleaved repetitions: every round runs each candidate once in turn, so a
// burst of load from other processes hits all of them alike.
void run_interleaved(std::vector<Candidate>& cs, int reps) {
  for (auto& c : cs) calibrate(c);
  for (int r = 0; r < reps; ++r)
    for (auto& c : cs) {
      const double t0 = now_ms();
      for (int i = 0; i < c.inner; ++i) c.fn();
      c.series.ms.push_back((now_ms() - t0) / c.inner);
    }
}

std::string series_json(const Series& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "{\"median\":%.6g,\"min\":%.6g,\"max\":%.6g,\"n\":%zu}", s.median(), s.min(), s.max(), s.ms.size());
  return buf;
}

const char* dtype_name(K::DType d) { return d == K::DType::F32 ? "f32" : "bf16"; }

// Max |a - b| / (atol + rtol |b|): <= 1 passes (STYLE.md tolerance rule).
double worst(const float* a, const torch::Tensor& b_in, double atol, double rtol) {
  auto b = b_in.to(torch::kFloat64).contiguous();
  const double* pb = b.data_ptr<double>();
  double w = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - pb[i]);
    w = std::max(w, d / (atol + rtol * std::fabs(pb[i])));
    if (std::isnan(a[i]) != std::isnan(pb[i])) w = 1e30;
  }
  return w;
}

std::string bench_stats(int64_t T, int64_t V, K::DType dt, int threads, int reps) {
  const Inputs in = make_inputs(T, V, dt, static_cast<uint64_t>(T * 31 + V));
  torch::set_num_threads(threads);
  auto idx = torch::from_blob(const_cast<int32_t*>(in.targets.data()), {T}, torch::kInt32).to(torch::kInt64).unsqueeze(1);
  StatsOut out(T);
  // Correctness first: the fused statistics against libtorch's.
  fused_stats(out, in, threads);
  const TorchStats ref = torch_stats(in, idx);
  const double tol_err = std::max({worst(out.lse.data(), ref.lse, 1e-4, 1e-5), worst(out.ent.data(), ref.ent, 1e-3, 1e-4),
                                   worst(out.logp.data(), ref.logp, 1e-4, 1e-5)});
  volatile double sink = 0;
  std::vector<Candidate> cs;
  cs.push_back({"sum", [&] { sink = sink + plain_sum(in, threads); }});
  cs.push_back({"fused", [&] { fused_stats(out, in, threads); }});
  cs.push_back({"torch", [&] { (void)torch_stats(in, idx); }});
  run_interleaved(cs, reps);
  char head[256];
  std::snprintf(head, sizeof head, "{\"T\":%lld,\"V\":%lld,\"dtype\":\"%s\",\"threads\":%d,\"bytes\":%lld,\"check\":%.4g,",
                static_cast<long long>(T), static_cast<long long>(V), dtype_name(dt), threads, static_cast<long long>(in.bytes()), tol_err);
  return std::string(head) + "\"sum\":" + series_json(cs[0].series) + ",\"fused\":" + series_json(cs[1].series) +
         ",\"torch\":" + series_json(cs[2].series) + "}";
}

std::string bench_loss(int64_t T, int64_t V, K::DType dt, int threads, int reps) {
  const Inputs in = make_inputs(T, V, dt, static_cast<uint64_t>(T * 37 + V));
  torch::set_num_threads(threads);
  auto idx = torch::from_blob(const_cast<int32_t*>(in.targets.data()), {T}, torch::kInt32).to(torch::kInt64).unsqueeze(1);
  std::vector<float> grad(static_cast<size_t>(T * V));
  // Correctness first: loss and every gradient entry against autograd.
  const K::PolicyLossResult r = fused_loss(grad.data(), in, threads);
  const auto ref = torch_loss(in, idx);
  // Gradient entries are ~p_j A / tokens; bf16 autograd rounds its gradient to bf16 (relative 2^-8).
  const double rtol = dt == K::DType::F32 ? 1e-3 : 1e-2;
  const double atol = 1e-6 / static_cast<double>(std::max<int64_t>(1, T));
  const double err = std::max(std::fabs(r.loss - ref.first) / (1e-6 + 1e-4 * std::fabs(ref.first)),
                              worst(grad.data(), ref.second.reshape({-1}), atol, rtol));
  volatile double sink = 0;
  std::vector<Candidate> cs;
  cs.push_back({"sum", [&] { sink = sink + plain_sum(in, threads); }});
  cs.push_back({"fused", [&] { sink = sink + fused_loss(grad.data(), in, threads).loss; }});
  cs.push_back({"torch", [&] { sink = sink + torch_loss(in, idx).first; }});
  run_interleaved(cs, reps);
  char head[256];
  std::snprintf(head, sizeof head, "{\"T\":%lld,\"V\":%lld,\"dtype\":\"%s\",\"threads\":%d,\"bytes\":%lld,\"check\":%.4g,",
                static_cast<long long>(T), static_cast<long long>(V), dtype_name(dt), threads, static_cast<long long>(in.bytes()), err);
  return std::string(head) + "\"sum\":" + series_json(cs[0].series) + ",\"fused\":" + series_json(cs[1].series) +
         ",\"torch\":" + series_json(cs[2].series) + "}";
}

struct Shape {
  int64_t T, V;
  K::DType dt;
};

int time_mode(bool quick, int threads, int reps) {
  const int64_t Vs[] = {32000, 151936};
  std::vector<Shape> stats, loss;
  const std::vector<int64_t> Ts = quick ? std::vector<int64_t>{1, 256, 1024} : std::vector<int64_t>{1, 16, 256, 1024, 4096};
  for (const K::DType dt : {K::DType::F32, K::DType::BF16})
    for (const int64_t V : Vs)
      for (const int64_t T : Ts) {
        if (quick && T == 1024 && !(V == 151936 && dt == K::DType::F32)) continue;
        stats.push_back({T, V, dt});
        // The libtorch autograd composition holds ~5 (T, V) float32 buffers: cap
        // the loss shapes at 1024 x 151,936 (~3 GB for libtorch) on this machine.
        if (T * V <= 1024 * 151936 && T > 1) loss.push_back({T, V, dt});
      }
  std::printf("{\"torch_version\":\"%s\",\"hardware_threads\":%u,\"reps\":%d,\"stats\":[", TORCH_VERSION,
              std::thread::hardware_concurrency(), reps);
  bool first = true;
  for (const Shape& s : stats) {
    std::printf("%s%s", first ? "" : ",", bench_stats(s.T, s.V, s.dt, threads, reps).c_str());
    std::fflush(stdout);
    first = false;
  }
  std::printf("],\"loss\":[");
  first = true;
  for (const Shape& s : loss) {
    std::printf("%s%s", first ? "" : ",", bench_loss(s.T, s.V, s.dt, threads, reps).c_str());
    std::fflush(stdout);
    first = false;
  }
  std::printf("]}\n");
  return 0;
}

// ---------------------------------------------------------------- peak memory
// Peak RSS of this process image in KiB: VmHWM (the high-water mark of this
// address space, fresh at exec), not ru_maxrss, which Linux carries over from
// the parent across fork + exec (a big parent would hide the op's peak).
long maxrss_kb() {
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long kb = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::strncmp(line, "VmHWM:", 6) == 0) kb = std::strtol(line + 6, nullptr, 10);
    std::fclose(f);
    if (kb >= 0) return kb;
  }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

int mem_mode(const std::string& op, int64_t T, int64_t V, K::DType dt, int threads) {
  Inputs in = make_inputs(T, V, dt, 7);
  torch::set_num_threads(threads);
  auto idx = torch::from_blob(in.targets.data(), {T}, torch::kInt32).to(torch::kInt64).unsqueeze(1);
  // Warm-up on a tiny input: libtorch's code pages and pools, the kernel's threads.
  {
    const Inputs tiny = make_inputs(2, 64, dt, 3);
    auto tidx = torch::from_blob(const_cast<int32_t*>(tiny.targets.data()), {2}, torch::kInt32).to(torch::kInt64).unsqueeze(1);
    StatsOut o(2);
    std::vector<float> g(2 * 64);
    fused_stats(o, tiny, threads);
    (void)fused_loss(g.data(), tiny, threads);
    (void)torch_stats(tiny, tidx);
    (void)torch_loss(tiny, tidx);
  }
  volatile double sink = 0;
  const long before = maxrss_kb();
  if (op == "stats") {
    StatsOut o(T);
    fused_stats(o, in, threads);
    sink = sink + o.lse[0];
  } else if (op == "stats_torch") {
    sink = sink + torch_stats(in, idx).lse.sum().item<double>();
  } else if (op == "loss") {
    std::vector<float> grad(static_cast<size_t>(T * V));  // the gradient output, (T, V) float32
    sink = sink + fused_loss(grad.data(), in, threads).loss + grad[0];
  } else if (op == "loss_inplace") {
    if (dt != K::DType::F32) throw K::Error("loss_inplace needs float32 logits (the gradient overwrites them)");
    sink = sink + fused_loss(in.f32.data(), in, threads).loss;
  } else if (op == "loss_torch") {
    auto r = torch_loss(in, idx);
    sink = sink + r.first + r.second.sum().item<double>();
  } else if (op == "sum") {
    sink = sink + plain_sum(in, threads);
  } else {
    throw K::Error("unknown op " + op + " (stats, stats_torch, loss, loss_inplace, loss_torch, sum)");
  }
  const long after = maxrss_kb();
  std::printf("{\"op\":\"%s\",\"T\":%lld,\"V\":%lld,\"dtype\":\"%s\",\"logits_bytes\":%lld,\"before_kb\":%ld,\"after_kb\":%ld,\"extra_bytes\":%lld}\n",
              op.c_str(), static_cast<long long>(T), static_cast<long long>(V), dtype_name(dt), static_cast<long long>(in.bytes()), before, after,
              static_cast<long long>(after - before) * 1024);
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: kernels_bench time [--quick] [--threads N] [--reps R]\n"
               "       kernels_bench mem <stats|stats_torch|loss|loss_inplace|loss_torch|sum> <T> <V> <f32|bf16> [--threads N]\n");
  return 2;
}

int64_t positive(const char* s, const char* name) {
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (!end || *end || v < 1) throw K::Error(std::string("expected a positive integer for ") + name + " but received " + s);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) return usage();
    const std::string mode = argv[1];
    bool quick = false;
    int threads = 1, reps = 0;
    std::vector<std::string> pos;
    for (int i = 2; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--quick") quick = true;
      else if (a == "--threads" && i + 1 < argc) threads = static_cast<int>(positive(argv[++i], "--threads"));
      else if (a == "--reps" && i + 1 < argc) reps = static_cast<int>(positive(argv[++i], "--reps"));
      else pos.push_back(a);
    }
    if (mode == "time") return time_mode(quick, threads, reps > 0 ? reps : (quick ? 5 : 9));
    if (mode == "mem" && pos.size() == 4) {
      if (pos[3] != "f32" && pos[3] != "bf16") throw K::Error("expected f32 or bf16 for dtype but received " + pos[3]);
      return mem_mode(pos[0], positive(pos[1].c_str(), "T"), positive(pos[2].c_str(), "V"), pos[3] == "f32" ? K::DType::F32 : K::DType::BF16, threads);
    }
    return usage();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernels_bench: %s\n", e.what());
    return 1;
  }
}
