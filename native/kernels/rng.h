// Counter-based random numbers shared by the CPU and CUDA samplers, so both
// draw the same token for the same (seed, stream, position): no state, only
// hashes of the key. SplitMix64 finaliser (Steele et al., "Fast splittable
// pseudorandom number generators", 2014) as the mixing function.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define ARPO_HD __host__ __device__ __forceinline__
#else
#define ARPO_HD inline
#endif

namespace arpo {
namespace rng {

ARPO_HD uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Key of one row's draw: depends on (seed, stream, position) only.
ARPO_HD uint64_t row_key(uint64_t seed, uint64_t stream, int64_t position) {
  return mix64(seed ^ mix64(stream ^ mix64(static_cast<uint64_t>(position))));
}

// Uniform in the open interval (0, 1) for vocabulary entry j of a row: 53
// random bits, centred so 0 and 1 never occur.
ARPO_HD double uniform(uint64_t key, int64_t j) {
  const uint64_t bits = mix64(key + static_cast<uint64_t>(j) * 0xD1B54A32D192ED03ull) >> 11;
  return (static_cast<double>(bits) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard Gumbel noise -log(-log(u)), in double on both CPU and GPU so the
// argmax over z_j + g_j agrees between them (up to measure-zero ties).
ARPO_HD double gumbel_of(double u) { return -log(-log(u)); }
ARPO_HD double gumbel(uint64_t key, int64_t j) { return gumbel_of(uniform(key, j)); }

// An upper bound of gumbel_of(u) as computed, without a logarithm (the
// samplers skip the two logs of every token that cannot win, and on a
// small vocabulary with flat logits few tokens fall under a fixed bound).
// With s = 1 - u: -log u >= s, so gumbel <= -log s; s >= 2^(E - 1023) for
// E its biased exponent, so -log s <= (1023 - E) log 2. For u >= 1/2, s is
// exact (Sterbenz); for u < 1/2, -log u > log 2 and gumbel < -log(log 2) =
// 0.367; u == 1 gives +inf. 1e-9 covers the logs' rounding (< 1e-14 here).
ARPO_HD double gumbel_bound_of(double u) {
  if (u < 0.5) return 0.37;
  const double s = 1.0 - u;
  if (s == 0.0) return HUGE_VAL;
#if defined(__CUDA_ARCH__)
  const uint64_t b = static_cast<uint64_t>(__double_as_longlong(s));
#else
  uint64_t b;
  __builtin_memcpy(&b, &s, sizeof b);
#endif
  return static_cast<double>(1023 - static_cast<int64_t>((b >> 52) & 0x7ff)) * 0.6931471805599453 + 1e-9;
}

}  // namespace rng
}  // namespace arpo
