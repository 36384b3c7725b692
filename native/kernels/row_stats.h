// Internal building blocks of the CPU kernels: a vectorised exp for
// arguments <= 0, bf16 decoding and the one-pass per-row softmax statistics
// (online max / sum-exp / exp-weighted logit sum) shared by logits_stats,
// sample_tokens and policy_loss. Written with GCC/Clang vector extensions
// (16, 8 or 4 floats: AVX-512, AVX or SSE, whichever the build targets), not
// intrinsics; the plain scalar reference lives in the tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/kernels.h"

// The vector helpers are all inline (no ABI boundary); builds without AVX-512
// (node-gyp's default flags) would otherwise warn about the 64-byte vector ABI.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace arpo {
namespace kernels {
namespace detail {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Vector width = the target's native width (a wider GCC vector type than the
// hardware has is lowered through the stack and runs ~10x slower).
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
typedef float vfloat __attribute__((vector_size(4 * kLanes)));
typedef int32_t vint __attribute__((vector_size(4 * kLanes)));
typedef uint32_t vuint __attribute__((vector_size(4 * kLanes)));
typedef uint16_t vhalf __attribute__((vector_size(2 * kLanes)));

template <typename T>
inline T splat(float v) {
  T r;
  if constexpr (std::is_same<T, float>::value) r = v;
  else r = T{} + v;
  return r;
}

// Bit casts between equally sized types (memcpy: no aliasing UB).
template <typename To, typename From>
inline To bit_cast(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast size");
  To t;
  std::memcpy(&t, &f, sizeof t);
  return t;
}

// bfloat16 bits -> float: the bf16 value is the high half of a float32.
inline float bf16_to_float(uint16_t bits) { return bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

// exp(y) for y in [kExpFloor, 0] (the argument is always z - max; callers
// clamp), branch-free, for float or vfloat: exp(y) = 2^t with
// t = y log2(e) = n + f, n = round(t), |f| <= 1/2. n comes from the
// "add 1.5 * 2^23" trick (the sum's low mantissa bits then hold n + 127,
// which shifted left by 23 are the exponent bits of 2^n); 2^f is a degree-5
// minimax polynomial with p(0) = 1 exactly, so the max term is exactly 1
// (relative error 9.1e-8 in exact arithmetic, 1.9e-7 with float Horner;
// fitted by Lawson's algorithm on [-1/2, 1/2]). The floor
// y >= -88 keeps n >= -127; n = -127 (y < -87.68, where exp < 1.1e-38, below
// float's normal range) gives exponent bits 0, i.e. exactly 0. So a clamped
// -inf weighs exactly 0, with no masks: 12 vector ops per vector.
constexpr float kExpFloor = -88.0f;
template <typename F, typename I>
inline F exp_nonpos_t(F y) {
  const F shift = splat<F>(12582912.0f + 127.0f);  // 1.5 * 2^23 + exponent bias
  const F t = y * splat<F>(1.44269504088896341f);
  const F shifted = t + shift;
  const F f = t - (shifted - shift);
  F p = splat<F>(1.326472731e-03f);
  p = p * f + splat<F>(9.671512991e-03f);
  p = p * f + splat<F>(5.550733581e-02f);
  p = p * f + splat<F>(2.402224243e-01f);
  p = p * f + splat<F>(6.931470037e-01f);
  p = p * f + splat<F>(1.0f);
  const I bits = bit_cast<I>(shifted) << 23;  // the 1.5 * 2^23 bits fall off the top
  return p * bit_cast<F>(bits);
}
inline float exp_nonpos(float y) { return exp_nonpos_t<float, int32_t>(y); }
inline vfloat exp_nonpos(vfloat y) { return exp_nonpos_t<vfloat, vint>(y); }

// exp(y) for any y <= 0 (also -inf): clamp, then exp_nonpos.
inline float exp_nonpos_clamped(float y) { return exp_nonpos(y < kExpFloor ? kExpFloor : y); }
inline vfloat exp_nonpos_clamped(vfloat y) {
  const vfloat floor = splat<vfloat>(kExpFloor);
  return exp_nonpos(y < floor ? floor : y);
}

// Statistics of one row of z = x * inv_temperature.
struct RowStats {
  float max = kNegInf;    // max_j z_j
  double lse = kNegInf;   // log sum_j exp(z_j)
  double entropy = 0;     // lse - sum_j p_j z_j  (nats)
};

// Row readers: element j as float, or kLanes elements from j as a vfloat.
struct F32Row {
  const float* x;
  float operator()(int64_t j) const { return x[j]; }
  vfloat load(int64_t j) const {
    vfloat v;
    std::memcpy(&v, x + j, sizeof v);
    return v;
  }
};
struct BF16Row {
  const uint16_t* x;
  float operator()(int64_t j) const { return bf16_to_float(x[j]); }
  vfloat load(int64_t j) const {
    vhalf h;
    std::memcpy(&h, x + j, sizeof h);
    return bit_cast<vfloat>(__builtin_convertvector(h, vuint) << 16);
  }
};

inline float hmax(vfloat v) {
  float m = v[0];
  for (int l = 1; l < kLanes; ++l) m = v[l] > m ? v[l] : m;
  return m;
}
inline double hsum(vfloat v) {
  double s = 0;
  for (int l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

// NaN logits are caught by S turning NaN, except in a row that is otherwise
// all -inf (no exp is taken): this O(1)-usually check covers that case.
template <typename Row>
inline bool has_nan(const Row& row, int64_t V, float m) {
  if (m != kNegInf) return false;
  for (int64_t i = 0; i < V; ++i)
    if (row(i) != row(i)) return true;
  return false;
}
inline RowStats nan_stats() {
  RowStats st;
  st.max = std::numeric_limits<float>::quiet_NaN();
  st.lse = st.entropy = std::numeric_limits<double>::quiet_NaN();
  return st;
}

// One pass over a row of V logits, in blocks of kBlock values read as
// vectors of kLanes. Online softmax (Milakov & Gimelshein 2018) at block
// granularity, optimistic: each block computes its lane-wise max AND
// e = exp(z - m), e * (z - m) against the running max m in one sweep; only
// when the block's max exceeds m (a handful of times per row for real
// logits) are the running sums rescaled by exp(m_old - m_new) and the block
// redone from L1 (1 KB). Per-lane float sums are added to double totals
// once per block, so float rounding spans only kBlock/kLanes (16-64) terms.
// Centring on m keeps entropy = log S - (sum e (z - m)) / S accurate even
// for |z| ~ 1e4. -inf logits clamp to y = -88, weight exactly 0; NaN or
// +inf logits turn S into NaN, reported as NaN stats. O(kLanes) state only.
constexpr int kBlock = 256;

template <typename Row>
inline RowStats row_stats(const Row& row, int64_t V, float inv_t) {
  double S = 0, W = 0;  // sum e, sum e*(z - m) relative to the running max m
  float m = kNegInf;
  // Moves the running max to bm, rescaling S and W:
  // sum e (z - m_new) = scale (sum e (z - m_old) + (m_old - m_new) S), scale = exp(m_old - m_new).
  auto raise_max = [&](float bm) {
    if (m != kNegInf) {
      const double d = static_cast<double>(m) - static_cast<double>(bm);
      const double scale = std::exp(d);
      W = scale * (W + d * S);
      S *= scale;
    }
    m = bm;
  };
  const vfloat vinv = splat<vfloat>(inv_t), zero = splat<vfloat>(0.0f), floor = splat<vfloat>(kExpFloor);
  int64_t j = 0;
  for (; j + kBlock <= V; j += kBlock) {
    const vfloat vm = splat<vfloat>(m);
    vfloat lm = splat<vfloat>(kNegInf), ls = zero, lw = zero;
    for (int b = 0; b < kBlock; b += kLanes) {
      const vfloat z = row.load(j + b) * vinv;
      lm = z > lm ? z : lm;
      vfloat y = z - vm;
      y = y < floor ? floor : y;
      const vfloat e = exp_nonpos(y);  // garbage if some z > m: then redone below
      ls += e;
      lw += e * y;
    }
    const float bm = hmax(lm);
    if (bm > m) {
      raise_max(bm);
      const vfloat vm2 = splat<vfloat>(m);
      ls = lw = zero;
      for (int b = 0; b < kBlock; b += kLanes) {
        vfloat y = row.load(j + b) * vinv - vm2;
        y = y < floor ? floor : y;
        const vfloat e = exp_nonpos(y);
        ls += e;
        lw += e * y;
      }
    } else if (m == kNegInf) {
      continue;  // every value so far is -inf: contributes nothing
    }
    S += hsum(ls);
    W += hsum(lw);
  }
  if (j < V) {  // tail (< kBlock values), scalar
    float bm = kNegInf;
    for (int64_t i = j; i < V; ++i) {
      const float z = row(i) * inv_t;
      bm = z > bm ? z : bm;
    }
    if (bm > m) raise_max(bm);
    if (m != kNegInf) {
      for (int64_t i = j; i < V; ++i) {
        float y = row(i) * inv_t - m;
        y = y < kExpFloor ? kExpFloor : y;
        const float e = exp_nonpos(y);
        S += e;
        W += e * y;
      }
    }
  }
  RowStats st;
  if (S != S || W != W || m == std::numeric_limits<float>::infinity() || has_nan(row, V, m))
    return nan_stats();
  st.max = m;
  if (m == kNegInf) return st;  // all -inf: lse -inf, entropy 0
  st.lse = static_cast<double>(m) + std::log(S);
  st.entropy = std::log(S) - W / S;
  if (st.entropy < 0) st.entropy = 0;  // rounding below the true minimum 0
  return st;
}

// Row readers of a Logits buffer.
inline F32Row f32_row(const Logits& lg, int64_t t) {
  return F32Row{static_cast<const float*>(lg.data) + t * lg.vocab};
}
inline BF16Row bf16_row(const Logits& lg, int64_t t) {
  return BF16Row{static_cast<const uint16_t*>(lg.data) + t * lg.vocab};
}

// Shared argument checks (messages name the argument and the value).
void check_logits(const Logits& logits, const char* op);

}  // namespace detail
}  // namespace kernels
}  // namespace arpo
