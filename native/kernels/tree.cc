// CPU rollout-tree kernels: the windowed entropy change after tool calls
// (ARPO.md section 1) and the shared-prefix advantage reduction / per-token
// expansion (ARPO.md section 2). All O(N + L) or O(T), single-threaded: they
// are tiny next to the logits kernels.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace arpo {
namespace kernels {
namespace {
std::string s(int64_t v) { return std::to_string(v); }
}  // namespace

void entropy_delta(float* window_mean, int32_t* window_count, float* delta, const float* entropy, int64_t T,
                   const int64_t* starts, const int64_t* ends, const int32_t* baseline, int64_t S, int32_t k) {
  if (k < 1) throw Error("entropy_delta: k must be >= 1, got " + s(k));
  if (T < 0) throw Error("entropy_delta: T must be >= 0, got " + s(T));
  if (S < 0) throw Error("entropy_delta: S must be >= 0, got " + s(S));
  if (S == 0) return;
  if (!window_mean || !starts || !ends) throw Error("entropy_delta: window_mean, starts and ends are required");
  if (T > 0 && !entropy) throw Error("entropy_delta: entropy is null with T = " + s(T));
  for (int64_t i = 0; i < S; ++i) {
    if (starts[i] < 0 || ends[i] > T || starts[i] > ends[i])
      throw Error("entropy_delta: segment " + s(i) + " = [" + s(starts[i]) + ", " + s(ends[i]) + ") is not inside [0, " +
                  s(T) + ") or is reversed");
    if (baseline && baseline[i] >= S)
      throw Error("entropy_delta: baseline[" + s(i) + "] = " + s(baseline[i]) + " is not a segment index (S = " + s(S) + ")");
  }
  // window_mean[s] = (1/n) sum_{t < starts + n} entropy[t], n = min(k, length).
  std::vector<double> mean(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) {
    const int64_t n = std::min<int64_t>(k, ends[i] - starts[i]);
    double sum = 0;
    for (int64_t t = starts[i]; t < starts[i] + n; ++t) sum += entropy[t];
    mean[i] = n > 0 ? sum / n : 0.0;
    window_mean[i] = static_cast<float>(mean[i]);
    if (window_count) window_count[i] = static_cast<int32_t>(n);
  }
  if (delta)
    for (int64_t i = 0; i < S; ++i) {
      const int32_t b = baseline ? baseline[i] : -1;
      delta[i] = (b < 0 || b == i) ? 0.0f : static_cast<float>(mean[i] - mean[b]);
    }
}

void tree_reduce(float* node_sum, float* node_mean, int32_t* node_count, const int32_t* parent, int64_t N,
                 const int32_t* leaf_node, const float* leaf_adv, int64_t L) {
  if (N < 0) throw Error("tree_reduce: N must be >= 0, got " + s(N));
  if (L < 0) throw Error("tree_reduce: L must be >= 0, got " + s(L));
  if (N > 0 && !parent) throw Error("tree_reduce: parent is null with N = " + s(N));
  if (L > 0 && (!leaf_node || !leaf_adv)) throw Error("tree_reduce: leaf_node and leaf_adv are required with L = " + s(L));
  for (int64_t n = 0; n < N; ++n)
    if (parent[n] < -1 || parent[n] >= n)
      throw Error("tree_reduce: parent[" + s(n) + "] = " + s(parent[n]) +
                  " must be -1 (root) or an earlier node in [0, " + s(n) + ")");
  for (int64_t l = 0; l < L; ++l)
    if (leaf_node[l] < 0 || leaf_node[l] >= N)
      throw Error("tree_reduce: leaf_node[" + s(l) + "] = " + s(leaf_node[l]) + " is outside [0, " + s(N) + ")");
  // Leaves add into their node; then, children before parents (reverse
  // topological order), each node's totals add into its parent's.
  std::vector<double> sum(static_cast<size_t>(N), 0.0);
  std::vector<int64_t> count(static_cast<size_t>(N), 0);
  for (int64_t l = 0; l < L; ++l) {
    sum[leaf_node[l]] += leaf_adv[l];
    count[leaf_node[l]] += 1;
  }
  for (int64_t n = N - 1; n > 0; --n) {
    const int32_t p = parent[n];
    if (p >= 0) {
      sum[p] += sum[n];
      count[p] += count[n];
    }
  }
  for (int64_t n = 0; n < N; ++n) {
    if (node_sum) node_sum[n] = static_cast<float>(sum[n]);
    if (node_mean) node_mean[n] = count[n] > 0 ? static_cast<float>(sum[n] / count[n]) : 0.0f;
    if (node_count) node_count[n] = static_cast<int32_t>(count[n]);
  }
}

void tree_expand(float* token_value, int64_t P, const float* node_value, const int64_t* token_offset,
                 const int64_t* token_count, int64_t N) {
  if (P < 0) throw Error("tree_expand: P must be >= 0, got " + s(P));
  if (N < 0) throw Error("tree_expand: N must be >= 0, got " + s(N));
  if (N == 0) return;
  if (!node_value || !token_offset || !token_count) throw Error("tree_expand: node_value, token_offset and token_count are required");
  if (P > 0 && !token_value) throw Error("tree_expand: token_value is null with P = " + s(P));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t o = token_offset[n], c = token_count[n];
    if (o < 0 || c < 0 || o > P || c > P - o)
      throw Error("tree_expand: node " + s(n) + " span [" + s(o) + ", " + s(o) + " + " + s(c) + ") is outside [0, " + s(P) + ")");
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = token_offset[n]; i < token_offset[n] + token_count[n]; ++i) token_value[i] = node_value[n];
}

}  // namespace kernels
}  // namespace arpo
