// Training: the fused policy loss as an autograd function (kernels::policy_loss
// writes d loss / d logits into the logits buffer), AdamW with explicit state,
// the LR schedule, and one optimiser step over gradient-accumulated micro-batches.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "torch/dist.h"
#include "torch/engine.h"
#include "torch/model.h"
#include "torch/tree.h"

namespace arpo {
namespace model {

// One micro-batch of packed sequences. Per-token arrays are aligned to
// `tokens`: entry t concerns token t as predicted from the tokens before it;
// a sequence's first token is never predicted (its entries are ignored).
// mask 0 marks context (prompt, tool results), 1 actions.
struct MicroBatch {
  std::vector<int32_t> tokens;        // (N) all sequences, concatenated
  std::vector<int64_t> lengths;       // (S)
  std::vector<float> old_logprobs;    // (N) policy loss only
  std::vector<float> advantages;      // (N) policy loss only
  std::vector<float> mask;            // (N)
  std::vector<float> ref_logprobs;    // (N) or empty: computed by the reference model when kl_coef != 0
};

// One micro-batch of packed rollout trees (torch/tree.h) for the policy loss:
// every shared token once. Per-token arrays are aligned to `tokens`: entry i
// concerns token i as a target, predicted from the tokens before it on its
// path (a root's first token is never one). The copy sums are those of
// kernels::policy_loss_copies, before the aggregation's denominator; a token
// whose sums are all 0 is context (the prompt, tool results, or ancestors
// whose loss terms another micro-batch of the same step carries): it is
// computed, with gradient, but adds no loss term of its own.
struct TreeMicroBatch {
  std::vector<int32_t> tokens;       // (N) the nodes' tokens, node after node
  std::vector<int32_t> parent;       // (K) -1 for roots, else an earlier node
  std::vector<int64_t> node_tokens;  // (K) tokens per node
  std::vector<float> old_logprobs;   // (N)
  std::vector<float> ref_logprobs;   // (N) or empty: computed by the reference model when kl_coef != 0
  std::vector<double> adv_pos, adv_neg, weight, count_pos, count_neg, count;  // (N) each
  int64_t sequences = 0;             // trajectories whose loss terms it carries (seq-mean denominators)
};

enum class LossMode { Policy, SFT };
enum class Schedule { Constant, Linear, Cosine };

struct OptimConfig {
  double lr = 1e-6;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.01;  // decoupled (AdamW), on every parameter as verl's FSDP optimiser does
  double max_grad_norm = 1.0;  // <= 0: no clipping
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;     // for linear / cosine decay (0: treated as constant after warmup)
  Schedule schedule = Schedule::Constant;
  double min_lr_ratio = 0.0;   // floor of the decay, as a fraction of lr
};

// Learning rate for the update numbered `step` (0-based: updates done before it).
// Warmup: lr * (step + 1) / warmup_steps; then constant, or linear / cosine
// decay from lr to min_lr_ratio * lr over [warmup_steps, total_steps].
double scheduled_lr(const OptimConfig& config, int64_t step);

// AdamW (Loshchilov & Hutter 2019) as torch.optim.AdamW computes it:
//   p <- p * (1 - lr * wd)
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Moments are float32 (float64 for float64 parameters). Mixed precision: a
// bfloat16 (or float16) parameter gets a float32 master copy, which the update
// is applied to; the parameter is then its rounding, so updates smaller than
// the low precision's resolution accumulate instead of vanishing. A parameter
// written from outside (a load, a broadcast) no longer equals its master's
// rounding: the master is re-read from it before the next update.
class AdamW {
 public:
  explicit AdamW(const NamedTensors& params);
  void step(const NamedTensors& params, double lr, const OptimConfig& config);
  int64_t steps() const { return step_; }
  // "<param>.exp_avg", "<param>.exp_avg_sq" per parameter, "<param>.master"
  // per low-precision parameter, and "step" (int64 scalar).
  NamedTensors state() const;
  // Exact resume: every moment must be present with its parameter's shape; a
  // missing master (a file from before master weights) is taken from the parameter.
  void load_state(const NamedTensors& state);
  // The float32 master of parameter i (undefined for float32 / float64 parameters).
  const at::Tensor& master(size_t i) const { return master_[i]; }

 private:
  std::vector<std::string> names_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_, master_;
  int64_t step_ = 0;
};

struct TrainMetrics {
  double loss = 0, pg_loss = 0, pg_clipfrac = 0, pg_clipfrac_lower = 0, ppo_kl = 0, entropy = 0, kl = 0;
  double grad_norm = 0, lr = 0, tokens = 0;
  int64_t step = 0;          // optimiser steps done after this one
  bool skipped = false;      // non-finite gradient norm: no update applied
  double comm_seconds = 0;   // data parallel: wall time in collectives (denominators, metrics, gradients)
};

// Loss of one micro-batch as an autograd node over logits (R, V) float32:
// forward runs kernels::policy_loss with grad aliasing the logits buffer (no
// second (R, V) buffer, no saved log-softmax); backward returns that buffer
// times grad_output. `config.denominator` must already be the full-batch one.
// SFT mode: loss = sum(mask * -logp) / denominator, computed with the same
// kernel at ratio 1 (old logprobs = current, advantages = 1, no KL), whose
// gradient -d ratio/d logits equals -d logp/d logits there.
at::Tensor fused_policy_loss(const at::Tensor& logits, const std::vector<int32_t>& targets,
                             const std::vector<float>& old_logprobs, const std::vector<float>& advantages,
                             const std::vector<float>& mask, const std::vector<int32_t>& seq_ids, int64_t num_seqs,
                             const std::vector<float>& ref_logprobs, const kernels::PolicyLossConfig& config,
                             LossMode mode, int32_t threads, kernels::PolicyLossResult* result);

// Per-row inputs of chunked_head_loss (R rows each; old_logprobs and
// ref_logprobs may be empty: ratio 1, no KL).
struct HeadLossInputs {
  std::vector<int32_t> targets;
  std::vector<float> old_logprobs, ref_logprobs;
  std::vector<double> adv_pos, adv_neg, weight, count_pos, count_neg, count;
  int64_t num_seqs = 0;
};

// The LM head fused with the copies loss (Liger's fused linear cross-entropy
// pattern), as an autograd node over normed hidden rows x (R, hidden) and the
// head weight W (V, hidden): per chunk of `chunk_rows` rows (0: ~64 MiB of
// float32 logits), logits = x_c W^T -> kernels::policy_loss_copies writes
// d loss / d logits in place -> d x_c = g W and d W += g^T x_c. The forward
// keeps only those two gradients (the size of x and of W's gradient), never a
// logits buffer beyond one chunk. `config.denominator` must be the full
// batch's. `result` gets the loss and the metrics as means over its tokens.
at::Tensor chunked_head_loss(const at::Tensor& x, const at::Tensor& W, const HeadLossInputs& inputs,
                             const kernels::PolicyLossConfig& config, int64_t chunk_rows, int32_t threads,
                             kernels::PolicyLossResult* result);

// One optimiser step: per micro-batch forward + fused loss + backward
// (gradients accumulate; the loss denominator is the full batch's unless
// config.denominator is set), gradient clipping to max_grad_norm, AdamW at
// scheduled_lr(optimizer.steps()). `reference` (may be null) supplies
// ref_logprobs when kl_coef != 0 and a micro-batch does not carry them.
//
// Data parallel (`group` with more than one rank, issue 16): each rank passes
// its own micro-batches (possibly none; unequal token counts are the normal
// case) and every rank must call it the same number of times. The
// denominators are the sums over ranks, so each rank's loss is its share of
// the global loss; after backward the gradients are summed over ranks (one
// flat buffer per ~32 MiB bucket, after the whole backward: no overlap), then
// the norm, clipping and AdamW run identically everywhere, and the metrics are
// those of the global batch. Equals one process training on every rank's
// micro-batches (native/test/torch/dist_train_test.cc).
TrainMetrics train_step(Model& model, AdamW& optimizer, const std::vector<MicroBatch>& batches,
                        kernels::PolicyLossConfig loss_config, LossMode mode, const OptimConfig& optim,
                        const Model* reference, int32_t threads, dist::Group* group = nullptr);

// train_step on packed trees: per micro-batch one forward of the forest
// (ancestor attention), the LM head and copies loss over the rows of its
// loss-carrying targets only (chunked_head_loss), backward; then the same
// clipping and AdamW. Denominators are the step's: token-mean sum(count) over
// every micro-batch, seq-mean-* the sum of `sequences`. Equals train_step on
// the flattened trajectories (tests: native/test/torch/tree_test.cc).
// `chunk_rows` as for chunked_head_loss; `group` as for train_step.
TrainMetrics train_tree_step(Model& model, AdamW& optimizer, const std::vector<TreeMicroBatch>& batches,
                             kernels::PolicyLossConfig loss_config, const OptimConfig& optim, const Model* reference,
                             int32_t threads, int64_t chunk_rows = 0, dist::Group* group = nullptr);

// Data parallel: every parameter
// becomes rank `root`'s, so all ranks start from the same weights.
void broadcast_parameters(Model& model, dist::Group& group, int root);

}  // namespace model
}  // namespace arpo
