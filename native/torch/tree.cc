// Packed rollout trees: validation, positions, targets, the chain-by-chain
// ancestor attention and cache-free scoring (see tree.h).
#include "torch/tree.h"

#include <string>

namespace arpo {
namespace model {

namespace {

// Appends [a, b) to runs, merging it into the last run when they touch.
void add_run(std::vector<TokenRange>& runs, int64_t a, int64_t b) {
  if (b <= a) return;
  if (!runs.empty() && runs.back().second == a) runs.back().second = b;
  else runs.emplace_back(a, b);
}

// Rows of x in the runs, as one tensor: a view for one run, else a cat.
at::Tensor gather_runs(const at::Tensor& x, const std::vector<TokenRange>& runs) {
  if (runs.size() == 1) return x.slice(0, runs[0].first, runs[0].second);
  std::vector<at::Tensor> parts;
  parts.reserve(runs.size());
  for (const auto& [a, b] : runs) parts.push_back(x.slice(0, a, b));
  return at::cat(parts, 0);
}

}  // namespace

PackedTree pack_tree(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parent,
                     const std::vector<int64_t>& node_tokens, int64_t vocab, int64_t max_positions, const char* what) {
  const std::string w(what);
  const int64_t N = static_cast<int64_t>(tokens.size()), K = static_cast<int64_t>(parent.size());
  if (static_cast<int64_t>(node_tokens.size()) != K)
    throw ModelError(w + ": expected " + std::to_string(K) + " node token counts (one per parent entry) but received " +
                     std::to_string(node_tokens.size()));
  if (K == 0) throw ModelError(w + ": expected at least one node");
  PackedTree p;
  p.parent = parent;
  p.node_offset.assign(K + 1, 0);
  std::vector<int64_t> start(K, 0);  // position of the node's first token
  for (int64_t k = 0; k < K; ++k) {
    const int32_t a = parent[k];
    if (a < -1 || a >= k)
      throw ModelError(w + ": parent[" + std::to_string(k) + "] = " + std::to_string(a) +
                       " must be -1 (a root) or an earlier node in [0, " + std::to_string(k) + ")");
    const int64_t n = node_tokens[k];
    if (n < 0 || (a < 0 && n < 1))
      throw ModelError(w + ": nodeTokens[" + std::to_string(k) + "] = " + std::to_string(n) + " must be " +
                       (a < 0 ? "at least 1 (a root starts its sequence)" : ">= 0"));
    start[k] = a < 0 ? 0 : start[a] + node_tokens[a];
    if (start[k] + n > max_positions)
      throw ModelError(w + ": node " + std::to_string(k) + " reaches position " + std::to_string(start[k] + n) +
                       ", beyond the model's " + std::to_string(max_positions) + " positions");
    p.node_offset[k + 1] = p.node_offset[k] + n;
  }
  if (p.node_offset[K] != N)
    throw ModelError(w + ": node token counts sum to " + std::to_string(p.node_offset[K]) + " but " + std::to_string(N) +
                     " tokens were given");

  p.ids = at::empty({N}, at::kLong);
  p.positions = at::empty({N}, at::kLong);
  int64_t* ids = p.ids.data_ptr<int64_t>();
  int64_t* pos = p.positions.data_ptr<int64_t>();
  p.row_of_token.assign(N, -1);
  std::vector<int64_t> last_row(K, -1);  // last token of the node or of its nearest non-empty ancestor
  for (int64_t k = 0; k < K; ++k) {
    const int64_t a = p.node_offset[k], b = p.node_offset[k + 1];
    const int64_t before = parent[k] < 0 ? -1 : last_row[parent[k]];
    for (int64_t i = a; i < b; ++i) {
      const int32_t t = tokens[i];
      if (t < 0 || t >= vocab)
        throw ModelError(w + ": expected token ids in [0, " + std::to_string(vocab) + ") but token " + std::to_string(i) +
                         " is " + std::to_string(t));
      ids[i] = t;
      pos[i] = start[k] + (i - a);
      const int64_t row = i == a ? before : i - 1;
      if (row >= 0) {
        p.row_of_token[i] = row;
        p.target_index.push_back(i);
        p.target_row.push_back(row);
        p.targets.push_back(t);
      }
    }
    last_row[k] = b > a ? b - 1 : before;
  }

  // Chains of first children (see tree.h). Children come after parents, so
  // the first child seen is the lowest id.
  std::vector<int64_t> first_child(K, -1);
  for (int64_t k = 0; k < K; ++k)
    if (parent[k] >= 0 && first_child[parent[k]] < 0) first_child[parent[k]] = k;
  int64_t expected_next = 0;
  for (int64_t h = 0; h < K; ++h) {
    if (parent[h] >= 0 && first_child[parent[h]] == h) continue;  // inside a chain
    PackedTree::Chain c;
    c.q_offset = start[h];
    std::vector<int64_t> ancestors;
    for (int32_t a = parent[h]; a >= 0; a = parent[a]) ancestors.push_back(a);
    for (auto it = ancestors.rbegin(); it != ancestors.rend(); ++it)
      add_run(c.keys, p.node_offset[*it], p.node_offset[*it + 1]);
    for (int64_t k = h; k >= 0; k = first_child[k]) {
      add_run(c.queries, p.node_offset[k], p.node_offset[k + 1]);
      add_run(c.keys, p.node_offset[k], p.node_offset[k + 1]);
    }
    if (c.queries.empty()) continue;  // every node of the chain is empty
    for (const auto& [a, b] : c.queries) {
      if (a != expected_next) p.chains_in_order = false;
      expected_next = b;
    }
    p.chains.push_back(std::move(c));
  }
  return p;
}

AttentionFn tree_attention(const PackedTree& tree) {
  at::Tensor order;  // chain-concatenated row -> packed row, inverted (only when chains are out of order)
  if (!tree.chains_in_order) {
    const int64_t N = tree.tokens();
    order = at::empty({N}, at::kLong);
    int64_t* o = order.data_ptr<int64_t>();
    int64_t j = 0;
    for (const auto& c : tree.chains)
      for (const auto& [a, b] : c.queries)
        for (int64_t i = a; i < b; ++i) o[i] = j++;
  }
  return [chains = tree.chains, order](int64_t, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    std::vector<at::Tensor> outs;
    outs.reserve(chains.size());
    for (const auto& c : chains)
      outs.push_back(causal_attention(gather_runs(q, c.queries), gather_runs(k, c.keys), gather_runs(v, c.keys), c.q_offset));
    at::Tensor out = outs.size() == 1 ? outs[0] : at::cat(outs, 0);
    return order.defined() ? out.index_select(0, order.to(out.device())) : out;
  };
}

TokenStats score_tree(const Model& model, const PackedTree& tree, float temperature, int32_t threads,
                      const std::vector<uint8_t>& wanted) {
  at::NoGradGuard no_grad;
  const int64_t N = tree.tokens();
  if (!wanted.empty() && static_cast<int64_t>(wanted.size()) != N)
    throw ModelError("score_tree: expected " + std::to_string(N) + " wanted flags but received " +
                     std::to_string(wanted.size()));
  TokenStats out;
  out.logprobs.assign(N, 0.0f);
  out.entropies.assign(N, 0.0f);
  std::vector<int64_t> index, rows;
  std::vector<int32_t> targets;
  for (size_t r = 0; r < tree.target_index.size(); ++r) {
    const int64_t i = tree.target_index[r];
    if (!wanted.empty() && !wanted[i]) continue;
    index.push_back(i);
    rows.push_back(tree.target_row[r]);
    targets.push_back(tree.targets[r]);
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  if (R == 0) return out;
  at::Tensor hidden = model.forward_hidden(tree.ids, tree.positions, tree_attention(tree));
  at::Tensor row_t = at::from_blob(rows.data(), {R}, at::kLong).clone();
  std::vector<float> lp(R), ent(R);
  score_rows(lp.data(), ent.data(), model, hidden.index_select(0, row_t.to(hidden.device())), targets.data(), temperature,
             threads);
  for (int64_t r = 0; r < R; ++r) {
    out.logprobs[index[r]] = lp[r];
    out.entropies[index[r]] = ent[r];
  }
  return out;
}

}  // namespace model
}  // namespace arpo
