// Decode-time ops of the policy model on the CPU (kernels.h section 5):
// RMSNorm, rotary embedding and paged single-token attention, each one pass
// over its rows in place of a composition of torch ops.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
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

template <class T>
void decode_attention_impl(T* out, const T* q, const T* kpool, const T* vpool, const DecodeAttention& a,
                           int64_t begin, int64_t end) {
  const int64_t H = a.heads, KVH = a.kv_heads, D = a.head_dim, G = H / KVH;
  std::vector<T> scores(static_cast<size_t>(G * std::max<int64_t>(a.max_ctx, 1)));
  std::vector<T> acc(static_cast<size_t>(G * D));
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / KVH, kvh = item % KVH;
    const int64_t row = a.rows[b], len = a.lengths[b];
    if (len < 1 || len > a.max_ctx) throw Error("paged_decode_attention: length " + std::to_string(len) + " of path " + std::to_string(b) + " outside [1, " + std::to_string(a.max_ctx) + "]");
    const int64_t* sl = a.slots + b * a.max_ctx;
    const T* qh = q + (row * H + kvh * G) * D;  // the G query heads of this kv head, side by side
    for (int64_t j = 0; j < len; ++j) {
      const int64_t slot = sl[j];
      if (slot < 0 || slot >= a.pool_slots) throw Error("paged_decode_attention: slot " + std::to_string(slot) + " outside the pool of " + std::to_string(a.pool_slots));
      const T* k = kpool + (slot * KVH + kvh) * D;
      for (int64_t g = 0; g < G; ++g) {
        const T* qg = qh + g * D;
        T dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qg[d] * k[d];
        scores[g * len + j] = dot * static_cast<T>(a.scale);
      }
    }
    std::fill(acc.begin(), acc.end(), T(0));
    for (int64_t g = 0; g < G; ++g) {
      T* s = scores.data() + g * len;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < len; ++j) mx = std::max(mx, s[j]);
      T sum = 0;
      for (int64_t j = 0; j < len; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      const T inv = T(1) / sum;
      T* o = acc.data() + g * D;
      for (int64_t j = 0; j < len; ++j) {
        const T p = s[j] * inv;
        const T* v = vpool + (sl[j] * KVH + kvh) * D;
        for (int64_t d = 0; d < D; ++d) o[d] += p * v[d];
      }
    }
    std::copy(acc.begin(), acc.end(), out + (row * H + kvh * G) * D);
  }
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

}  // namespace kernels
}  // namespace arpo
