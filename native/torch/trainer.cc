// The training step: fused policy-loss autograd node, AdamW with explicit
// state, LR schedule, gradient accumulation and clipping (see trainer.h).
#include "torch/trainer.h"

#include "torch/device.h"

#include <torch/csrc/autograd/custom_function.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <unordered_map>

namespace arpo {
namespace model {

namespace {

// Per-row inputs of one fused-loss call (rows of the (R, V) logits).
struct LossArgs {
  const std::vector<int32_t>* targets;
  const std::vector<float>* old_logprobs;
  const std::vector<float>* advantages;
  const std::vector<float>* mask;
  const std::vector<int32_t>* seq_ids;
  int64_t num_seqs;
  const std::vector<float>* ref_logprobs;  // empty: none
  kernels::PolicyLossConfig config;
  LossMode mode;
  int32_t threads;
  kernels::PolicyLossResult* result;
};

struct FusedPolicyLoss : public torch::autograd::Function<FusedPolicyLoss> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor logits, const LossArgs* args) {
    const int64_t R = logits.size(0), V = logits.size(1);
    TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.is_contiguous(), "fused loss needs contiguous float32 logits");
    (void)V;
    kernels::PolicyLossConfig cfg = args->config;
    const std::vector<float>* old_lp = args->old_logprobs;
    std::vector<float> ones, current;
    if (args->mode == LossMode::SFT) {
      // Ratio 1 everywhere: old logprobs are the current ones and A = 1, so the
      // kernel's gradient is -d ratio/d z = -d logp/d z, the NLL gradient.
      current.assign(R, 0.0f);
      dispatch::logits_stats(current.data(), nullptr, logits, args->targets->data(), cfg.temperature, args->threads);
      ones.assign(R, 1.0f);
      old_lp = &current;
      cfg.kl_coef = 0;
      cfg.entropy_coef = 0;
      cfg.aggregation = kernels::Aggregation::TokenMean;
    }
    const float* adv = args->mode == LossMode::SFT ? ones.data() : args->advantages->data();
    const float* ref = args->ref_logprobs->empty() ? nullptr : args->ref_logprobs->data();
    std::vector<float> logprobs(R);
    // The logits become d loss / d logits in place.
    dispatch::policy_loss(args->result, logprobs.data(), logits, args->targets->data(), old_lp->data(), adv,
                          args->mask->data(), args->seq_ids->data(), args->num_seqs, ref, cfg, args->threads);
    if (args->mode == LossMode::SFT) {
      double nll = 0;
      for (int64_t r = 0; r < R; ++r) nll -= static_cast<double>((*args->mask)[r]) * logprobs[r];
      const double denom = cfg.denominator > 0 ? cfg.denominator : args->result->tokens;
      nll = denom > 0 ? nll / denom : 0.0;
      args->result->pg_loss = nll;
      args->result->loss = nll * cfg.grad_scale;
    }
    // The buffer now holds d loss / d logits; keep it (not the log-softmax).
    ctx->saved_data["grad"] = logits;
    return at::scalar_tensor(args->result->loss, at::kDouble);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    at::Tensor grad = ctx->saved_data["grad"].toTensor();
    return {grad * grad_outputs[0].to(at::kFloat), at::Tensor()};
  }
};

struct HeadLossArgs {
  const HeadLossInputs* in;
  kernels::PolicyLossConfig config;
  int64_t chunk_rows;
  int32_t threads;
  kernels::PolicyLossResult* result;
};

struct ChunkedHeadLoss : public torch::autograd::Function<ChunkedHeadLoss> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor x, at::Tensor W, const HeadLossArgs* args) {
    const HeadLossInputs& in = *args->in;
    const int64_t R = x.size(0), V = W.size(0);
    // 64 MiB of float32 logits per chunk: 110 rows at V = 151,936, i.e. 1/37
    // of the (4096, V) buffer of a 4,096-token micro-batch.
    const int64_t chunk = args->chunk_rows > 0 ? args->chunk_rows : std::max<int64_t>(1, (int64_t{64} << 20) / (4 * V));
    at::Tensor gx = at::empty_like(x), gW = at::zeros_like(W);
    double loss = 0, pg = 0, clip = 0, clip_lower = 0, ppo_kl = 0, ent = 0, kl = 0, tokens = 0;
    auto at_row = [](const auto& v, int64_t a) { return v.empty() ? nullptr : v.data() + a; };
    for (int64_t a = 0; a < R; a += chunk) {
      const int64_t b = std::min(R, a + chunk);
      at::Tensor xc = x.slice(0, a, b);
      at::Tensor logits = at::linear(xc, W).to(at::kFloat).contiguous();  // (b - a, V)
      kernels::TokenCopySums sums{in.adv_pos.data() + a, in.adv_neg.data() + a, in.weight.data() + a,
                                  in.count_pos.data() + a, in.count_neg.data() + a, in.count.data() + a};
      kernels::PolicyLossResult r;
      dispatch::policy_loss_copies(&r, logits, in.targets.data() + a, at_row(in.old_logprobs, a), sums, in.num_seqs,
                                   at_row(in.ref_logprobs, a), args->config, args->threads);
      at::Tensor g = logits.to(x.scalar_type());  // d loss / d logits of the chunk (in place of the logits)
      gx.slice(0, a, b).copy_(at::mm(g, W));
      gW.addmm_(g.t(), xc);
      loss += r.loss;
      pg += r.pg_loss;
      clip += r.pg_clipfrac * r.tokens;
      clip_lower += r.pg_clipfrac_lower * r.tokens;
      ppo_kl += r.ppo_kl * r.tokens;
      ent += r.entropy * r.tokens;
      kl += r.kl * r.tokens;
      tokens += r.tokens;
    }
    kernels::PolicyLossResult& res = *args->result;
    res = kernels::PolicyLossResult{};
    res.loss = loss;
    res.pg_loss = pg;
    res.tokens = tokens;
    if (tokens != 0) {
      res.pg_clipfrac = clip / tokens;
      res.pg_clipfrac_lower = clip_lower / tokens;
      res.ppo_kl = ppo_kl / tokens;
      res.entropy = ent / tokens;
      res.kl = kl / tokens;
    }
    ctx->saved_data["gx"] = gx;
    ctx->saved_data["gW"] = gW;
    return at::scalar_tensor(loss, at::kDouble);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    at::Tensor gx = ctx->saved_data["gx"].toTensor(), gW = ctx->saved_data["gW"].toTensor();
    return {gx * grad_outputs[0].to(gx.scalar_type()), gW * grad_outputs[0].to(gW.scalar_type()), at::Tensor()};
  }
};

double denominator_for(const kernels::PolicyLossConfig& cfg, LossMode mode, double masked_tokens, double sequences) {
  if (cfg.denominator > 0) return cfg.denominator;
  if (mode == LossMode::SFT) return masked_tokens;
  switch (cfg.aggregation) {
    case kernels::Aggregation::TokenMean: return masked_tokens;
    case kernels::Aggregation::SeqMeanTokenMean:
    case kernels::Aggregation::SeqMeanTokenSum: return sequences;
    case kernels::Aggregation::SeqMeanTokenSumNorm: return 0.0;  // the kernel uses norm_constant
  }
  return 0.0;
}

at::ScalarType moment_dtype(const at::Tensor& p) {
  return p.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace

at::Tensor fused_policy_loss(const at::Tensor& logits, const std::vector<int32_t>& targets,
                             const std::vector<float>& old_logprobs, const std::vector<float>& advantages,
                             const std::vector<float>& mask, const std::vector<int32_t>& seq_ids, int64_t num_seqs,
                             const std::vector<float>& ref_logprobs, const kernels::PolicyLossConfig& config,
                             LossMode mode, int32_t threads, kernels::PolicyLossResult* result) {
  const size_t R = static_cast<size_t>(logits.size(0));
  auto check = [&](const std::vector<float>& v, const char* name, bool required) {
    if ((required || !v.empty()) && v.size() != R)
      throw ModelError(std::string("policy loss: expected ") + std::to_string(R) + " values for " + name +
                       " but received " + std::to_string(v.size()));
  };
  if (targets.size() != R || seq_ids.size() != R) throw ModelError("policy loss: targets / seq_ids do not match the logits rows");
  check(mask, "mask", true);
  check(old_logprobs, "old_logprobs", mode == LossMode::Policy);
  check(advantages, "advantages", mode == LossMode::Policy);
  check(ref_logprobs, "ref_logprobs", false);
  if (mode == LossMode::Policy && config.kl_coef != 0 && ref_logprobs.empty())
    throw ModelError("policy loss: kl_coef is " + std::to_string(config.kl_coef) + " but no reference logprobs were given");
  LossArgs args{&targets, &old_logprobs, &advantages, &mask, &seq_ids, num_seqs, &ref_logprobs, config, mode, threads, result};
  return FusedPolicyLoss::apply(logits, &args);
}

at::Tensor chunked_head_loss(const at::Tensor& x, const at::Tensor& W, const HeadLossInputs& in,
                             const kernels::PolicyLossConfig& config, int64_t chunk_rows, int32_t threads,
                             kernels::PolicyLossResult* result) {
  const size_t R = static_cast<size_t>(x.size(0));
  auto check = [&](size_t n, const char* name, bool required) {
    if ((required || n != 0) && n != R)
      throw ModelError(std::string("head loss: expected ") + std::to_string(R) + " values for " + name +
                       " but received " + std::to_string(n));
  };
  check(in.targets.size(), "targets", true);
  check(in.old_logprobs.size(), "old_logprobs", false);
  check(in.ref_logprobs.size(), "ref_logprobs", false);
  for (const auto* v : {&in.adv_pos, &in.adv_neg, &in.weight, &in.count_pos, &in.count_neg, &in.count})
    check(v->size(), "the copy sums", true);
  if (x.dim() != 2 || W.dim() != 2 || x.size(1) != W.size(1))
    throw ModelError("head loss: expected rows (R, H) and a head weight (V, H) but received " + shape_string(x.sizes()) +
                     " and " + shape_string(W.sizes()));
  HeadLossArgs args{&in, config, chunk_rows, threads, result};
  return ChunkedHeadLoss::apply(x, W, &args);
}

double scheduled_lr(const OptimConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step < c.warmup_steps)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  if (c.schedule == Schedule::Constant || c.total_steps <= c.warmup_steps) return c.lr;
  double progress = static_cast<double>(step - c.warmup_steps) / static_cast<double>(c.total_steps - c.warmup_steps);
  progress = std::min(1.0, std::max(0.0, progress));
  const double floor = c.lr * c.min_lr_ratio;
  if (c.schedule == Schedule::Linear) return floor + (c.lr - floor) * (1.0 - progress);
  return floor + (c.lr - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

// ---------------------------------------------------------------- AdamW

namespace {
bool low_precision(const at::Tensor& p) { return p.scalar_type() == at::kBFloat16 || p.scalar_type() == at::kHalf; }
}  // namespace

AdamW::AdamW(const NamedTensors& params) {
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    names_.push_back(name);
    const auto moments = at::TensorOptions().dtype(moment_dtype(p)).device(p.device());  // on the parameter's device
    exp_avg_.push_back(at::zeros(p.sizes(), moments));
    exp_avg_sq_.push_back(at::zeros(p.sizes(), moments));
    master_.push_back(low_precision(p) ? p.detach().to(at::kFloat).contiguous() : at::Tensor());
  }
}

void AdamW::step(const NamedTensors& params, double lr, const OptimConfig& c) {
  if (params.size() != names_.size()) throw ModelError("AdamW: parameter list changed size");
  at::NoGradGuard no_grad;
  ++step_;
  const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(step_));
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i].second;
    const at::Tensor& grad = p.grad();
    if (!grad.defined()) continue;  // as torch.optim: parameters without a gradient are left alone
    at::Tensor& m = exp_avg_[i];
    at::Tensor& v = exp_avg_sq_[i];
    at::Tensor g = grad.to(m.scalar_type());
    at::Tensor& master = master_[i];
    // A parameter written from outside since the last update: its master follows it.
    if (master.defined() && !master.to(p.scalar_type()).equal(p)) master.copy_(p);
    at::Tensor pw = master.defined() ? master : p.to(m.scalar_type());  // p itself when dtypes match
    if (c.weight_decay != 0) pw.mul_(1.0 - lr * c.weight_decay);
    m.mul_(c.beta1).add_(g, 1.0 - c.beta1);
    v.mul_(c.beta2).addcmul_(g, g, 1.0 - c.beta2);
    at::Tensor denom = (v.sqrt() / std::sqrt(bc2)).add_(c.eps);
    pw.addcdiv_(m, denom, -lr / bc1);
    if (!pw.is_same(p)) p.copy_(pw);
  }
}

NamedTensors AdamW::state() const {
  NamedTensors out;
  for (size_t i = 0; i < names_.size(); ++i) {
    out.emplace_back(names_[i] + ".exp_avg", exp_avg_[i]);
    out.emplace_back(names_[i] + ".exp_avg_sq", exp_avg_sq_[i]);
    if (master_[i].defined()) out.emplace_back(names_[i] + ".master", master_[i]);
  }
  at::Tensor step = at::empty({1}, at::kLong);
  step.data_ptr<int64_t>()[0] = step_;
  out.emplace_back("step", step);
  return out;
}

void AdamW::load_state(const NamedTensors& state) {
  std::unordered_map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : state) by_name.emplace(name, &t);
  auto take = [&](const std::string& name, const at::Tensor& like) -> const at::Tensor& {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw ModelError("optimizer state: missing tensor " + name);
    if (it->second->sizes() != like.sizes())
      throw ModelError("optimizer state: tensor " + name + ": expected shape " + shape_string(like.sizes()) +
                       " but received " + shape_string(it->second->sizes()));
    return *it->second;
  };
  const at::Tensor& step = take("step", at::empty({1}));
  for (size_t i = 0; i < names_.size(); ++i) {
    take(names_[i] + ".exp_avg", exp_avg_[i]);
    take(names_[i] + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < names_.size(); ++i) {
    if (!master_[i].defined()) continue;
    auto it = by_name.find(names_[i] + ".master");
    if (it != by_name.end() && it->second->sizes() != master_[i].sizes())
      throw ModelError("optimizer state: tensor " + names_[i] + ".master: expected shape " + shape_string(master_[i].sizes()) +
                       " but received " + shape_string(it->second->sizes()));
  }
  for (size_t i = 0; i < names_.size(); ++i) {
    exp_avg_[i].copy_(*by_name.at(names_[i] + ".exp_avg"));
    exp_avg_sq_[i].copy_(*by_name.at(names_[i] + ".exp_avg_sq"));
    if (master_[i].defined()) {
      auto it = by_name.find(names_[i] + ".master");
      if (it != by_name.end()) master_[i].copy_(*it->second);
    }
  }
  step_ = step.to(at::kLong).data_ptr<int64_t>()[0];
}

// ---------------------------------------------------------------- train_step

namespace {

bool distributed(const dist::Group* g) { return g != nullptr && g->world() > 1; }

// Adds the wall time of its scope to *seconds.
struct CommTimer {
  double* seconds;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~CommTimer() { *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
};

// Elementwise sums over ranks of a few doubles (denominators, metric sums).
void allreduce_doubles(dist::Group* g, std::vector<double>& v, double* seconds) {
  if (!distributed(g) || v.empty()) return;
  CommTimer timer{seconds};
  std::vector<at::Tensor> t{at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kDouble).clone()};
  g->allreduce_sum(t);
  std::memcpy(v.data(), t[0].data_ptr<double>(), v.size() * sizeof(double));
}

// Gradients summed over ranks. A parameter without a gradient anywhere stays
// without one (AdamW leaves it alone, as in one process); one that has a
// gradient on some rank gets zeros where it has none. Buckets of ~32 MiB of
// flattened gradients, one allreduce each, in parameter order.
void allreduce_grads(dist::Group* g, const NamedTensors& params, double* seconds) {
  if (!distributed(g)) return;
  std::vector<double> has(params.size());
  for (size_t i = 0; i < params.size(); ++i) has[i] = params[i].second.grad().defined() ? 1 : 0;
  allreduce_doubles(g, has, seconds);
  CommTimer timer{seconds};
  constexpr int64_t kBucketBytes = int64_t{32} << 20;
  std::vector<size_t> bucket;
  int64_t bytes = 0;
  auto flush = [&] {
    if (bucket.empty()) return;
    std::vector<at::Tensor> flat;
    for (size_t i : bucket) flat.push_back(params[i].second.grad().reshape({-1}));
    std::vector<at::Tensor> buf{at::cat(flat).to(at::kCPU)};  // Gloo reduces host memory (a no-op on the CPU)
    g->allreduce_sum(buf);
    int64_t off = 0;
    for (size_t i : bucket) {
      at::Tensor grad = params[i].second.grad();
      grad.copy_(buf[0].narrow(0, off, grad.numel()).view(grad.sizes()));
      off += grad.numel();
    }
    bucket.clear();
    bytes = 0;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    if (has[i] == 0) continue;
    const at::Tensor& p = params[i].second;
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    if (!bucket.empty() && params[bucket[0]].second.scalar_type() != p.scalar_type()) flush();
    bucket.push_back(i);
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
    if (bytes >= kBucketBytes) flush();
  }
  flush();
}

// The end of a step, shared by both forms: the metric sums and gradients
// summed over ranks (data parallel), metric means, the global gradient
// norm (torch.nn.utils.clip_grad_norm_, L2 over all parameters), clipping,
// AdamW at the scheduled lr (a non-finite norm skips the update, as verl
// does), gradients cleared.
void finish_step(Model& model, AdamW& optimizer, const OptimConfig& optim, TrainMetrics& m, dist::Group* group) {
  if (distributed(group)) {
    std::vector<double> sums{m.loss, m.pg_loss, m.pg_clipfrac, m.pg_clipfrac_lower, m.ppo_kl, m.entropy, m.kl, m.tokens};
    allreduce_doubles(group, sums, &m.comm_seconds);
    m.loss = sums[0], m.pg_loss = sums[1], m.pg_clipfrac = sums[2], m.pg_clipfrac_lower = sums[3];
    m.ppo_kl = sums[4], m.entropy = sums[5], m.kl = sums[6], m.tokens = sums[7];
  }
  if (m.tokens > 0) {
    m.pg_clipfrac /= m.tokens;
    m.pg_clipfrac_lower /= m.tokens;
    m.ppo_kl /= m.tokens;
    m.entropy /= m.tokens;
    m.kl /= m.tokens;
  }
  const NamedTensors& params = model.named_tensors();
  at::NoGradGuard no_grad;
  allreduce_grads(group, params, &m.comm_seconds);
  // Squares summed in float64 in parameter order on the device, read back once.
  at::Tensor sq;
  for (const auto& [name, p] : params) {
    if (!p.grad().defined()) continue;
    at::Tensor s = p.grad().to(at::kDouble).pow(2).sum();
    sq = sq.defined() ? sq + s : s;
  }
  m.grad_norm = sq.defined() ? std::sqrt(sq.item<double>()) : 0.0;
  m.lr = scheduled_lr(optim, optimizer.steps());
  if (!std::isfinite(m.grad_norm)) {
    m.skipped = true;  // as verl: a non-finite gradient skips the update
  } else {
    if (optim.max_grad_norm > 0 && m.grad_norm > optim.max_grad_norm) {
      const double coef = optim.max_grad_norm / (m.grad_norm + 1e-6);
      for (const auto& [name, p] : params)
        if (p.grad().defined()) p.grad().mul_(coef);
    }
    optimizer.step(params, m.lr, optim);
  }
  for (const auto& [name, p] : params) p.mutable_grad() = at::Tensor();
  m.step = optimizer.steps();
}

// Adds one loss call's result to the step's sums (metrics weighted by tokens).
void accumulate(TrainMetrics& m, const kernels::PolicyLossResult& res) {
  m.loss += res.loss;
  m.pg_loss += res.pg_loss;
  m.pg_clipfrac += res.pg_clipfrac * res.tokens;
  m.pg_clipfrac_lower += res.pg_clipfrac_lower * res.tokens;
  m.ppo_kl += res.ppo_kl * res.tokens;
  m.entropy += res.entropy * res.tokens;
  m.kl += res.kl * res.tokens;
  m.tokens += res.tokens;
}

}  // namespace


TrainMetrics train_step(Model& model, AdamW& optimizer, const std::vector<MicroBatch>& batches,
                        kernels::PolicyLossConfig loss_config, LossMode mode, const OptimConfig& optim,
                        const Model* reference, int32_t threads, dist::Group* group) {
  const ModelConfig& c = model.config();
  if (batches.empty() && !distributed(group)) throw ModelError("trainStep: expected at least one micro-batch");
  const bool need_ref = mode == LossMode::Policy && loss_config.kl_coef != 0;

  // Pack and validate everything before any gradient is touched.
  std::vector<PackedSequences> packed;
  double masked_tokens = 0, sequences = 0;
  for (size_t b = 0; b < batches.size(); ++b) {
    const MicroBatch& mb = batches[b];
    const std::string what = "trainStep micro-batch " + std::to_string(b);
    packed.push_back(pack_sequences(mb.tokens, mb.lengths, c.vocab_size, c.max_position_embeddings, what.c_str()));
    const size_t N = mb.tokens.size();
    auto check = [&](const std::vector<float>& v, const char* name, bool required) {
      if ((required || !v.empty()) && v.size() != N)
        throw ModelError(what + ": expected " + std::to_string(N) + " values for " + name + " but received " +
                         std::to_string(v.size()));
    };
    check(mb.mask, "mask", true);
    check(mb.old_logprobs, "oldLogprobs", mode == LossMode::Policy);
    check(mb.advantages, "advantages", mode == LossMode::Policy);
    check(mb.ref_logprobs, "refLogprobs", false);
    if (need_ref && mb.ref_logprobs.empty() && reference == nullptr)
      throw ModelError(what + ": kl_coef is nonzero but neither refLogprobs nor a reference model is available");
    for (int64_t idx : packed.back().target_index) masked_tokens += mb.mask[idx];
    sequences += static_cast<double>(mb.lengths.size());
  }
  std::vector<double> totals{masked_tokens, sequences};
  double comm_seconds = 0;
  allreduce_doubles(group, totals, &comm_seconds);  // data parallel: the global batch's denominators
  masked_tokens = totals[0], sequences = totals[1];
  loss_config.denominator = denominator_for(loss_config, mode, masked_tokens, sequences);

  const NamedTensors& params = model.named_tensors();
  model.set_requires_grad(true);
  for (const auto& [name, p] : params) p.mutable_grad() = at::Tensor();

  TrainMetrics m;
  m.comm_seconds = comm_seconds;
  for (size_t b = 0; b < batches.size(); ++b) {
    const MicroBatch& mb = batches[b];
    const PackedSequences& pk = packed[b];
    const size_t R = pk.targets.size();
    if (R == 0) continue;
    auto rows_of = [&](const std::vector<float>& v) {
      std::vector<float> out;
      if (v.empty()) return out;
      out.resize(R);
      for (size_t r = 0; r < R; ++r) out[r] = v[pk.target_index[r]];
      return out;
    };
    std::vector<float> old_lp = rows_of(mb.old_logprobs), adv = rows_of(mb.advantages), mask = rows_of(mb.mask);
    std::vector<float> ref_lp;
    if (need_ref) {
      if (!mb.ref_logprobs.empty()) {
        ref_lp = rows_of(mb.ref_logprobs);
      } else {
        TokenStats ref = score_sequences(*reference, pk, loss_config.temperature, threads);
        ref_lp = rows_of(ref.logprobs);
      }
    }
    at::Tensor hidden = model.forward_hidden(pk.ids, pk.positions, packed_causal_attention(pk.offsets));
    at::Tensor logits = model.logits(hidden.index_select(0, pk.rows.to(hidden.device()))).to(at::kFloat).contiguous();
    kernels::PolicyLossResult res;
    at::Tensor loss = fused_policy_loss(logits, pk.targets, old_lp, adv, mask, pk.seq_of_row,
                                        static_cast<int64_t>(mb.lengths.size()), ref_lp, loss_config, mode, threads, &res);
    loss.backward();
    accumulate(m, res);
  }

  finish_step(model, optimizer, optim, m, group);
  return m;
}

TrainMetrics train_tree_step(Model& model, AdamW& optimizer, const std::vector<TreeMicroBatch>& batches,
                             kernels::PolicyLossConfig loss_config, const OptimConfig& optim, const Model* reference,
                             int32_t threads, int64_t chunk_rows, dist::Group* group) {
  const ModelConfig& c = model.config();
  if (batches.empty() && !distributed(group)) throw ModelError("trainTreeStep: expected at least one micro-batch");
  const bool need_ref = loss_config.kl_coef != 0;

  // Pack and validate everything before any gradient is touched.
  std::vector<PackedTree> packed;
  double masked_tokens = 0, sequences = 0;
  for (size_t b = 0; b < batches.size(); ++b) {
    const TreeMicroBatch& mb = batches[b];
    const std::string what = "trainTreeStep micro-batch " + std::to_string(b);
    packed.push_back(pack_tree(mb.tokens, mb.parent, mb.node_tokens, c.vocab_size, c.max_position_embeddings, what.c_str()));
    const size_t N = mb.tokens.size();
    auto check = [&](size_t n, const char* name, bool required) {
      if ((required || n != 0) && n != N)
        throw ModelError(what + ": expected " + std::to_string(N) + " values for " + name + " but received " +
                         std::to_string(n));
    };
    check(mb.old_logprobs.size(), "oldLogprobs", true);
    check(mb.ref_logprobs.size(), "refLogprobs", false);
    check(mb.adv_pos.size(), "advPos", true);
    check(mb.adv_neg.size(), "advNeg", true);
    check(mb.weight.size(), "weight", true);
    check(mb.count_pos.size(), "countPos", true);
    check(mb.count_neg.size(), "countNeg", true);
    check(mb.count.size(), "count", true);
    if (mb.sequences < 0) throw ModelError(what + ": sequences must be >= 0, got " + std::to_string(mb.sequences));
    if (need_ref && mb.ref_logprobs.empty() && reference == nullptr)
      throw ModelError(what + ": kl_coef is nonzero but neither refLogprobs nor a reference model is available");
    const PackedTree& pk = packed.back();
    for (size_t i = 0; i < N; ++i) {
      const bool live = mb.adv_pos[i] != 0 || mb.adv_neg[i] != 0 || mb.weight[i] != 0 || mb.count[i] != 0;
      if (live && pk.row_of_token[i] < 0)
        throw ModelError(what + ": token " + std::to_string(i) +
                         " starts a root (it is predicted by nothing) but carries loss terms");
      masked_tokens += mb.count[i];
    }
    sequences += static_cast<double>(mb.sequences);
  }
  std::vector<double> totals{masked_tokens, sequences};
  double comm_seconds = 0;
  allreduce_doubles(group, totals, &comm_seconds);  // data parallel: the global batch's denominators
  masked_tokens = totals[0], sequences = totals[1];
  loss_config.denominator = denominator_for(loss_config, LossMode::Policy, masked_tokens, sequences);

  const NamedTensors& params = model.named_tensors();
  model.set_requires_grad(true);
  for (const auto& [name, p] : params) p.mutable_grad() = at::Tensor();

  TrainMetrics m;
  m.comm_seconds = comm_seconds;
  for (size_t b = 0; b < batches.size(); ++b) {
    const TreeMicroBatch& mb = batches[b];
    const PackedTree& pk = packed[b];
    // Only targets that carry loss terms go through the LM head.
    HeadLossInputs in;
    std::vector<int64_t> rows;
    std::vector<uint8_t> live(pk.tokens(), 0);
    for (size_t r = 0; r < pk.target_index.size(); ++r) {
      const int64_t i = pk.target_index[r];
      if (mb.adv_pos[i] == 0 && mb.adv_neg[i] == 0 && mb.weight[i] == 0 && mb.count[i] == 0) continue;
      live[i] = 1;
      rows.push_back(pk.target_row[r]);
      in.targets.push_back(pk.targets[r]);
      in.old_logprobs.push_back(mb.old_logprobs[i]);
      in.adv_pos.push_back(mb.adv_pos[i]);
      in.adv_neg.push_back(mb.adv_neg[i]);
      in.weight.push_back(mb.weight[i]);
      in.count_pos.push_back(mb.count_pos[i]);
      in.count_neg.push_back(mb.count_neg[i]);
      in.count.push_back(mb.count[i]);
    }
    if (rows.empty()) continue;  // context only: no loss term, no gradient
    in.num_seqs = static_cast<int64_t>(sequences);
    if (need_ref) {
      if (!mb.ref_logprobs.empty()) {
        for (size_t r = 0; r < pk.target_index.size(); ++r)
          if (live[pk.target_index[r]]) in.ref_logprobs.push_back(mb.ref_logprobs[pk.target_index[r]]);
      } else {
        TokenStats ref = score_tree(*reference, pk, loss_config.temperature, threads, live);
        for (size_t r = 0; r < pk.target_index.size(); ++r)
          if (live[pk.target_index[r]]) in.ref_logprobs.push_back(ref.logprobs[pk.target_index[r]]);
      }
    }
    at::Tensor hidden = model.forward_hidden(pk.ids, pk.positions, tree_attention(pk));
    at::Tensor row_t = at::from_blob(rows.data(), {static_cast<int64_t>(rows.size())}, at::kLong).clone();
    at::Tensor x = model.final_norm(hidden.index_select(0, row_t.to(hidden.device())));
    kernels::PolicyLossResult res;
    at::Tensor loss = chunked_head_loss(x, model.lm_head_weight(), in, loss_config, chunk_rows, threads, &res);
    loss.backward();
    accumulate(m, res);
  }

  finish_step(model, optimizer, optim, m, group);
  return m;
}

void broadcast_parameters(Model& model, dist::Group& group, int root) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> tensors;
  for (const auto& [name, p] : model.named_tensors()) {
    if (!p.is_contiguous()) throw ModelError("broadcast_parameters: parameter " + name + " is not contiguous");
    tensors.push_back(p.device().is_cpu() ? p : p.to(at::kCPU));  // Gloo broadcasts host memory
  }
  group.broadcast(tensors, root);
  size_t i = 0;
  for (const auto& [name, p] : model.named_tensors()) {
    if (!p.device().is_cpu()) p.copy_(tensors[i]);
    ++i;
  }
}

}  // namespace model
}  // namespace arpo
