// CPU fused logits statistics (logits_stats) and the Gumbel-max sampler
// (sample_tokens), plus plain_sum, the bandwidth baseline they are timed
// against. Fuses scale-by-temperature -> max -> sum-exp -> entropy -> target
// logprob into one read of each row; never materialises softmax or any
// (T, V) temporary.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/parallel.h"
#include "kernels/rng.h"
#include "kernels/row_stats.h"

namespace arpo {
namespace kernels {
namespace detail {

void check_logits(const Logits& logits, const char* op) {
  const std::string o(op);
  if (logits.rows < 0) throw Error(o + ": logits rows (T) must be >= 0, got " + std::to_string(logits.rows));
  if (logits.vocab < 1) throw Error(o + ": logits vocab (V) must be >= 1, got " + std::to_string(logits.vocab));
  if (logits.dtype != DType::F32 && logits.dtype != DType::BF16)
    throw Error(o + ": logits dtype must be F32 (0) or BF16 (1), got " + std::to_string(static_cast<int>(logits.dtype)));
  if (logits.rows > 0 && logits.data == nullptr) throw Error(o + ": logits data is null with T = " + std::to_string(logits.rows));
}

// Rows per thread so that each thread gets at least ~64K logits of work
// (below that, thread start-up costs more than it saves).
inline int32_t row_threads(Threads requested, int64_t T, int64_t V) {
  const int64_t min_rows = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, V));
  return resolve_threads(requested, T, min_rows);
}

}  // namespace detail

using detail::kNegInf;

void logits_stats(float* logsumexp, float* entropy, float* entropy_norm, float* target_logprob,
                  const Logits& logits, const int32_t* targets, float temperature, Threads threads) {
  detail::check_logits(logits, "logits_stats");
  if (!(temperature > 0.0f) || !std::isfinite(temperature))
    throw Error("logits_stats: temperature must be finite and > 0, got " + std::to_string(temperature));
  const int64_t T = logits.rows, V = logits.vocab;
  if (target_logprob && targets) {
    for (int64_t t = 0; t < T; ++t)
      if (targets[t] >= V)
        throw Error("logits_stats: targets[" + std::to_string(t) + "] = " + std::to_string(targets[t]) +
                    " is outside the vocabulary [0, " + std::to_string(V) + ")");
  }
  const float inv_t = 1.0f / temperature;
  const double log_v = std::log(static_cast<double>(V));
  parallel_for(T, detail::row_threads(threads, T, V), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float zt = 0;  // target logit / temperature
      int32_t tgt = (targets && target_logprob) ? targets[t] : -1;
      detail::RowStats st;
      if (logits.dtype == DType::F32) {
        const auto row = detail::f32_row(logits, t);
        st = detail::row_stats(row, V, inv_t);
        if (tgt >= 0) zt = row(tgt) * inv_t;
      } else {
        const auto row = detail::bf16_row(logits, t);
        st = detail::row_stats(row, V, inv_t);
        if (tgt >= 0) zt = row(tgt) * inv_t;
      }
      if (logsumexp) logsumexp[t] = static_cast<float>(st.lse);
      if (entropy) entropy[t] = static_cast<float>(st.entropy);
      if (entropy_norm) entropy_norm[t] = V > 1 ? static_cast<float>(st.entropy / log_v) : 0.0f;
      if (target_logprob) {
        if (tgt < 0) target_logprob[t] = 0.0f;
        else if (zt == kNegInf || st.lse == -HUGE_VAL) target_logprob[t] = kNegInf;
        else target_logprob[t] = static_cast<float>(static_cast<double>(zt) - st.lse);
      }
    }
  });
}

// ---------------------------------------------------------------------------
// Sampling.
namespace {

// Upper bound of rng::gumbel: u <= 1 - 2^-54, so -log(-log u) < 37.43. A
// value z_j with z_j + kGumbelMax <= best cannot win and skips its hash;
// the others are pruned by rng::gumbel_bound_of before their two logs.
constexpr double kGumbelMax = 38.0;

// Per-thread scratch for the top-k / top-p thresholds (O(V) per thread, never (T, V)).
struct Scratch {
  std::vector<float> values;
  std::vector<double> mass;
  std::vector<std::pair<float, int64_t>> candidates;
};

// Threshold of the top-k set: the k-th largest z (ties at it are kept).
template <typename Row>
float top_k_threshold(const Row& row, int64_t V, float inv_t, int32_t k, Scratch& s) {
  s.values.resize(static_cast<size_t>(V));
  for (int64_t j = 0; j < V; ++j) s.values[j] = row(j) * inv_t;
  std::nth_element(s.values.begin(), s.values.begin() + (k - 1), s.values.end(), std::greater<float>());
  return s.values[k - 1];
}

// Threshold of the top-p set among tokens with z >= thr_k: the z of the
// token at which the mass of the tokens sorted by z (descending) first
// reaches top_p of the allowed mass. Instead of sorting V values, bucket
// e_j = exp(z_j - max) by the high 15 bits of its float representation (for
// e >= 0 the bits order like the values, and e is non-decreasing in z, so
// higher buckets hold strictly larger z): walk the bucket masses from the
// top to the bucket where the mass crosses top_p, then sort only that
// bucket's tokens. Same result as a full sort, O(V + buckets + |bucket| log).
constexpr int kMassBuckets = 1 << 15;
template <typename Row>
float top_p_threshold(const Row& row, int64_t V, float inv_t, float m, float thr_k, float top_p, Scratch& s) {
  s.mass.assign(kMassBuckets, 0.0);
  s.values.resize(static_cast<size_t>(V));
  double total = 0;  // allowed mass, relative to exp(m)
  for (int64_t j = 0; j < V; ++j) {
    const float z = row(j) * inv_t;
    float e = -1.0f;  // not allowed
    if (z >= thr_k) {
      float y = z - m;
      y = y < detail::kExpFloor ? detail::kExpFloor : y;
      e = detail::exp_nonpos(y);
      total += e;
      s.mass[detail::bit_cast<uint32_t>(e) >> 16] += e;
    }
    s.values[j] = e;
  }
  const double need = static_cast<double>(top_p) * total;
  double cum = 0;
  int boundary = -1;
  for (int b = kMassBuckets - 1; b >= 0; --b) {
    if (cum + s.mass[b] >= need && s.mass[b] > 0) {
      boundary = b;
      break;
    }
    cum += s.mass[b];
  }
  if (boundary < 0) return thr_k;  // rounding kept need out of reach: keep every allowed token
  s.candidates.clear();
  for (int64_t j = 0; j < V; ++j) {
    const float e = s.values[j];
    if (e >= 0.0f && static_cast<int>(detail::bit_cast<uint32_t>(e) >> 16) == boundary)
      s.candidates.emplace_back(row(j) * inv_t, j);
  }
  std::sort(s.candidates.begin(), s.candidates.end(),
            [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
              return a.first > b.first || (a.first == b.first && a.second < b.second);
            });
  for (const auto& c : s.candidates) {
    cum += s.values[c.second];
    if (cum >= need) return c.first;
  }
  return s.candidates.back().first;
}

template <typename Row>
void sample_row(int32_t* token, float* logprob, float* ent, float* ent_norm, const Row& row, int64_t V, int64_t t,
                const uint64_t* streams, const int64_t* positions, const SamplingParams& p, double log_v, Scratch& s) {
  const bool greedy = p.temperature == 0.0f;
  const float inv_t = greedy ? 1.0f : 1.0f / p.temperature;
  const detail::RowStats st = detail::row_stats(row, V, inv_t);
  if (std::isnan(st.lse) || st.lse == HUGE_VAL)
    throw Error("sample_tokens: logits row " + std::to_string(t) + " contains NaN or +inf");
  int64_t tok = 0;
  if (st.max == kNegInf) {
    tok = 0;  // all -inf: no token has probability; token 0 with logprob -inf
  } else if (greedy) {
    while (row(tok) != st.max) ++tok;  // argmax, lowest index on ties
  } else {
    float thr = kNegInf;
    if (p.top_k > 0 && p.top_k < V) thr = top_k_threshold(row, V, inv_t, p.top_k, s);
    if (p.top_p < 1.0f) thr = top_p_threshold(row, V, inv_t, st.max, thr, p.top_p, s);
    const uint64_t key = rng::row_key(p.seed, streams[t], positions[t]);
    // Start from the argmax so most tokens are pruned by the Gumbel bound.
    int64_t jmax = 0;
    while (row(jmax) * inv_t != st.max) ++jmax;
    double best = static_cast<double>(st.max) + rng::gumbel(key, jmax);
    tok = jmax;
    for (int64_t j = 0; j < V; ++j) {
      const float z = row(j) * inv_t;
      if (z < thr || z == kNegInf || static_cast<double>(z) + kGumbelMax < best) continue;
      const double u = rng::uniform(key, j);
      if (static_cast<double>(z) + rng::gumbel_bound_of(u) < best) continue;  // cannot win: no logs
      const double v = static_cast<double>(z) + rng::gumbel_of(u);
      if (v > best || (v == best && j < tok)) {
        best = v;
        tok = j;
      }
    }
  }
  *token = static_cast<int32_t>(tok);
  if (logprob) {
    const float zt = row(tok) * inv_t;
    *logprob = (zt == kNegInf || st.lse == -HUGE_VAL) ? kNegInf : static_cast<float>(static_cast<double>(zt) - st.lse);
  }
  if (ent) *ent = static_cast<float>(st.entropy);
  if (ent_norm) *ent_norm = V > 1 ? static_cast<float>(st.entropy / log_v) : 0.0f;
}

}  // namespace

void sample_tokens(int32_t* tokens, float* logprobs, float* entropy, float* entropy_norm, const Logits& logits,
                   const uint64_t* streams, const int64_t* positions, const SamplingParams& params, Threads threads) {
  detail::check_logits(logits, "sample_tokens");
  const int64_t T = logits.rows, V = logits.vocab;
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature))
    throw Error("sample_tokens: temperature must be finite and >= 0 (0 = greedy), got " + std::to_string(params.temperature));
  if (!(params.top_p > 0.0f)) throw Error("sample_tokens: top_p must be in (0, 1], got " + std::to_string(params.top_p));
  if (params.temperature > 0.0f && 1.0f / params.temperature == HUGE_VALF)
    throw Error("sample_tokens: temperature " + std::to_string(params.temperature) + " is too small (1/temperature overflows)");
  if (T == 0) return;
  if (!tokens) throw Error("sample_tokens: tokens output is null");
  if (params.temperature > 0.0f && (!streams || !positions))
    throw Error("sample_tokens: streams and positions are required when temperature > 0");
  const double log_v = std::log(static_cast<double>(V));
  parallel_for(T, detail::row_threads(threads, T, V), [&](int64_t b, int64_t e) {
    Scratch s;
    for (int64_t t = b; t < e; ++t) {
      float* lp = logprobs ? logprobs + t : nullptr;
      float* en = entropy ? entropy + t : nullptr;
      float* nn = entropy_norm ? entropy_norm + t : nullptr;
      if (logits.dtype == DType::F32)
        sample_row(tokens + t, lp, en, nn, detail::f32_row(logits, t), V, t, streams, positions, params, log_v, s);
      else
        sample_row(tokens + t, lp, en, nn, detail::bf16_row(logits, t), V, t, streams, positions, params, log_v, s);
    }
  });
}

// ---------------------------------------------------------------------------
// Bandwidth baseline: the same lane/block structure as row_stats with only
// an add per element, so stats/plain_sum isolates the cost of the exp work.
double plain_sum(const float* x, int64_t n, Threads threads) {
  if (n < 0) throw Error("plain_sum: n must be >= 0, got " + std::to_string(n));
  if (n > 0 && !x) throw Error("plain_sum: data is null");
  const int64_t chunk = 1 << 16;
  const int64_t chunks = (n + chunk - 1) / chunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  parallel_for(chunks, resolve_threads(threads, chunks), [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const float* p = x + c * chunk;
      const int64_t len = std::min(chunk, n - c * chunk);
      double total = 0;
      int64_t j = 0;
      for (; j + detail::kBlock <= len; j += detail::kBlock) {
        float ls[detail::kLanes] = {0};
        for (int b2 = 0; b2 < detail::kBlock; b2 += detail::kLanes)
          for (int l = 0; l < detail::kLanes; ++l) ls[l] += p[j + b2 + l];
        double bs = 0;
        for (int l = 0; l < detail::kLanes; ++l) bs += ls[l];
        total += bs;
      }
      for (; j < len; ++j) total += p[j];
      partial[c] = total;
    }
  });
  double total = 0;
  for (double v : partial) total += v;
  return total;
}

}  // namespace kernels
}  // namespace arpo
