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

namespace {
// Shared checks of the tree reductions: parents before children, leaves on nodes.
void check_tree(const char* op, const int32_t* parent, int64_t N, const int32_t* leaf_node, int64_t L, bool leaf_values) {
  const std::string o(op);
  if (N < 0) throw Error(o + ": N must be >= 0, got " + s(N));
  if (L < 0) throw Error(o + ": L must be >= 0, got " + s(L));
  if (N > 0 && !parent) throw Error(o + ": parent is null with N = " + s(N));
  if (L > 0 && (!leaf_node || !leaf_values)) throw Error(o + ": leaf_node and the leaf values are required with L = " + s(L));
  for (int64_t n = 0; n < N; ++n)
    if (parent[n] < -1 || parent[n] >= n)
      throw Error(o + ": parent[" + s(n) + "] = " + s(parent[n]) + " must be -1 (root) or an earlier node in [0, " + s(n) + ")");
  for (int64_t l = 0; l < L; ++l)
    if (leaf_node[l] < 0 || leaf_node[l] >= N)
      throw Error(o + ": leaf_node[" + s(l) + "] = " + s(leaf_node[l]) + " is outside [0, " + s(N) + ")");
}

// Children before parents (reverse topological order): each node's totals add into its parent's.
template <typename T>
void up_sweep(std::vector<T>& v, const int32_t* parent, int64_t N) {
  for (int64_t n = N - 1; n > 0; --n)
    if (parent[n] >= 0) v[parent[n]] += v[n];
}
}  // namespace

void tree_reduce(float* node_sum, float* node_mean, int32_t* node_count, const int32_t* parent, int64_t N,
                 const int32_t* leaf_node, const float* leaf_adv, int64_t L) {
  check_tree("tree_reduce", parent, N, leaf_node, L, leaf_adv != nullptr);
  // Leaves add into their node; then the sums move up the tree.
  std::vector<double> sum(static_cast<size_t>(N), 0.0);
  std::vector<int64_t> count(static_cast<size_t>(N), 0);
  for (int64_t l = 0; l < L; ++l) {
    sum[leaf_node[l]] += leaf_adv[l];
    count[leaf_node[l]] += 1;
  }
  up_sweep(sum, parent, N);
  up_sweep(count, parent, N);
  for (int64_t n = 0; n < N; ++n) {
    if (node_sum) node_sum[n] = static_cast<float>(sum[n]);
    if (node_mean) node_mean[n] = count[n] > 0 ? static_cast<float>(sum[n] / count[n]) : 0.0f;
    if (node_count) node_count[n] = static_cast<int32_t>(count[n]);
  }
}

void tree_reduce_signed(double* pos_sum, double* neg_sum, double* weight_sum, int32_t* pos_count, int32_t* neg_count,
                        int32_t* count, const int32_t* parent, int64_t N, const int32_t* leaf_node,
                        const double* leaf_adv, const double* leaf_weight, int64_t L) {
  check_tree("tree_reduce_signed", parent, N, leaf_node, L, leaf_adv != nullptr && leaf_weight != nullptr);
  for (int64_t l = 0; l < L; ++l) {
    if (!std::isfinite(leaf_adv[l]))
      throw Error("tree_reduce_signed: leaf_adv[" + s(l) + "] = " + std::to_string(leaf_adv[l]) + " is not finite");
    if (!std::isfinite(leaf_weight[l]) || leaf_weight[l] < 0)
      throw Error("tree_reduce_signed: leaf_weight[" + s(l) + "] = " + std::to_string(leaf_weight[l]) +
                  " must be finite and >= 0");
  }
  std::vector<double> pos(static_cast<size_t>(N), 0.0), neg(pos), wsum(pos);
  std::vector<int64_t> cpos(static_cast<size_t>(N), 0), cneg(cpos), call(cpos);
  for (int64_t l = 0; l < L; ++l) {
    const int32_t n = leaf_node[l];
    const double a = leaf_adv[l], w = leaf_weight[l];
    if (a > 0) pos[n] += w * a, cpos[n] += 1;
    if (a < 0) neg[n] += w * a, cneg[n] += 1;
    wsum[n] += w;
    call[n] += 1;
  }
  for (auto* v : {&pos, &neg, &wsum}) up_sweep(*v, parent, N);
  for (auto* v : {&cpos, &cneg, &call}) up_sweep(*v, parent, N);
  for (int64_t n = 0; n < N; ++n) {
    if (pos_sum) pos_sum[n] = pos[n];
    if (neg_sum) neg_sum[n] = neg[n];
    if (weight_sum) weight_sum[n] = wsum[n];
    if (pos_count) pos_count[n] = static_cast<int32_t>(cpos[n]);
    if (neg_count) neg_count[n] = static_cast<int32_t>(cneg[n]);
    if (count) count[n] = static_cast<int32_t>(call[n]);
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
