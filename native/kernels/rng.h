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
ARPO_HD double gumbel(uint64_t key, int64_t j) {
  return -log(-log(uniform(key, j)));
}

}  // namespace rng
}  // namespace arpo
