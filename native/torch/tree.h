// Rollout trees as one packed sequence each (ARCHITECTURE.md "Training on
// trees"): every shared token is computed once. A forest of nodes in
// topological order, each a run of tokens; a token sees the tokens of its
// ancestor nodes and the earlier tokens of its own node, at the positions it
// has in its flattened trajectories, so its hidden state and logits equal
// those of every flattened copy.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "torch/engine.h"
#include "torch/model.h"

namespace arpo {
namespace model {

using TokenRange = std::pair<int64_t, int64_t>;  // [begin, end) of packed tokens

struct PackedTree {
  at::Tensor ids, positions;          // (N) int64; position = index along the root-to-leaf path
  std::vector<int32_t> parent;        // (K) -1 for roots
  std::vector<int64_t> node_offset;   // (K + 1) node k owns tokens [node_offset[k], node_offset[k + 1])
  // Every token but a root's first is a target, predicted by the row of the
  // token before it on its path: the previous token of its node, or for a
  // node's first token the last token of its nearest non-empty ancestor (so
  // one row predicts the first token of each of its children).
  std::vector<int64_t> target_index;  // (R) packed index of the predicted token
  std::vector<int64_t> target_row;    // (R) packed row whose logits predict it
  std::vector<int32_t> targets;       // (R) the predicted token ids
  std::vector<int64_t> row_of_token;  // (N) its target's row, -1 where the token is no target

  // Attention plan. A chain starts at a root or at a node that is not the
  // first (lowest-id) child of its parent and follows first children down to
  // a leaf: its queries are the chain's tokens, its keys the chain head's
  // ancestors followed by the chain itself, at contiguous positions from 0,
  // so plain causal attention with the head's position as offset is exactly
  // the ancestor-only mask. Each token is a query of exactly one chain; in
  // depth-first preorder a chain is one contiguous run of queries and the
  // chains come in token order (no gather, no reorder), and there are as
  // many chains as leaves: the flat path's attention calls, on fewer queries.
  struct Chain {
    std::vector<TokenRange> queries;  // merged runs of the chain's tokens, in path order
    std::vector<TokenRange> keys;     // merged runs of the ancestors' tokens, then the queries
    int64_t q_offset = 0;             // position of the chain's first token
  };
  std::vector<Chain> chains;
  bool chains_in_order = true;  // the chains' queries, concatenated, are tokens 0..N-1 in order

  int64_t tokens() const { return ids.size(0); }
};

// Validates and plans a forest: tokens in [0, vocab); parent[k] = -1 or an
// earlier node; node_tokens[k] >= 0, summing to tokens.size(), roots >= 1;
// every path ends by max_positions. `what` names the call in errors.
PackedTree pack_tree(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parent,
                     const std::vector<int64_t>& node_tokens, int64_t vocab, int64_t max_positions, const char* what);

// Attention of the packed forest, chain by chain (see PackedTree::Chain).
AttentionFn tree_attention(const PackedTree& tree);

// Per-token logprob and entropy (aligned to the packed tokens; 0 where a
// token is no target or `wanted` is 0) under softmax(logits / T): one no-grad
// forward, then only the wanted targets' rows through the LM head, in chunks.
// `wanted` empty = every target.
TokenStats score_tree(const Model& model, const PackedTree& tree, float temperature, int32_t threads,
                      const std::vector<uint8_t>& wanted = {});

}  // namespace model
}  // namespace arpo
