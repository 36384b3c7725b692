// logits_stats and sample_tokens against plain double references: odd and
// full-vocabulary shapes, bf16, extreme logits, thread-count independence,
// Gumbel-max sampling (exact token vs an unpruned reference, frequencies vs
// softmax), top-k / top-p sets, greedy, and argument errors.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/kernels.h"
#include "kernels/rng.h"
#include "test_util.h"

using namespace arpo::kernels;
using arpo_test::kInf;
using arpo_test::kInfF;
using arpo_test::Random;

namespace {

struct StatsOut {
  std::vector<float> lse, ent, norm, logp;
  explicit StatsOut(int64_t T) : lse(T), ent(T), norm(T), logp(T) {}
};

StatsOut run_stats(const void* data, DType dt, int64_t T, int64_t V, const std::vector<int32_t>& targets, float temp,
                   int threads) {
  StatsOut o(T);
  Logits lg{data, dt, T, V};
  logits_stats(o.lse.data(), o.ent.data(), o.norm.data(), o.logp.data(), lg, targets.data(), temp, threads);
  return o;
}

// Compares the kernel with the reference on float values x (already the
// values the kernel sees, i.e. bf16-rounded when dt is BF16).
void check_stats(const std::string& name, const std::vector<float>& x, const void* data, DType dt, int64_t T, int64_t V,
                 float temp, double atol, double rtol) {
  Random r(7);
  std::vector<int32_t> targets(T);
  for (int64_t t = 0; t < T; ++t) targets[t] = t % 5 == 4 ? -1 : static_cast<int32_t>(r.integer(0, V - 1));
  const StatsOut o = run_stats(data, dt, T, V, targets, temp, 2);
  std::vector<double> lse(T), ent(T), norm(T), logp(T);
  for (int64_t t = 0; t < T; ++t) {
    const auto ref = arpo_test::ref_row(x.data() + t * V, V, temp);
    lse[t] = ref.lse;
    ent[t] = ref.entropy;
    norm[t] = V > 1 ? ref.entropy / std::log(static_cast<double>(V)) : 0.0;
    logp[t] = targets[t] < 0 ? 0.0 : ref.logp(targets[t]);
  }
  CHECK_ARRAY(name + " logsumexp", o.lse.data(), lse.data(), T, atol, rtol);
  CHECK_ARRAY(name + " entropy", o.ent.data(), ent.data(), T, atol, rtol);
  CHECK_ARRAY(name + " entropy_norm", o.norm.data(), norm.data(), T, atol, rtol);
  CHECK_ARRAY(name + " target_logprob", o.logp.data(), logp.data(), T, atol, rtol);
}

void test_stats_random() {
  Random r(1);
  for (const float temp : {1.0f, 0.7f}) {
    for (const auto& shape : {std::pair<int64_t, int64_t>{7, 1001}, {3, 151936}, {5, 256}, {4, 17}}) {
      const int64_t T = shape.first, V = shape.second;
      const auto x = arpo_test::random_logits(r, T, V, 3.0);
      const std::string name = "f32 " + std::to_string(T) + "x" + std::to_string(V) + " T=" + std::to_string(temp);
      check_stats(name, x, x.data(), DType::F32, T, V, temp, 2e-5, 2e-5);
      // bf16: the reference runs on the rounded values.
      std::vector<uint16_t> b(x.size());
      std::vector<float> xr(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        b[i] = arpo_test::to_bf16(x[i]);
        xr[i] = arpo_test::from_bf16(b[i]);
      }
      check_stats("bf16 " + name, xr, b.data(), DType::BF16, T, V, temp, 2e-5, 2e-5);
    }
  }
}

void test_stats_extremes() {
  // Rows: +-1e4 spread, sparse -inf, all -inf, one finite value, peaked.
  const int64_t V = 300, T = 5;
  Random r(2);
  std::vector<float> x(T * V);
  for (int64_t j = 0; j < V; ++j) {
    x[0 * V + j] = static_cast<float>(r.uniform() < 0.5 ? 1e4 * r.uniform() : -1e4 * r.uniform());
    x[1 * V + j] = j % 3 == 0 ? -kInfF : static_cast<float>(r.normal());
    x[2 * V + j] = -kInfF;
    x[3 * V + j] = j == 123 ? 5.0f : -kInfF;
    x[4 * V + j] = j == 7 ? 60.0f : static_cast<float>(r.normal());
  }
  check_stats("extremes", x, x.data(), DType::F32, T, V, 1.0f, 2e-5, 2e-5);
  std::vector<int32_t> targets = {0, 0, 5, 123, 3};
  const StatsOut o = run_stats(x.data(), DType::F32, T, V, targets, 1.0f, 1);
  CHECK(o.lse[2] == -kInfF && o.ent[2] == 0.0f && o.logp[2] == -kInfF);  // all -inf row
  CHECK(o.logp[1] == -kInfF);                                            // target at a -inf logit
  CHECK(o.ent[3] == 0.0f && o.logp[3] == 0.0f && o.lse[3] == 5.0f);      // one finite value
  // NaN logits give NaN stats for that row only, no crash.
  x[4 * V + 9] = std::nanf("");
  const StatsOut n = run_stats(x.data(), DType::F32, T, V, targets, 1.0f, 1);
  CHECK(std::isnan(n.lse[4]) && std::isnan(n.ent[4]) && !std::isnan(n.lse[0]));
}

void test_stats_edges_and_threads() {
  // V = 1: entropy 0, normalised entropy 0, logprob 0.
  std::vector<float> one = {2.5f, -1.0f};
  const StatsOut o = run_stats(one.data(), DType::F32, 2, 1, {0, 0}, 1.0f, 1);
  CHECK(o.ent[0] == 0.0f && o.norm[0] == 0.0f && o.logp[1] == 0.0f && o.lse[0] == 2.5f);
  // T = 0 is a no-op (null data allowed).
  logits_stats(nullptr, nullptr, nullptr, nullptr, Logits{nullptr, DType::F32, 0, 10}, nullptr, 1.0f, 0);
  CHECK(true);
  // Threads: every thread count gives bit-identical rows.
  Random r(3);
  const int64_t T = 33, V = 4097;
  const auto x = arpo_test::random_logits(r, T, V, 2.0);
  std::vector<int32_t> tg(T, 11);
  const StatsOut a = run_stats(x.data(), DType::F32, T, V, tg, 0.9f, 1);
  for (int th : {2, 3, 0}) {
    const StatsOut b = run_stats(x.data(), DType::F32, T, V, tg, 0.9f, th);
    CHECK(a.lse == b.lse && a.ent == b.ent && a.logp == b.logp);
  }
  // Errors name the argument and the value.
  float out[2];
  const Logits lg{one.data(), DType::F32, 2, 1};
  CHECK_THROWS(logits_stats(out, nullptr, nullptr, nullptr, lg, nullptr, 0.0f, 1), "temperature must be finite and > 0, got 0");
  CHECK_THROWS(logits_stats(out, nullptr, nullptr, nullptr, lg, nullptr, std::nanf(""), 1), "temperature");
  const int32_t bad[2] = {0, 1};
  CHECK_THROWS(logits_stats(nullptr, nullptr, nullptr, out, lg, bad, 1.0f, 1), "targets[1] = 1 is outside the vocabulary [0, 1)");
  CHECK_THROWS(logits_stats(out, nullptr, nullptr, nullptr, Logits{one.data(), DType::F32, 2, 0}, nullptr, 1.0f, 1), "vocab (V) must be >= 1, got 0");
  CHECK_THROWS(logits_stats(out, nullptr, nullptr, nullptr, Logits{nullptr, DType::F32, 2, 3}, nullptr, 1.0f, 1), "logits data is null");
}

// ---------------------------------------------------------------------------
// Sampling.

struct Draws {
  std::vector<int32_t> tokens;
  std::vector<float> logp, ent;
};
Draws sample(const std::vector<float>& x, int64_t T, int64_t V, const std::vector<uint64_t>& streams,
             const std::vector<int64_t>& pos, SamplingParams p, int threads) {
  Draws d{std::vector<int32_t>(T), std::vector<float>(T), std::vector<float>(T)};
  sample_tokens(d.tokens.data(), d.logp.data(), d.ent.data(), nullptr, Logits{x.data(), DType::F32, T, V}, streams.data(),
                pos.data(), p, threads);
  return d;
}

// Allowed set by brute force: sort z descending, top-k then top-p prefixes
// (ties at each threshold included).
std::vector<bool> ref_allowed(const float* x, int64_t V, const SamplingParams& p) {
  const auto ref = arpo_test::ref_row(x, V, p.temperature);
  std::vector<int64_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ref.z[a] > ref.z[b]; });
  double thr = -kInf;
  if (p.top_k > 0 && p.top_k < V) thr = ref.z[order[p.top_k - 1]];
  if (p.top_p < 1.0f) {
    double total = 0;
    for (int64_t j = 0; j < V; ++j)
      if (ref.z[j] >= thr) total += std::exp(ref.z[j] - ref.max);
    double cum = 0;
    for (int64_t i = 0; i < V; ++i) {
      const int64_t j = order[i];
      if (ref.z[j] < thr) break;
      cum += std::exp(ref.z[j] - ref.max);
      if (cum >= p.top_p * total) {
        thr = ref.z[j];
        break;
      }
    }
  }
  std::vector<bool> ok(V);
  for (int64_t j = 0; j < V; ++j) ok[j] = ref.z[j] >= thr && ref.z[j] != -kInf;
  return ok;
}

// Unpruned Gumbel-max over the allowed set (every token's draw computed):
// the exact token the pruned samplers must give.
int64_t unpruned_token(const std::vector<bool>& ok, const arpo_test::RefRow& ref, uint64_t key, int64_t V) {
  double best = -kInf;
  int64_t tok = -1;
  for (int64_t j = 0; j < V; ++j)
    if (ok[j] && ref.z[j] + arpo::rng::gumbel(key, j) > best) {
      best = ref.z[j] + arpo::rng::gumbel(key, j);
      tok = j;
    }
  return tok;
}

void test_sampling_exact_and_sets() {
  Random r(4);
  const int64_t T = 24, V = 1001;
  const auto x = arpo_test::random_logits(r, T, V, 2.5);
  std::vector<uint64_t> streams(T);
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) {
    streams[t] = 1000 + t % 3;
    pos[t] = 17 * t;
  }
  for (const SamplingParams p : {SamplingParams{1.0f, 0, 1.0f, 42}, SamplingParams{0.8f, 50, 1.0f, 7},
                                 SamplingParams{1.2f, 0, 0.6f, 9}, SamplingParams{1.0f, 20, 0.5f, 11}}) {
    const Draws d = sample(x, T, V, streams, pos, p, 2);
    int wrong = 0, outside = 0;
    for (int64_t t = 0; t < T; ++t) {
      const float* row = x.data() + t * V;
      const auto ok = ref_allowed(row, V, p);
      const auto ref = arpo_test::ref_row(row, V, p.temperature);
      wrong += d.tokens[t] != unpruned_token(ok, ref, arpo::rng::row_key(p.seed, streams[t], pos[t]), V);
      outside += !ok[d.tokens[t]];
      CHECK_CLOSE(d.logp[t], ref.logp(d.tokens[t]), 2e-5, 2e-5);
      CHECK_CLOSE(d.ent[t], ref.entropy, 2e-5, 2e-5);
    }
    CHECK(wrong == 0);
    CHECK(outside == 0);
  }
  // Greedy: argmax with the lowest index on ties; logprob of the temperature-1 distribution.
  std::vector<float> g = x;
  g[3 * V + 10] = g[3 * V + 900] = 100.0f;
  const Draws d = sample(g, T, V, streams, pos, SamplingParams{0.0f, 0, 1.0f, 0}, 1);
  CHECK(d.tokens[3] == 10);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = g.data() + t * V;
    CHECK(d.tokens[t] == std::max_element(row, row + V) - row);
  }
  // Batch composition: the same (seed, stream, position) gives the same token alone or reordered.
  const SamplingParams p{1.0f, 0, 0.9f, 5};
  const Draws all = sample(x, T, V, streams, pos, p, 2);
  bool same = true;
  for (int64_t t = T - 1; t >= 0; --t) {
    std::vector<float> one(x.begin() + t * V, x.begin() + (t + 1) * V);
    const Draws d1 = sample(one, 1, V, {streams[t]}, {pos[t]}, p, 1);
    same = same && d1.tokens[0] == all.tokens[t];
  }
  CHECK(same);
  const Draws all1 = sample(x, T, V, streams, pos, p, 1);
  CHECK(all1.tokens == all.tokens && all1.logp == all.logp);
}

// Frequencies over many positions against softmax (restricted and
// renormalised for top-k): chi-square with V-1 dof must stay under a bound
// that a correct sampler exceeds with probability < 1e-6.
// rng::gumbel_bound_of (the samplers' pruning) is >= gumbel_of at every u
// the hash can give, and within log 2 + 0.1 of it where it prunes (u >= 0.9).
void test_gumbel_bound() {
  int below = 0, loose = 0;
  double worst = -kInf;
  auto check_u = [&](double u) {
    const double g = arpo::rng::gumbel_of(u), b = arpo::rng::gumbel_bound_of(u);
    below += !(b >= g);
    worst = std::max(worst, g - b);
    if (u >= 0.9 && std::isfinite(g)) loose += b - g > 0.7932;
  };
  for (uint64_t key = 0; key < 64; ++key)
    for (int64_t j = 0; j < 20000; ++j) check_u(arpo::rng::uniform(arpo::rng::mix64(key), j));
  // The hash's extremes and every binade of 1 - u: u = (bits + 0.5) 2^-53.
  for (uint64_t bits : {uint64_t{0}, uint64_t{1}, (uint64_t{1} << 52) - 1, uint64_t{1} << 52, (uint64_t{1} << 53) - 2,
                        (uint64_t{1} << 53) - 1})
    check_u((static_cast<double>(bits) + 0.5) * (1.0 / 9007199254740992.0));
  for (int k = 1; k <= 53; ++k)
    for (double m : {1.0, 1.0000001, 1.5, 1.9999999})
      for (double u : {1.0 - std::ldexp(m, -k), std::nextafter(1.0 - std::ldexp(m, -k), 0.0), std::nextafter(1.0 - std::ldexp(m, -k), 2.0)})
        if (u > 0.0 && u < 1.0) check_u(u);
  check_u(0.5);
  check_u(std::nextafter(0.5, 0.0));
  check_u(std::nextafter(0.5, 1.0));
  CHECK(arpo::rng::gumbel_bound_of(1.0) == kInf);
  std::printf("gumbel bound: %d below, %d loose; worst gumbel - bound %.3g\n", below, loose, worst);
  CHECK(below == 0);
  CHECK(loose == 0);
}

// The pruned sampler against the unpruned Gumbel-max at logit scales where
// almost every token competes (0.01), some do (1) and one dominates (30),
// on the demo's vocabulary size, 1 and 3 threads.
void test_sampling_exact_scales() {
  Random r(11);
  const int64_t T = 96, V = 1206;
  std::vector<uint64_t> streams(T);
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) {
    streams[t] = 5000 + 31 * t;
    pos[t] = 3 * t + 1;
  }
  int wrong = 0, rows = 0;
  for (double scale : {0.01, 1.0, 30.0}) {
    const auto x = arpo_test::random_logits(r, T, V, scale);
    for (const SamplingParams p : {SamplingParams{1.0f, 0, 1.0f, 1}, SamplingParams{0.6f, 0, 1.0f, 2},
                                   SamplingParams{1.3f, 40, 0.9f, 3}})
      for (int threads : {1, 3}) {
        const Draws d = sample(x, T, V, streams, pos, p, threads);
        for (int64_t t = 0; t < T; ++t) {
          const float* row = x.data() + t * V;
          const auto ok = ref_allowed(row, V, p);
          const auto ref = arpo_test::ref_row(row, V, p.temperature);
          wrong += d.tokens[t] != unpruned_token(ok, ref, arpo::rng::row_key(p.seed, streams[t], pos[t]), V);
          ++rows;
        }
      }
  }
  std::printf("pruned sampler vs unpruned Gumbel-max: %d of %d rows differ\n", wrong, rows);
  CHECK(wrong == 0);
}

void test_sampling_distribution() {
  const int64_t V = 8, N = 40000;
  const std::vector<float> row = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f, -1.5f, 1.2f, 0.8f};
  for (const SamplingParams p : {SamplingParams{1.0f, 0, 1.0f, 3}, SamplingParams{0.7f, 3, 1.0f, 4}}) {
    std::vector<float> x;
    for (int64_t i = 0; i < N; ++i) x.insert(x.end(), row.begin(), row.end());
    std::vector<uint64_t> streams(N, 77);
    std::vector<int64_t> pos(N);
    std::iota(pos.begin(), pos.end(), 0);
    const Draws d = sample(x, N, V, streams, pos, p, 2);
    const auto ok = ref_allowed(row.data(), V, p);
    const auto ref = arpo_test::ref_row(row.data(), V, p.temperature);
    double mass = 0;
    for (int64_t j = 0; j < V; ++j) mass += ok[j] ? std::exp(ref.logp(j)) : 0.0;
    std::vector<double> count(V, 0.0);
    for (int32_t tk : d.tokens) count[tk] += 1;
    double chi2 = 0;
    int dof = -1, leaked = 0;
    for (int64_t j = 0; j < V; ++j) {
      if (!ok[j]) {
        leaked += count[j] > 0;
        continue;
      }
      const double expect = N * std::exp(ref.logp(j)) / mass;
      chi2 += (count[j] - expect) * (count[j] - expect) / expect;
      ++dof;
    }
    // chi-square 1e-6 quantiles: dof 7 -> 40.5, dof 2 -> 27.6.
    const double bound = dof == 7 ? 40.5 : 27.6;
    std::printf("sampling chi2 = %.2f (dof %d, bound %.1f)\n", chi2, dof, bound);
    CHECK(leaked == 0);
    CHECK(chi2 < bound);
  }
}

void test_sampling_errors() {
  std::vector<float> x(10, 0.0f);
  int32_t tok[2];
  const uint64_t st[2] = {0, 0};
  const int64_t ps[2] = {0, 1};
  const Logits lg{x.data(), DType::F32, 2, 5};
  CHECK_THROWS(sample_tokens(tok, nullptr, nullptr, nullptr, lg, st, ps, SamplingParams{-1.0f, 0, 1.0f, 0}, 1), "temperature must be finite and >= 0");
  CHECK_THROWS(sample_tokens(tok, nullptr, nullptr, nullptr, lg, st, ps, SamplingParams{1.0f, 0, std::nanf(""), 0}, 1), "top_p must be in (0, 1]");
  CHECK_THROWS(sample_tokens(tok, nullptr, nullptr, nullptr, lg, nullptr, ps, SamplingParams{1.0f, 0, 1.0f, 0}, 1), "streams and positions are required");
  x[7] = std::nanf("");
  CHECK_THROWS(sample_tokens(tok, nullptr, nullptr, nullptr, lg, st, ps, SamplingParams{1.0f, 0, 1.0f, 0}, 1), "logits row 1 contains NaN");
}

}  // namespace

int main() {
  test_stats_random();
  test_stats_extremes();
  test_stats_edges_and_threads();
  test_sampling_exact_and_sets();
  test_gumbel_bound();
  test_sampling_exact_scales();
  test_sampling_distribution();
  test_sampling_errors();
  return arpo_test::summary();
}
