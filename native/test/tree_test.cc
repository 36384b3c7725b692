// tree_reduce / tree_expand against a naive per-leaf ancestor walk on random
// forests, and entropy_delta against a direct window mean; plus their
// argument errors.
#include <cmath>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/kernels.h"
#include "test_util.h"

using namespace arpo::kernels;
using arpo_test::Random;

namespace {

void test_tree_reduce_random() {
  Random r(21);
  for (int rep = 0; rep < 20; ++rep) {
    const int64_t N = r.integer(1, 60);
    std::vector<int32_t> parent(N);
    for (int64_t n = 0; n < N; ++n) parent[n] = (n == 0 || r.uniform() < 0.1) ? -1 : static_cast<int32_t>(r.integer(0, n - 1));
    const int64_t L = r.integer(0, 40);
    std::vector<int32_t> leaf(L);
    std::vector<float> adv(L);
    for (int64_t l = 0; l < L; ++l) {
      leaf[l] = static_cast<int32_t>(r.integer(0, N - 1));
      adv[l] = static_cast<float>(r.normal());
    }
    // Naive: every leaf walks up to its root, adding itself to each ancestor.
    std::vector<double> sum(N, 0.0), mean(N, 0.0);
    std::vector<int32_t> count(N, 0);
    for (int64_t l = 0; l < L; ++l)
      for (int32_t n = leaf[l]; n >= 0; n = parent[n]) {
        sum[n] += adv[l];
        count[n] += 1;
      }
    for (int64_t n = 0; n < N; ++n) mean[n] = count[n] ? sum[n] / count[n] : 0.0;
    std::vector<float> ks(N), km(N);
    std::vector<int32_t> kc(N);
    tree_reduce(ks.data(), km.data(), kc.data(), parent.data(), N, leaf.data(), adv.data(), L);
    CHECK_ARRAY("node_sum", ks.data(), sum.data(), N, 1e-5, 1e-6);
    CHECK_ARRAY("node_mean", km.data(), mean.data(), N, 1e-5, 1e-6);
    CHECK_ARRAY("node_count", kc.data(), count.data(), N, 0, 0);

    // Expand node sums onto disjoint random spans of a token buffer.
    std::vector<int64_t> off(N), cnt(N);
    int64_t P = 0;
    for (int64_t n = 0; n < N; ++n) {
      P += r.integer(0, 2);  // gaps stay untouched
      off[n] = P;
      cnt[n] = r.integer(0, 5);
      P += cnt[n];
    }
    std::vector<float> tok(P, -7.0f), want(P, -7.0f);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = off[n]; i < off[n] + cnt[n]; ++i) want[i] = ks[n];
    tree_expand(tok.data(), P, ks.data(), off.data(), cnt.data(), N);
    CHECK_ARRAY("token_value", tok.data(), want.data(), P, 0, 0);
  }
}

// tree_reduce_signed against the same naive walk, with weights and advantages
// of both signs (and exact zeros, which count in `count` only).
void test_tree_reduce_signed_random() {
  Random r(23);
  for (int rep = 0; rep < 20; ++rep) {
    const int64_t N = r.integer(1, 60);
    std::vector<int32_t> parent(N);
    for (int64_t n = 0; n < N; ++n) parent[n] = (n == 0 || r.uniform() < 0.1) ? -1 : static_cast<int32_t>(r.integer(0, n - 1));
    const int64_t L = r.integer(0, 40);
    std::vector<int32_t> leaf(L);
    std::vector<double> adv(L), w(L);
    for (int64_t l = 0; l < L; ++l) {
      leaf[l] = static_cast<int32_t>(r.integer(0, N - 1));
      adv[l] = r.uniform() < 0.15 ? 0.0 : r.normal();
      w[l] = r.uniform() * 3;
    }
    std::vector<double> pos(N, 0.0), neg(N, 0.0), ws(N, 0.0);
    std::vector<int32_t> cp(N, 0), cn(N, 0), ca(N, 0);
    for (int64_t l = 0; l < L; ++l)
      for (int32_t n = leaf[l]; n >= 0; n = parent[n]) {
        if (adv[l] > 0) pos[n] += w[l] * adv[l], cp[n] += 1;
        if (adv[l] < 0) neg[n] += w[l] * adv[l], cn[n] += 1;
        ws[n] += w[l];
        ca[n] += 1;
      }
    std::vector<double> kp(N), kn(N), kw(N);
    std::vector<int32_t> kcp(N), kcn(N), kca(N);
    tree_reduce_signed(kp.data(), kn.data(), kw.data(), kcp.data(), kcn.data(), kca.data(), parent.data(), N, leaf.data(),
                       adv.data(), w.data(), L);
    CHECK_ARRAY("pos_sum", kp.data(), pos.data(), N, 1e-12, 1e-12);
    CHECK_ARRAY("neg_sum", kn.data(), neg.data(), N, 1e-12, 1e-12);
    CHECK_ARRAY("weight_sum", kw.data(), ws.data(), N, 1e-12, 1e-12);
    CHECK_ARRAY("pos_count", kcp.data(), cp.data(), N, 0, 0);
    CHECK_ARRAY("neg_count", kcn.data(), cn.data(), N, 0, 0);
    CHECK_ARRAY("count", kca.data(), ca.data(), N, 0, 0);
  }
  std::vector<int32_t> parent = {-1, 0}, leaf = {1};
  std::vector<double> adv = {1.0}, w = {-1.0}, out(2);
  CHECK_THROWS(tree_reduce_signed(out.data(), nullptr, nullptr, nullptr, nullptr, nullptr, parent.data(), 2, leaf.data(),
                                  adv.data(), w.data(), 1),
               "leaf_weight[0] = -1.000000 must be finite and >= 0");
  w[0] = 1.0;
  adv[0] = std::nan("");
  CHECK_THROWS(tree_reduce_signed(out.data(), nullptr, nullptr, nullptr, nullptr, nullptr, parent.data(), 2, leaf.data(),
                                  adv.data(), w.data(), 1),
               "leaf_adv[0] = nan is not finite");
  parent[1] = 1;
  adv[0] = 1.0;
  CHECK_THROWS(tree_reduce_signed(out.data(), nullptr, nullptr, nullptr, nullptr, nullptr, parent.data(), 2, leaf.data(),
                                  adv.data(), w.data(), 1),
               "tree_reduce_signed: parent[1] = 1 must be -1");
}

void test_tree_errors() {
  std::vector<int32_t> parent = {-1, 0, 2};
  std::vector<int32_t> leaf = {1};
  std::vector<float> adv = {1.0f}, out(3);
  CHECK_THROWS(tree_reduce(out.data(), nullptr, nullptr, parent.data(), 3, leaf.data(), adv.data(), 1),
               "parent[2] = 2 must be -1 (root) or an earlier node in [0, 2)");
  parent[2] = 0;
  leaf[0] = 3;
  CHECK_THROWS(tree_reduce(out.data(), nullptr, nullptr, parent.data(), 3, leaf.data(), adv.data(), 1),
               "leaf_node[0] = 3 is outside [0, 3)");
  std::vector<int64_t> off = {0, 2}, cnt = {2, 3};
  std::vector<float> tok(4), vals = {1.0f, 2.0f};
  CHECK_THROWS(tree_expand(tok.data(), 4, vals.data(), off.data(), cnt.data(), 2), "node 1 span [2, 2 + 3) is outside [0, 4)");
  off[1] = -1;
  cnt[1] = 1;
  CHECK_THROWS(tree_expand(tok.data(), 4, vals.data(), off.data(), cnt.data(), 2), "node 1 span [-1");
  // Empty inputs are no-ops.
  tree_reduce(nullptr, nullptr, nullptr, nullptr, 0, nullptr, nullptr, 0);
  tree_expand(nullptr, 0, nullptr, nullptr, nullptr, 0);
  CHECK(true);
}

void test_entropy_delta() {
  Random r(22);
  const int64_t T = 50;
  std::vector<float> ent(T);
  for (auto& e : ent) e = static_cast<float>(r.uniform());
  // Two paths: segments [0,10) [10,12) [12,30) | [30,31) [31,50) and an empty one.
  std::vector<int64_t> starts = {0, 10, 12, 30, 31, 40}, ends = {10, 12, 30, 31, 50, 40};
  std::vector<int32_t> base = {0, 0, 0, -1, 3, 3};
  const int64_t S = 6;
  for (const int32_t k : {1, 5, 20}) {
    std::vector<float> mean(S), delta(S);
    std::vector<int32_t> count(S);
    entropy_delta(mean.data(), count.data(), delta.data(), ent.data(), T, starts.data(), ends.data(), base.data(), S, k);
    std::vector<double> want(S), want_delta(S);
    std::vector<int32_t> want_count(S);
    for (int64_t s = 0; s < S; ++s) {
      const int64_t n = std::min<int64_t>(k, ends[s] - starts[s]);
      double sum = 0;
      for (int64_t t = starts[s]; t < starts[s] + n; ++t) sum += ent[t];
      want[s] = n ? sum / n : 0;
      want_count[s] = static_cast<int32_t>(n);
    }
    for (int64_t s = 0; s < S; ++s) want_delta[s] = (base[s] < 0 || base[s] == s) ? 0 : want[s] - want[base[s]];
    CHECK_ARRAY("window_mean k=" + std::to_string(k), mean.data(), want.data(), S, 1e-6, 1e-6);
    CHECK_ARRAY("window_count", count.data(), want_count.data(), S, 0, 0);
    CHECK_ARRAY("delta", delta.data(), want_delta.data(), S, 1e-6, 1e-6);
  }
  std::vector<float> mean(S);
  CHECK_THROWS(entropy_delta(mean.data(), nullptr, nullptr, ent.data(), T, starts.data(), ends.data(), base.data(), S, 0),
               "k must be >= 1, got 0");
  ends[2] = 51;
  CHECK_THROWS(entropy_delta(mean.data(), nullptr, nullptr, ent.data(), T, starts.data(), ends.data(), base.data(), S, 3),
               "segment 2 = [12, 51) is not inside [0, 50)");
  ends[2] = 30;
  base[1] = 6;
  CHECK_THROWS(entropy_delta(mean.data(), nullptr, nullptr, ent.data(), T, starts.data(), ends.data(), base.data(), S, 3),
               "baseline[1] = 6 is not a segment index (S = 6)");
}

}  // namespace

int main() {
  test_tree_reduce_random();
  test_tree_reduce_signed_random();
  test_tree_errors();
  test_entropy_delta();
  return arpo_test::summary();
}
