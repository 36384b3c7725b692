// Decode-time ops of the policy model on the CPU (kernels.h section 5):
// RMSNorm, rotary embedding and paged single-token attention, each one pass
// over its rows in place of a composition of torch ops.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.h"

namespace arpo {
namespace kernels {
namespace {

template <class T>
void rms_norm_impl(T* out, const T* x, const T* weight, int64_t dim, double eps, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const T* xr = x + r * dim;
    T* o = out + r * dim;
    T ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const T inv = T(1) / std::sqrt(ss / static_cast<T>(dim) + static_cast<T>(eps));
    for (int64_t i = 0; i < dim; ++i) o[i] = weight[i] * (xr[i] * inv);
  }
}

template <class T>
void rope_impl(T* x, const T* cos, const T* sin, int64_t heads, int64_t dim, int64_t begin, int64_t end) {
  const int64_t half = dim / 2;
  for (int64_t r = begin; r < end; ++r) {
    const T* c = cos + r * dim;
    const T* s = sin + r * dim;
    for (int64_t h = 0; h < heads; ++h) {
      T* v = x + (r * heads + h) * dim;
      for (int64_t i = 0; i < half; ++i) {
        const T a = v[i], b = v[i + half];
        v[i] = a * c[i] + (-b) * s[i];
        v[i + half] = b * c[i + half] + a * s[i + half];
      }
    }
  }
}

// 64-byte vectors (GCC/Clang vector extensions: one AVX-512 register, two
// AVX2 or four SSE/NEON ones), for the head-dim loops whose size is a
// multiple of the width: the compiler's own vectoriser picked gathers across
// context positions for these loops (slower than scalar code).
template <class T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(64)));
};
template <class T>
using Vec = typename VecOf<T>::type;
template <class T>
constexpr int64_t kWidth = 64 / sizeof(T);
template <class T>
inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// In-register transpose of a W x W block (W = the vector width): r[i][j] ->
// r[j][i], as log2(W) rounds of swapping the off-diagonal s x s blocks of
// every 2s x 2s block (each round swaps bit s of the row and column index).
// Exact copies, so a tile built this way equals one built element by element.
// __builtin_shufflevector: Clang, and GCC from 12 (older GCC builds tiles
// element by element).
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
template <class T, int S, size_t... J>
inline Vec<T> swap_low(Vec<T> a, Vec<T> b, std::index_sequence<J...>) {
  return __builtin_shufflevector(a, b, static_cast<int>((J & S) ? kWidth<T> + J - S : J)...);
}
template <class T, int S, size_t... J>
inline Vec<T> swap_high(Vec<T> a, Vec<T> b, std::index_sequence<J...>) {
  return __builtin_shufflevector(a, b, static_cast<int>((J & S) ? kWidth<T> + J : J + S)...);
}
template <class T, int S>
inline void transpose_round(Vec<T>* r) {
  constexpr auto idx = std::make_index_sequence<static_cast<size_t>(kWidth<T>)>{};
  for (int64_t i = 0; i < kWidth<T>; ++i) {
    if (i & S) continue;
    const Vec<T> a = r[i], b = r[i + S];
    r[i] = swap_low<T, S>(a, b, idx);
    r[i + S] = swap_high<T, S>(a, b, idx);
  }
}
template <class T>
inline void transpose_block(Vec<T>* r) {
  if constexpr (kWidth<T> >= 16) transpose_round<T, 8>(r);
  transpose_round<T, 4>(r);
  transpose_round<T, 2>(r);
  transpose_round<T, 1>(r);
}
#else
template <class T>
inline void transpose_block(Vec<T>* r) {
  T m[kWidth<T>][kWidth<T>];
  std::memcpy(m, r, sizeof m);
  for (int64_t i = 0; i < kWidth<T>; ++i)
    for (int64_t j = 0; j < kWidth<T>; ++j) r[i][j] = m[j][i];
}
#endif

// Asks for the cache lines of n values at p (no effect on any result).
constexpr int64_t kPrefetch = 24;  // keys ahead in the value sum
template <class T>
inline void prefetch(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < n * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(c + b);
}

// Sum of n terms in 8 interleaved partial sums and a fixed tree (a single
// running sum is one dependent chain); the order depends on n alone. The
// lanes are one 8-wide vector: the compiler left the lane array as 8 scalar
// chains (8% of the kernel's time).
template <class T>
inline T lane_sum(const T* x, int64_t n) {
  constexpr int64_t L = 8;
  typedef T Lanes __attribute__((vector_size(L * sizeof(T))));
  Lanes lane = {};
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    Lanes v;
    std::memcpy(&v, x + j, sizeof v);
    lane += v;
  }
  T tail = 0;
  for (; j < n; ++j) tail += x[j];
  return (((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]))) + tail;
}

// Largest of n terms, in W vector lanes (exact in any order; one running
// maximum is a dependent chain of n compares).
template <class T>
inline T max_of(const T* x, int64_t n) {
  constexpr int64_t L = kWidth<T>;
  Vec<T> lane;
  for (int64_t l = 0; l < L; ++l) lane[l] = -std::numeric_limits<T>::infinity();
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    const Vec<T> v = load(x + j);
    lane = v > lane ? v : lane;
  }
  T mx = -std::numeric_limits<T>::infinity();
  for (; j < n; ++j) mx = x[j] > mx ? x[j] : mx;
  for (int64_t l = 0; l < L; ++l) mx = lane[l] > mx ? lane[l] : mx;
  return mx;
}

// x[j] = exp(x[j] - mx) for n scores of which mx is the largest.
inline void exp_shifted(double* x, int64_t n, double mx) {
  for (int64_t j = 0; j < n; ++j) x[j] = std::exp(x[j] - mx);
}
// float: Cephes' expf as plain arithmetic the compiler vectorises (a libm
// call per score was most of the kernel's time): t = x log2(e) rounded to
// n by adding and subtracting 1.5 * 2^23, r = x - n ln 2 in two parts, a
// degree-5 polynomial, times 2^n built in the exponent bits. Within 1 ulp
// of exp on [-87, 0] (relative error <= 8.4e-8 at 10^7 evenly spaced points
// against the double-precision exp); below -87 (weights under 2^-125 of the
// largest) the result is that of -87.
inline void exp_shifted(float* x, int64_t n, float mx) {
  for (int64_t j = 0; j < n; ++j) {
    float v = x[j] - mx;
    v = v < -87.0f ? -87.0f : v;
    const float fn = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (v - fn * 0.693359375f) - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(fn) + 127) << 23;
    float two_n;
    std::memcpy(&two_n, &bits, sizeof two_n);
    x[j] = p * two_n;
  }
}

// o_h[d] = sum_j (s_h[j] * inv_h) v_j[d], v_j = vpool + slots[j] * stride + at,
// for NH query heads that share these value rows (grouped-query attention)
// and a head dim DC that is a multiple of the vector width: one pass over
// the keys loads each scattered value row once for all NH heads (a pass per
// head re-read it: those loads were the kernel's largest cost). The sums sit
// in local vectors that stay in registers (through o, which may alias the
// pool, they would be stored and reloaded for every j). Keys j = c (mod K)
// go to sum set c, K = 4 / vectors per row (at least 1): K independent FMA
// chains when a row is one or two vectors wide, the sets added in a fixed
// tree at the end. Each head's arithmetic, in order, is that of a pass of
// its own: the same bits whatever NH.
template <class T, int64_t DC, int64_t NH>
inline void weighted_sum(T* const* o, const T* const* s, const T* inv, const T* vpool, const int64_t* slots, int64_t len,
                         int64_t stride, int64_t at) {
  constexpr int64_t n = DC / kWidth<T>, K = n >= 4 ? 1 : 4 / n;
  Vec<T> sum[NH][K][n] = {};
  const T* sh[NH];
  T ih[NH];
  for (int64_t h = 0; h < NH; ++h) {
    sh[h] = s[h];
    ih[h] = inv[h];
  }
  auto add = [&](int64_t c, int64_t j) {
    const T* v = vpool + slots[j] * stride + at;
    Vec<T> row[n];
    for (int64_t i = 0; i < n; ++i) row[i] = load(v + i * kWidth<T>);
    for (int64_t h = 0; h < NH; ++h) {
      const T p = sh[h][j] * ih[h];
      for (int64_t i = 0; i < n; ++i) sum[h][c][i] += p * row[i];
    }
  };
  int64_t j = 0;
  for (; j + K <= len; j += K)
    for (int64_t c = 0; c < K; ++c) {
      // The value rows are scattered pool slots: ask for the row kPrefetch keys on
      // before it is read (the loads of an unfetched row were half the kernel's time).
      if (j + c + kPrefetch < len) prefetch(vpool + slots[j + c + kPrefetch] * stride + at, DC);
      add(c, j + c);
    }
  for (int64_t c = 0; j < len; ++j, ++c) add(c, j);
  for (int64_t h = 0; h < NH; ++h) {
    for (int64_t w = K / 2; w >= 1; w /= 2)
      for (int64_t c = 0; c < w; ++c)
        for (int64_t i = 0; i < n; ++i) sum[h][c][i] += sum[h][c + w][i];
    std::memcpy(o[h], sum[h][0], sizeof sum[h][0]);
  }
}

// The value sums of heads [0, G) sharing one KV head, in passes of up to
// 16 / max(4, vectors per row) heads (the sums must fit the registers).
template <class T, int64_t DC>
inline void weighted_sums(T* const* o, const T* const* s, const T* inv, int64_t G, const T* vpool, const int64_t* slots,
                          int64_t len, int64_t stride, int64_t at) {
  constexpr int64_t n = DC / kWidth<T>, most = 16 / (n > 4 ? n : 4);
  for (int64_t g = 0; g < G; g += most) {
    switch (std::min<int64_t>(most, G - g)) {
      case 1: weighted_sum<T, DC, 1>(o + g, s + g, inv + g, vpool, slots, len, stride, at); break;
      case 2: if constexpr (most >= 2) weighted_sum<T, DC, 2>(o + g, s + g, inv + g, vpool, slots, len, stride, at); break;
      case 3: if constexpr (most >= 3) weighted_sum<T, DC, 3>(o + g, s + g, inv + g, vpool, slots, len, stride, at); break;
      default: if constexpr (most >= 4) weighted_sum<T, DC, 4>(o + g, s + g, inv + g, vpool, slots, len, stride, at); break;
    }
  }
}

template <class T>
void decode_attention_impl(T* out, const T* q, const T* kpool, const T* vpool, const DecodeAttention& a,
                           int64_t begin, int64_t end) {
  constexpr int64_t W = kWidth<T>;
  const int64_t H = a.heads, KVH = a.kv_heads, D = a.head_dim, G = H / KVH;
  const int64_t stride = KVH * D;  // between a slot's rows in the pool
  const int64_t cap = (std::max<int64_t>(a.max_ctx, 1) + W - 1) / W * W;  // a score row, whole tiles
  std::vector<T> scores;
  std::vector<T> tile(static_cast<size_t>(D * W));  // keys j0 .. j0 + W - 1 transposed: tile[d * W + jj]
  std::vector<T> acc(static_cast<size_t>(D));       // a row's value sum when D is not a vector multiple
  std::vector<T> inv(static_cast<size_t>(G));        // per head of the KV head: 1 / its softmax sum
  std::vector<const T*> srow(static_cast<size_t>(G));  // its scores
  std::vector<T*> orow(static_cast<size_t>(G));        // its output row
  const T scale = static_cast<T>(a.scale);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / KVH, kvh = item % KVH;
    const int64_t row0 = a.rows[b], len0 = a.lengths[b], n = a.counts ? a.counts[b] : 1, last = len0 + n - 1;
    if (n < 1 || len0 < 1 || last > a.max_ctx)
      throw Error("paged_decode_attention: group " + std::to_string(b) + " (" + std::to_string(n) + " rows from length " +
                  std::to_string(len0) + ") outside [1, " + std::to_string(a.max_ctx) + "]");
    const int64_t first = a.offsets ? a.offsets[b] : b * a.max_ctx;
    if (a.offsets && (first < 0 || first + last > a.slot_count))
      throw Error("paged_decode_attention: group " + std::to_string(b) + "'s slots [" + std::to_string(first) + ", " +
                  std::to_string(first + last) + ") outside the list of " + std::to_string(a.slot_count));
    const int64_t* sl = a.slots + first;
    // One branch-free pass (it vectorises; a throw per element did not), the
    // offending slot looked up only when there is one.
    bool outside = false;
    for (int64_t j = 0; j < last; ++j) outside |= static_cast<uint64_t>(sl[j]) >= static_cast<uint64_t>(a.pool_slots);
    if (outside)
      for (int64_t j = 0; j < last; ++j)
        if (sl[j] < 0 || sl[j] >= a.pool_slots)
          throw Error("paged_decode_attention: slot " + std::to_string(sl[j]) + " outside the pool of " + std::to_string(a.pool_slots));
    scores.resize(static_cast<size_t>(n * G * cap));
    // Scores a tile of W keys at a time: each (row, head) query times the
    // transposed tile is D vector FMAs giving W scores (the same order for
    // every row, whatever the group's size).
    for (int64_t j0 = 0; j0 < last; j0 += W) {
      const int64_t w = std::min(W, last - j0);
      for (int64_t jj = j0 + W; jj < std::min(last, j0 + 2 * W); ++jj) prefetch(kpool + sl[jj] * stride + kvh * D, D);
      if (D % W == 0) {  // W x W blocks transposed in registers
        for (int64_t d0 = 0; d0 < D; d0 += W) {
          Vec<T> r[W];
          for (int64_t jj = 0; jj < W; ++jj) r[jj] = jj < w ? load(kpool + sl[j0 + jj] * stride + kvh * D + d0) : Vec<T>{};
          transpose_block<T>(r);
          for (int64_t dd = 0; dd < W; ++dd) std::memcpy(tile.data() + (d0 + dd) * W, &r[dd], sizeof r[dd]);
        }
      } else {
        for (int64_t jj = 0; jj < W; ++jj) {
          const T* k = jj < w ? kpool + sl[j0 + jj] * stride + kvh * D : nullptr;
          for (int64_t d = 0; d < D; ++d) tile[d * W + jj] = k ? k[d] : T(0);
        }
      }
      for (int64_t t = 0; t < n; ++t) {
        if (len0 + t <= j0) continue;  // row t sees none of these keys
        for (int64_t g = 0; g < G; ++g) {
          const T* qv = q + ((row0 + t) * H + kvh * G + g) * D;
          // d = c (mod 4) in chain c, the chains added in a fixed tree
          Vec<T> c0 = {}, c1 = {}, c2 = {}, c3 = {};
          int64_t d = 0;
          for (; d + 4 <= D; d += 4) {
            c0 += qv[d] * load(tile.data() + d * W);
            c1 += qv[d + 1] * load(tile.data() + (d + 1) * W);
            c2 += qv[d + 2] * load(tile.data() + (d + 2) * W);
            c3 += qv[d + 3] * load(tile.data() + (d + 3) * W);
          }
          for (; d < D; ++d) c0 += qv[d] * load(tile.data() + d * W);
          Vec<T> acc = ((c0 + c1) + (c2 + c3)) * scale;
          std::memcpy(scores.data() + (t * G + g) * cap + j0, &acc, sizeof acc);
        }
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      const int64_t len = len0 + t;
      for (int64_t g = 0; g < G; ++g) {
        T* s = scores.data() + (t * G + g) * cap;
        exp_shifted(s, len, max_of(s, len));
        inv[g] = T(1) / lane_sum(s, len);
        srow[g] = s;
        orow[g] = out + ((row0 + t) * H + kvh * G + g) * D;
      }
      switch (D % W == 0 ? D : 0) {  // common head dims accumulate in registers, all G heads in one pass
        case 16: weighted_sums<T, 16>(orow.data(), srow.data(), inv.data(), G, vpool, sl, len, stride, kvh * D); break;
        case 32: weighted_sums<T, 32>(orow.data(), srow.data(), inv.data(), G, vpool, sl, len, stride, kvh * D); break;
        case 64: weighted_sums<T, 64>(orow.data(), srow.data(), inv.data(), G, vpool, sl, len, stride, kvh * D); break;
        case 128: weighted_sums<T, 128>(orow.data(), srow.data(), inv.data(), G, vpool, sl, len, stride, kvh * D); break;
        default:
          for (int64_t g = 0; g < G; ++g) {
            std::fill(acc.begin(), acc.end(), T(0));
            for (int64_t j = 0; j < len; ++j) {
              const T p = srow[g][j] * inv[g];
              const T* v = vpool + sl[j] * stride + kvh * D;
              for (int64_t d = 0; d < D; ++d) acc[d] += p * v[d];
            }
            std::copy(acc.begin(), acc.end(), orow[g]);
          }
      }
    }
  }
}

// ---- linear_rows: out (M, N) = x (M, K) W (N, K)^T + bias, read in place.
// A register tile of MR rows x NR outputs accumulates K in vectors of the
// width (each accumulator one output's partial sums, lane by lane), then adds
// its lanes in a fixed tree, the K % width tail in order and the bias last.
// So an output's sum runs in one order that depends on K alone, never on M,
// the tile it falls in or the thread split.
#if defined(__AVX512F__)
constexpr int kLinearNR = 4;  // 16 accumulators + 4 weight vectors + 1 row: 21 of 32 registers
#else
constexpr int kLinearNR = 2;  // a 64-byte vector is 2 AVX2 (or 4 SSE/NEON) registers
#endif
constexpr int kLinearMR = 4;

template <class T>
inline T vec_sum(Vec<T> v) {
  constexpr int W = static_cast<int>(kWidth<T>);
  T t[W];
  std::memcpy(t, &v, sizeof v);
  for (int w = W / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) t[i] += t[i + w];
  return t[0];
}

// The lane sums of kWidth<T> vectors at once: lane j of the result is
// vec_sum(v[j]), in the same order (rounds of adding lanes S apart, S = W/2
// .. 1, each round also halving the vectors by interleaving pairs), ~2
// shuffles and one add per vector instead of a horizontal sum each.
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
template <class T, int S>
inline void lane_sum_round(Vec<T>* v) {
  constexpr auto idx = std::make_index_sequence<static_cast<size_t>(kWidth<T>)>{};
  for (int i = 0; i < S; ++i) v[i] = swap_low<T, S>(v[i], v[i + S], idx) + swap_high<T, S>(v[i], v[i + S], idx);
}
template <class T>
inline Vec<T> lane_sums(Vec<T>* v) {
  if constexpr (kWidth<T> >= 16) lane_sum_round<T, 8>(v);
  lane_sum_round<T, 4>(v);
  lane_sum_round<T, 2>(v);
  lane_sum_round<T, 1>(v);
  return v[0];
}
constexpr bool kLaneSums = true;
#else
template <class T>
inline Vec<T> lane_sums(Vec<T>* v) {
  Vec<T> r;
  for (int64_t j = 0; j < kWidth<T>; ++j) r[j] = vec_sum<T>(v[j]);
  return r;
}
constexpr bool kLaneSums = false;
#endif

template <class T, int MR, int NR>
inline void linear_tile(T* out, const T* x, const T* W, const T* bias, int64_t K, int64_t N, int64_t m0, int64_t n0) {
  constexpr int64_t V = kWidth<T>;
  const int64_t Kv = K / V * V;
  Vec<T> acc[MR][NR] = {};
  const T* xr[MR];
  const T* wr[NR];
  for (int i = 0; i < MR; ++i) xr[i] = x + (m0 + i) * K;
  for (int j = 0; j < NR; ++j) wr[j] = W + (n0 + j) * K;
  for (int64_t k = 0; k < Kv; k += V) {
    Vec<T> w[NR];
    for (int j = 0; j < NR; ++j) w[j] = load(wr[j] + k);
    for (int i = 0; i < MR; ++i) {
      const Vec<T> xv = load(xr[i] + k);
      for (int j = 0; j < NR; ++j) acc[i][j] += xv * w[j];
    }
  }
  T sums[MR][NR];
  if constexpr (kLaneSums && (MR * NR) % V == 0) {
    Vec<T>* flat = &acc[0][0];
    for (int g = 0; g < MR * NR; g += V) {
      const Vec<T> r = lane_sums<T>(flat + g);
      std::memcpy(&sums[0][0] + g, &r, sizeof r);
    }
  } else {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) sums[i][j] = vec_sum<T>(acc[i][j]);
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      T s = sums[i][j];
      for (int64_t k = Kv; k < K; ++k) s += xr[i][k] * wr[j][k];
      if (bias) s += bias[n0 + j];
      out[(m0 + i) * N + n0 + j] = s;
    }
}

// One span of kLinearSpan outputs for every row: 4-row tiles of NR outputs,
// then the 2- and 1-row remainders as wider tiles with the same number of
// accumulators (so their lane sums also run kWidth at once).
constexpr int kLinearSpan = kLinearMR * kLinearNR;
template <class T>
inline void linear_span(T* out, const T* x, const T* W, const T* bias, int64_t M, int64_t K, int64_t N, int64_t n0) {
  int64_t m = 0;
  for (; m + kLinearMR <= M; m += kLinearMR)
    for (int j = 0; j < kLinearSpan; j += kLinearNR) linear_tile<T, kLinearMR, kLinearNR>(out, x, W, bias, K, N, m, n0 + j);
  if (M - m >= 2) {
    for (int j = 0; j < kLinearSpan; j += 2 * kLinearNR) linear_tile<T, 2, 2 * kLinearNR>(out, x, W, bias, K, N, m, n0 + j);
    m += 2;
  }
  if (M - m == 1) linear_tile<T, 1, kLinearSpan>(out, x, W, bias, K, N, m, n0);
}

template <class T>
void linear_impl(T* out, const T* x, const T* W, const T* bias, int64_t M, int64_t K, int64_t N, int64_t begin,
                 int64_t end) {
  int64_t n = begin;
  for (; n + kLinearSpan <= end; n += kLinearSpan) linear_span(out, x, W, bias, M, K, N, n);
  for (; n < end; ++n)
    for (int64_t m = 0; m < M; ++m) linear_tile<T, 1, 1>(out, x, W, bias, K, N, m, n);
}

}  // namespace

void rms_norm_rows(float* out, const float* x, const float* weight, int64_t dim, double eps, int64_t begin, int64_t end) {
  rms_norm_impl(out, x, weight, dim, eps, begin, end);
}
void rms_norm_rows(double* out, const double* x, const double* weight, int64_t dim, double eps, int64_t begin,
                   int64_t end) {
  rms_norm_impl(out, x, weight, dim, eps, begin, end);
}
void rope_rows(float* x, const float* cos, const float* sin, int64_t heads, int64_t dim, int64_t begin, int64_t end) {
  rope_impl(x, cos, sin, heads, dim, begin, end);
}
void rope_rows(double* x, const double* cos, const double* sin, int64_t heads, int64_t dim, int64_t begin,
               int64_t end) {
  rope_impl(x, cos, sin, heads, dim, begin, end);
}
void paged_decode_attention(float* out, const float* q, const float* kpool, const float* vpool,
                            const DecodeAttention& a, int64_t begin, int64_t end) {
  decode_attention_impl(out, q, kpool, vpool, a, begin, end);
}
void paged_decode_attention(double* out, const double* q, const double* kpool, const double* vpool,
                            const DecodeAttention& a, int64_t begin, int64_t end) {
  decode_attention_impl(out, q, kpool, vpool, a, begin, end);
}

void linear_rows(float* out, const float* x, const float* W, const float* bias, int64_t M, int64_t K, int64_t N,
                 int64_t begin, int64_t end) {
  linear_impl(out, x, W, bias, M, K, N, begin, end);
}
void linear_rows(double* out, const double* x, const double* W, const double* bias, int64_t M, int64_t K, int64_t N,
                 int64_t begin, int64_t end) {
  linear_impl(out, x, W, bias, M, K, N, begin, end);
}

}  // namespace kernels
}  // namespace arpo
