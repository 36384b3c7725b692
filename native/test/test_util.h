// Shared helpers of the C++ kernel tests: seeded random logits, bf16
// rounding, and the plain double reference of the per-row softmax statistics.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace arpo_test {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kInfF = std::numeric_limits<float>::infinity();

struct Random {
  std::mt19937_64 gen;
  explicit Random(uint64_t seed) : gen(seed) {}
  double normal() { return std::normal_distribution<double>(0.0, 1.0)(gen); }
  double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(gen); }
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); }
};

inline std::vector<float> random_logits(Random& r, int64_t T, int64_t V, double scale) {
  std::vector<float> x(static_cast<size_t>(T * V));
  for (auto& v : x) v = static_cast<float>(scale * r.normal());
  return x;
}

// float -> bf16 bits, round to nearest even (finite inputs and infinities).
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return static_cast<uint16_t>(u >> 16);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Plain reference of one row: z = x * (1/temperature) in float (the contract),
// everything else in double, two passes, no tricks.
struct RefRow {
  double lse = -kInf, entropy = 0, max = -kInf;
  std::vector<double> z;
  double logp(int64_t j) const { return z[j] == -kInf ? -kInf : z[j] - lse; }
};
inline RefRow ref_row(const float* x, int64_t V, float temperature) {
  RefRow r;
  const float inv_t = 1.0f / temperature;
  r.z.resize(static_cast<size_t>(V));
  for (int64_t j = 0; j < V; ++j) {
    r.z[j] = static_cast<double>(x[j] * inv_t);
    if (r.z[j] > r.max) r.max = r.z[j];
  }
  if (r.max == -kInf) return r;
  double s = 0;
  for (double z : r.z) s += std::exp(z - r.max);
  r.lse = r.max + std::log(s);
  double h = 0;
  for (double z : r.z) {
    if (z == -kInf) continue;
    const double lp = z - r.lse;
    h -= std::exp(lp) * lp;
  }
  r.entropy = h;
  return r;
}

}  // namespace arpo_test
