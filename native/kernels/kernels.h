// The fused kernels of arpo on plain pointers (C++17, no dependencies).
// CPU implementations live beside this header (one .cc per family); CUDA
// versions in native/cuda/ take the same arguments plus a stream.
//
// Conventions (llm.c style): outputs first, then inputs, then sizes and
// settings. Shapes in comments: (T, V) = rows x vocabulary, row-major,
// contiguous. Logits are float32, or bfloat16 passed as raw uint16 bits.
// Every kernel validates what it cannot trust and throws arpo::kernels::Error
// (never aborts); the N-API layer turns that into a JS exception.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace arpo {
namespace kernels {

struct Error : std::runtime_error {
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

enum class DType : int32_t { F32 = 0, BF16 = 1 };

// A (T, V) logits buffer: float32, or bfloat16 as raw uint16 bits.
struct Logits {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;   // T
  int64_t vocab = 0;  // V
};

// 0 = use every hardware thread; work is split over rows.
using Threads = int32_t;

// ---------------------------------------------------------------------------
// 1. Fused logits -> stats.
// One pass per row over z = logits / temperature with a running max, sum of
// exp and exp-weighted logit sum (online rescaling); never materialises
// softmax or any (T, V) temporary.
//   logsumexp[t]      = log sum_j exp(z_tj)
//   entropy[t]        = logsumexp[t] - sum_j p_tj z_tj           (nats)
//   entropy_norm[t]   = entropy[t] / log(V)       (0 when V == 1)
//   target_logprob[t] = z_t,target[t] - logsumexp[t]
// z is computed as logit * (1 / temperature) in float (CPU and CUDA alike, so
// both see bit-identical z). -inf logits carry probability 0; NaN or +inf
// logits give NaN statistics for their row. A row of all -inf has logsumexp = -inf,
// entropy = 0 and target logprob = -inf. Targets < 0 are "ignore" (logprob 0);
// targets >= V throw. Any output pointer may be null (not computed).
void logits_stats(float* logsumexp,        // (T) or null
                  float* entropy,          // (T) or null
                  float* entropy_norm,     // (T) or null
                  float* target_logprob,   // (T) or null (then targets ignored)
                  const Logits& logits,    // (T, V)
                  const int32_t* targets,  // (T) or null
                  float temperature,       // > 0
                  Threads threads);

// ---------------------------------------------------------------------------
// 2. Sampling: the stats pass plus a sampled token per row.
// temperature == 0 means greedy (argmax, lowest index on ties); the returned
// logprob and entropy are then those of the temperature-1 distribution.
// Otherwise logprob and entropy are those of the full softmax(z / temperature)
// (before top-k / top-p: the distribution the trainer recomputes), and the
// token is drawn from it restricted to the top-k tokens (top_k <= 0: all) and
// then to the smallest set of highest-probability tokens whose mass reaches
// top_p (top_p >= 1: all), renormalised.
// Randomness: Gumbel-max with a counter-based RNG (rng.h): token =
// argmax_{j allowed} z_j + g(seed, stream[t], position[t], j), so a row's
// sample depends only on its own logits and (seed, stream, position), never on
// which other rows share the batch, and CPU and CUDA agree.
struct SamplingParams {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
};
void sample_tokens(int32_t* tokens,          // (T)
                   float* logprobs,          // (T) or null
                   float* entropy,           // (T) or null: nats
                   float* entropy_norm,      // (T) or null
                   const Logits& logits,     // (T, V)
                   const uint64_t* streams,  // (T) stream id per row (e.g. path id)
                   const int64_t* positions, // (T) position per row (e.g. token index in the path)
                   const SamplingParams& params,
                   Threads threads);

// ---------------------------------------------------------------------------
// 3. Entropy change after tool calls (ARPO.md section 1).
// entropy: per-token normalised entropies of one or more paths, concatenated.
// Segment s covers entropy[starts[s], ends[s]) (a segment begins at the first
// token generated after a tool result, or at a path's first token).
//   window_mean[s] = mean of entropy over the first min(k, ends-starts) tokens
//   window_count[s] = that count (0 -> window_mean 0)
//   delta[s] = window_mean[s] - window_mean[baseline[s]]  (baseline[s] < 0 or
//              == s -> 0): baseline[s] is the index of the segment holding
//              the initial window of the trajectory segment s belongs to.
// Throws on k < 1, spans outside [0, T) or reversed, baseline >= S.
void entropy_delta(float* window_mean,       // (S)
                   int32_t* window_count,    // (S) or null
                   float* delta,             // (S) or null
                   const float* entropy,     // (T)
                   int64_t T,
                   const int64_t* starts,    // (S)
                   const int64_t* ends,      // (S)
                   const int32_t* baseline,  // (S) or null (all 0 deltas)
                   int64_t S,
                   int32_t k);

// ---------------------------------------------------------------------------
// 4. Clipped-ratio policy loss, forward + backward (ARPO.md section 4; verl
// core_algos semantics). Per token t with logp_t = log softmax(z_t)[target_t],
// z = logits / temperature:
//   neg_kl = clamp(logp - old_logp, -20, 20); ratio = exp(neg_kl)
//   pg1 = -A ratio; pg2 = -A clip(ratio, 1 - clip_low, 1 + clip_high)
//   clipped = max(pg1, pg2); pg3 = -A * dual_clip_c
//   pg = A < 0 ? min(pg3, clipped) : clipped   (dual clip only if c > 1)
//   per-token loss = pg + kl_coef * kl(logp, ref_logp) - entropy_coef * H_t
// aggregated over tokens with the mask by `aggregation`. Metrics are masked
// token means (pg_clipfrac: pg2 > pg1; pg_clipfrac_lower: A < 0 and
// clipped > pg3; ppo_kl: -neg_kl; entropy; kl).
// The gradient d loss / d logits (already divided by temperature, multiplied
// by grad_scale) is written into grad (which may alias the float32 logits
// buffer: rows are processed in chunks, each row read fully before it is
// overwritten), so no second (T, V) buffer is allocated.
// Details: targets < 0 mark ignored tokens and are allowed only where mask is
// 0 (logprob 0, zero gradient row). seq_ids may be null unless the
// aggregation is seq-mean-token-mean. A seq-mean-token-mean sequence whose
// mask sums to 0 contributes 0 (verl would give NaN). pg_loss is not
// multiplied by grad_scale; loss and grad are. Masked rows get a zero
// gradient row. Ties in max/min/clamp split or pass the gradient exactly as
// torch autograd does (maximum/minimum: half each; clamp: closed interval).
enum class KLType : int32_t { K1 = 0, K2 = 1, K3 = 2 /* low_var_kl, clamped to [-10, 10] */, ABS = 3 };
enum class Aggregation : int32_t {
  TokenMean = 0,             // sum(loss * mask) / sum(mask)
  SeqMeanTokenMean = 1,      // mean over sequences of sum(loss*mask)/sum(mask)
  SeqMeanTokenSum = 2,       // mean over sequences of sum(loss*mask)
  SeqMeanTokenSumNorm = 3,   // sum(loss * mask) / norm_constant
};
struct PolicyLossConfig {
  float clip_low = 0.2f;
  float clip_high = 0.2f;
  float dual_clip_c = 3.0f;       // <= 1 disables the dual clip
  KLType kl_type = KLType::K3;
  float kl_coef = 0.0f;           // needs ref_logprobs when != 0
  float entropy_coef = 0.0f;
  Aggregation aggregation = Aggregation::TokenMean;
  float temperature = 1.0f;
  // Denominator override for gradient accumulation: when > 0 it replaces
  // sum(mask) (token-mean), the number of sequences (seq-mean-*), or the
  // norm constant (seq-mean-token-sum-norm), so micro-batches add up to the
  // full-batch loss.
  double denominator = 0.0;
  double norm_constant = 0.0;     // seq-mean-token-sum-norm (e.g. max response length)
  float grad_scale = 1.0f;        // multiplies loss and gradient
};
struct PolicyLossResult {
  double loss = 0;                // aggregated total loss (times grad_scale)
  double pg_loss = 0;             // aggregated policy-gradient part
  double pg_clipfrac = 0;
  double pg_clipfrac_lower = 0;
  double ppo_kl = 0;
  double entropy = 0;             // masked mean entropy (nats)
  double kl = 0;                  // masked mean kl to the reference
  double tokens = 0;              // sum(mask)
};
void policy_loss(PolicyLossResult* result,
                 float* grad,                  // (T, V) float32, or null (forward only); may alias logits
                 float* logprobs,              // (T) or null: logp per token (out)
                 float* entropy,               // (T) or null: entropy per token (out)
                 const Logits& logits,         // (T, V)
                 const int32_t* targets,       // (T)
                 const float* old_logprobs,    // (T)
                 const float* advantages,      // (T)
                 const float* mask,            // (T) 0/1 (or weights)
                 const int32_t* seq_ids,       // (T) sequence index per token, >= 0
                 int64_t num_seqs,             // sequences for seq-mean-*
                 const float* ref_logprobs,    // (T) or null
                 const PolicyLossConfig& config,
                 Threads threads);

// 4b. The same loss over rows that stand for several copies of one token:
// a token shared by d trajectories of a rollout tree (ARPO.md section 2) is
// one row whose copies i carry aggregation weights w_i and advantages A_i.
// Every copy has the same ratio r, so the sum of the flat kernel's w_i loss_i
// factors by the sign of A_i:
//   sum_i w_i pg_i = S+ pg(A = +1) + |S-| pg(A = -1),
//   S+ = sum_{A_i > 0} w_i A_i,  S- = sum_{A_i < 0} w_i A_i,
// and the KL and entropy terms scale with W = sum_i w_i. pg(+-1) is the flat
// kernel's own per-token composition, so ties (r = 1 + clip_high, ...) get
// the flat gradient. The arrays hold these sums before the aggregation's
// denominator D, which the kernel divides by: config.denominator when > 0,
// else sum(count) (token-mean), num_seqs (seq-mean-*; the per-sequence
// 1 / length of seq-mean-token-mean is already in w_i) or norm_constant.
// Metrics weight each row by the masked copy counts: pg_clipfrac by
// count_pos / count_neg (the sign decides which bound clips),
// pg_clipfrac_lower by count_neg, ppo_kl / entropy / kl by count;
// result.tokens = sum(count). A row whose sums are all 0 (context) gets a
// zero gradient row and may have target < 0. old_logprobs null: ratio 1
// (old = current). Sums must be finite, S+ >= 0 >= S-, the others >= 0.
struct TokenCopySums {
  const double* adv_pos = nullptr;    // (T) S+ = sum_{A_i > 0} w_i A_i
  const double* adv_neg = nullptr;    // (T) S- = sum_{A_i < 0} w_i A_i
  const double* weight = nullptr;     // (T) W = sum_i w_i
  const double* count_pos = nullptr;  // (T) sum_{A_i > 0} m_i (mask of copy i)
  const double* count_neg = nullptr;  // (T) sum_{A_i < 0} m_i
  const double* count = nullptr;      // (T) sum_i m_i
};
void policy_loss_copies(PolicyLossResult* result,
                        float* grad,                 // (T, V) float32, or null; may alias logits
                        float* logprobs,             // (T) or null (out)
                        float* entropy,              // (T) or null (out)
                        const Logits& logits,        // (T, V)
                        const int32_t* targets,      // (T)
                        const float* old_logprobs,   // (T) or null (ratio 1)
                        const TokenCopySums& sums,   // (T) each
                        int64_t num_seqs,            // sequences for seq-mean-* when denominator is 0
                        const float* ref_logprobs,   // (T) or null
                        const PolicyLossConfig& config,
                        Threads threads);

// ---------------------------------------------------------------------------
// 5. Tree advantage reduction (ARPO.md section 2).
// Nodes 0..N-1 of one or more rollout trees in topological order
// (parent[n] < n, roots have parent -1). Leaf l sits at node leaf_node[l]
// with advantage leaf_adv[l]. For every node:
//   node_sum[n]   = sum of leaf_adv over leaves in n's subtree
//   node_count[n] = number of those leaves
//   node_mean[n]  = node_sum / node_count (0 when count is 0)
// Soft attribution gives a node's tokens node_sum (the packed-tree view of
// GRPO on flattened trajectories); hard gives node_mean, counted once.
void tree_reduce(float* node_sum,           // (N) or null
                 float* node_mean,          // (N) or null
                 int32_t* node_count,       // (N) or null
                 const int32_t* parent,     // (N)
                 int64_t N,
                 const int32_t* leaf_node,  // (L)
                 const float* leaf_adv,     // (L)
                 int64_t L);

// Weighted reduction split by the sign of the leaf advantage (the copy sums
// of policy_loss_copies, per node): for every node n, over the leaves l in
// its subtree,
//   pos_sum[n] = sum_{adv_l > 0} weight_l adv_l    neg_sum[n] = sum_{adv_l < 0} weight_l adv_l
//   weight_sum[n] = sum weight_l
//   pos_count[n] / neg_count[n] / count[n] = number of leaves with adv > 0 / adv < 0 / any
// Accumulated in float64 children-before-parents, so a node's sums do not
// depend on how many nodes the trees have.
void tree_reduce_signed(double* pos_sum,          // (N) or null
                        double* neg_sum,          // (N) or null
                        double* weight_sum,       // (N) or null
                        int32_t* pos_count,       // (N) or null
                        int32_t* neg_count,       // (N) or null
                        int32_t* count,           // (N) or null
                        const int32_t* parent,    // (N)
                        int64_t N,
                        const int32_t* leaf_node, // (L)
                        const double* leaf_adv,   // (L) finite
                        const double* leaf_weight,// (L) finite, >= 0
                        int64_t L);

// Per-token expansion: token_value[i] = node_value[node] for every token i in
// [token_offset[node], token_offset[node] + token_count[node]); tokens not
// covered by any node are left untouched. Throws on spans outside [0, P).
void tree_expand(float* token_value,          // (P)
                 int64_t P,
                 const float* node_value,     // (N)
                 const int64_t* token_offset, // (N)
                 const int64_t* token_count,  // (N)
                 int64_t N);

// ---------------------------------------------------------------------------
// 5. Decode-time ops of the policy model (CPU inference, no autograd).
// The composition of torch ops they replace (native/torch/model.cc,
// engine.cc) costs ~100 op dispatches per layer; at the demo model's size that
// dispatch, not arithmetic, is most of a decode step. Each op works on rows
// [begin, end) so the caller can split them over threads; T is float or
// double, accumulation is float for float and double for double (as the
// composition's accum_dtype).
//
// rms_norm_rows: out[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps), over
// rows of `dim`; out may alias x.
void rms_norm_rows(float* out, const float* x, const float* weight, int64_t dim, double eps, int64_t begin, int64_t end);
void rms_norm_rows(double* out, const double* x, const double* weight, int64_t dim, double eps, int64_t begin,
                   int64_t end);

// rope_rows: rotary embedding in place on x (rows, heads, dim), HF layout
// (rotate_half): x' = x * cos + [-x2, x1] * sin, cos/sin (rows, dim) the
// per-row tables (cat(angles, angles), cast to T).
void rope_rows(float* x, const float* cos, const float* sin, int64_t heads, int64_t dim, int64_t begin, int64_t end);
void rope_rows(double* x, const double* cos, const double* sin, int64_t heads, int64_t dim, int64_t begin,
               int64_t end);

// paged_decode_attention: query rows over their cached context, read in
// place from the KV pool (no gather). Group b is counts[b] consecutive query
// rows rows[b] + t of q (N, H, D) (t < counts[b]; one row without counts)
// that read one slot list list_b over growing prefixes, lengths[b] + t keys
// for row t (a multi-token path's causal attention; a decode row is a group
// of one). For row r = rows[b] + t, head h, kv head kvh = h / (H / KVH):
//   s_j = scale * <q[r, h], kpool[list_b[j], kvh]>,  j < lengths[b] + t
//   out[r, h] = sum_j softmax(s)_j vpool[list_b[j], kvh]
// list_b = slots + b * max_ctx (slots (B, max_ctx) row-major), or, with
// offsets, slots + offsets[b] (a flat list of slot_count entries).
// kpool/vpool (pool slots, KVH, D); out (N, H * D). Work items are
// (b, kv head) pairs: [begin, end) within B * KVH. A row's sums run in one
// order that depends on its own length and D alone (interleaved partial sums
// added in a fixed tree), never on its group or the other rows.
struct DecodeAttention {
  const int64_t* rows = nullptr;     // (B): first query row of each group
  const int64_t* slots = nullptr;    // (B, max_ctx), or slot_count entries with offsets
  const int64_t* lengths = nullptr;  // (B): keys of the group's first row; the last's, lengths + counts - 1, <= max_ctx
  const int64_t* counts = nullptr;   // (B) or null (one row per group)
  const int64_t* offsets = nullptr;  // (B) or null: where group b's list starts in slots
  int64_t slot_count = 0;            // entries in slots (checked with offsets)
  int64_t paths = 0;                 // B
  int64_t max_ctx = 0;
  int64_t heads = 0;     // H
  int64_t kv_heads = 0;  // KVH, divides H
  int64_t head_dim = 0;  // D
  int64_t pool_slots = 0;
  double scale = 1.0;
};
void paged_decode_attention(float* out, const float* q, const float* kpool, const float* vpool,
                            const DecodeAttention& a, int64_t begin, int64_t end);
void paged_decode_attention(double* out, const double* q, const double* kpool, const double* vpool,
                            const DecodeAttention& a, int64_t begin, int64_t end);

// linear_rows: out (M, N) = x (M, K) W^T + bias for W (N, K) row-major (a
// torch Linear's weight, read in place: no packed copy per call, which is
// what a BLAS sgemm makes of W and what dominated few-row decode calls);
// bias may be null. Work items are the N outputs: [begin, end) within N.
// Each output's sum runs in one order that depends on K alone (vector lanes
// over K, a fixed tree of lanes, the K % width tail, then the bias), never on
// M, the other rows or the thread split: a row's result is the same in any
// batch.
void linear_rows(float* out, const float* x, const float* W, const float* bias, int64_t M, int64_t K, int64_t N,
                 int64_t begin, int64_t end);
void linear_rows(double* out, const double* x, const double* W, const double* bias, int64_t M, int64_t K, int64_t N,
                 int64_t begin, int64_t end);

// ---------------------------------------------------------------------------
// Benchmark baseline (not a training kernel): sum of n floats read once with
// the same blocking as logits_stats, so "stats time / plain_sum time" says
// how close the fused kernel is to memory bandwidth.
double plain_sum(const float* x, int64_t n, Threads threads);

}  // namespace kernels
}  // namespace arpo
