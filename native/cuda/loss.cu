// CUDA fused clipped-ratio policy loss, forward + backward (verl core_algos
// compute_policy_loss + agg_loss + kl_penalty and the entropy bonus; the same
// semantics as native/kernels/loss.cc). Fuses log_softmax -> gather -> ratio
// -> clip -> aggregation -> backward; never materialises softmax, log-probs
// or a second (T, V) buffer: grad may alias the float32 logits.
//
// Chunking: each row is split over a cluster of C blocks (C <= 8, each slice
// about 64 KB: 8 x 76 KB for a float32 row of V = 151,936). A slice is read
// from HBM once for the statistics, the cluster merges them through
// distributed shared memory, and the slice is read again and overwritten by
// its gradient right away. With ~2 resident blocks per SM only
// 132 x 2 x 76 KB = 20 MB of slices are live at a time, well inside the
// 60 MB L2, so the second read hits L2 and HBM sees one read + one write
// (8 bytes per float32 logit; the libtorch composition moves ~5x more).
#include <cstring>
#include <string>

#include "cuda/common.cuh"
#include "kernels/row_stats.h"

namespace arpo {
namespace cuda {
namespace detail {
namespace {

using kernels::Aggregation;
using kernels::KLType;

// Per-token terms, reduced in a fixed order by loss_reduce.
struct TokenTerms {
  double pg, kl, loss, clip, clip_lower, ppo_kl, ent;
};

// Batch-level values written by loss_prepare / copies_prepare.
struct Batch {
  double tokens;  // sum(mask), or sum(count) for copy rows
  double inv_d;   // copy rows: 1 / the aggregation's denominator (0 when it is 0)
};

// ---- 1. validation, sum(mask), per-sequence mask sums and aggregation weights
// w_t = d(aggregated loss) / d(loss_t). One block: O(T) and deterministic.
__global__ void __launch_bounds__(1024) loss_prepare(double* w, Batch* batch, double* seq_count,
                                                     const int32_t* targets, const float* mask,
                                                     const int32_t* seq_ids, int64_t T, int64_t V, int64_t num_seqs,
                                                     int aggregation, double denominator, double norm_constant,
                                                     Status* status) {
  __shared__ double scratch[33];
  const bool seq_mean_token_mean = aggregation == static_cast<int>(Aggregation::SeqMeanTokenMean);
  double tokens = 0;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    const float mt = mask[t];
    if (!isfinite(mt)) fail(status, kMaskNotFinite, t, __float_as_uint(mt));
    const int32_t tg = targets[t];
    if (tg >= V || (tg < 0 && mt != 0)) fail(status, kLossTarget, t, tg, mt != 0 ? 1 : 0);
    if (seq_ids) {
      const int32_t sid = seq_ids[t];
      if (sid < 0 || sid >= num_seqs) fail(status, kSeqId, t, sid, num_seqs);
      else if (seq_mean_token_mean) atomicAdd(&seq_count[sid], static_cast<double>(mt));
    }
    tokens += mt;
  }
  tokens = block_sum(tokens, scratch);  // also orders the atomics above before the reads below
  if (threadIdx.x == 0) batch->tokens = tokens;
  __threadfence_block();
  const Aggregation agg = static_cast<Aggregation>(aggregation);
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    const double mt = mask[t];
    double wt = 0;
    if (agg == Aggregation::TokenMean) {
      const double D = denominator > 0 ? denominator : tokens;
      wt = D != 0 ? mt / D : 0.0;
    } else if (agg == Aggregation::SeqMeanTokenMean) {
      // loss = (1/S) sum_s sum_{t in s} m_t l_t / sum_{t in s} m_t; an all-masked sequence contributes 0.
      const double S = denominator > 0 ? denominator : static_cast<double>(num_seqs);
      const int32_t sid = seq_ids[t];
      // __ldcg: read the atomics' result from L2, not a stale L1 line.
      const double c = (sid >= 0 && sid < num_seqs) ? __ldcg(&seq_count[sid]) : 0.0;
      wt = c != 0 ? mt / (c * S) : 0.0;
    } else if (agg == Aggregation::SeqMeanTokenSum) {
      const double S = denominator > 0 ? denominator : static_cast<double>(num_seqs);
      wt = mt / S;
    } else {
      const double Nn = denominator > 0 ? denominator : norm_constant;
      wt = mt / Nn;
    }
    w[t] = wt;
  }
}

// kl_penalty(logp, ref) of verl core_algos and d kl / d logp (torch.clamp
// passes the gradient on the closed interval), as loss.cc.
__device__ __forceinline__ void kl_penalty(int type, double logp, double ref, double* kl, double* dkl) {
  const double d = logp - ref;
  switch (static_cast<KLType>(type)) {
    case KLType::K1: *kl = d; *dkl = 1; return;
    case KLType::K2: *kl = 0.5 * d * d; *dkl = d; return;
    case KLType::ABS: *kl = fabs(d); *dkl = d > 0 ? 1 : (d < 0 ? -1 : 0); return;
    case KLType::K3: {
      // low_var_kl: x = clamp(ref - logp, -20, 20); kld = exp(x) - x - 1, clamped to [-10, 10].
      const double x0 = -d, x = fmin(20.0, fmax(-20.0, x0));
      const double ex = exp(x), kld = ex - x - 1;
      *kl = fmin(10.0, fmax(-10.0, kld));
      const bool pass = x0 >= -20 && x0 <= 20 && kld >= -10 && kld <= 10;
      *dkl = pass ? -(ex - 1) : 0;
      return;
    }
  }
  *kl = 0;
  *dkl = 0;
}

struct LossParams {
  float clip_low, clip_high, dual_clip_c, kl_coef, entropy_coef, inv_t;
  int kl_type;
  double grad_scale;
};

// The clipped policy-gradient term of one token at advantage A and its
// derivative in logp (loss.cc pg_term: the same composition, ties included).
struct PgTerm {
  double pg, dpg, clip, clip_lower, neg_kl;
};
__device__ __forceinline__ PgTerm pg_term(const LossParams& P, double A, double logp, double old_logp) {
  const double raw = logp - old_logp;
  const double neg_kl = fmin(20.0, fmax(-20.0, raw));
  const double dneg = (raw >= -20 && raw <= 20) ? 1.0 : 0.0;
  const double ratio = exp(neg_kl);
  const double lo = 1.0 - P.clip_low, hi = 1.0 + P.clip_high;
  const double pg1 = -A * ratio, pg2 = -A * fmin(hi, fmax(lo, ratio));
  const double d1 = -A * ratio * dneg, d2 = (ratio >= lo && ratio <= hi) ? d1 : 0.0;
  // torch.maximum / minimum split the gradient in half on ties.
  const double clipped = fmax(pg1, pg2);
  const double dclipped = pg1 > pg2 ? d1 : (pg1 < pg2 ? d2 : 0.5 * (d1 + d2));
  PgTerm out{clipped, dclipped, pg2 > pg1 ? 1.0 : 0.0, 0.0, neg_kl};
  if (P.dual_clip_c > 1.0f && A < 0) {
    const double pg3 = -A * P.dual_clip_c;
    out.pg = fmin(pg3, clipped);
    out.dpg = clipped < pg3 ? dclipped : (clipped > pg3 ? 0.0 : 0.5 * dclipped);
    out.clip_lower = clipped > pg3 ? 1.0 : 0.0;
  }
  return out;
}

// How a row's terms (already weighted for the final sum) and its gradient
// coefficients d loss / d logp, d loss / d H follow from its log-prob and
// entropy. A rule leaves *out zero for a row that does not count.
//
// FlatRule: one token per row (policy_loss; loss.cc's per-token terms, then
// weighted as its reduction weights them: w_t for loss and pg, the mask for
// the metrics; masked tokens contribute no terms, which may be -inf).
struct FlatRule {
  LossParams P;
  const float* advantages;
  const float* old_logprobs;
  const float* ref_logprobs;
  const float* mask;
  const double* w;
  __device__ void operator()(int64_t t, double logp, double H, TokenTerms* out, double* coeff_logp,
                             double* coeff_h) const {
    const double wt = w[t], A = advantages[t];
    const PgTerm g = pg_term(P, A, logp, old_logprobs[t]);
    double kl = 0, dkl = 0;
    if (ref_logprobs) kl_penalty(P.kl_type, logp, ref_logprobs[t], &kl, &dkl);
    *coeff_logp = wt * P.grad_scale * (g.dpg + P.kl_coef * dkl);
    *coeff_h = wt * P.grad_scale * -static_cast<double>(P.entropy_coef);
    const double mt = mask[t];
    if (mt == 0) return;
    const double loss = g.pg + P.kl_coef * kl - P.entropy_coef * H;
    *out = TokenTerms{wt * g.pg, mt * kl, wt * loss, mt * g.clip, mt * g.clip_lower, mt * -g.neg_kl, mt * H};
  }
};

// CopiesRule: a row standing for several copies of one token (policy_loss_copies;
// loss.cc: the clipped term at A = +1 and A = -1 scaled by the signed copy sums).
struct CopiesRule {
  LossParams P;
  const float* old_logprobs;  // null: ratio 1
  const float* ref_logprobs;
  kernels::TokenCopySums sums;
  const uint8_t* live;
  const Batch* batch;
  __device__ void operator()(int64_t t, double logp, double H, TokenTerms* out, double* coeff_logp,
                             double* coeff_h) const {
    if (!live[t]) return;
    const double inv_d = batch->inv_d;
    const double old = old_logprobs ? static_cast<double>(old_logprobs[t]) : logp;
    const PgTerm up = pg_term(P, 1.0, logp, old), down = pg_term(P, -1.0, logp, old);
    const double sp = sums.adv_pos[t] * inv_d, sn = -sums.adv_neg[t] * inv_d, wt = sums.weight[t] * inv_d;
    double kl = 0, dkl = 0;
    if (ref_logprobs) kl_penalty(P.kl_type, logp, ref_logprobs[t], &kl, &dkl);
    const double pg = sp * up.pg + sn * down.pg;
    const double ct = sums.count[t];
    *out = TokenTerms{pg, ct * kl, pg + wt * (P.kl_coef * kl - P.entropy_coef * H),
                      sums.count_pos[t] * up.clip + sums.count_neg[t] * down.clip, sums.count_neg[t] * down.clip_lower,
                      ct * -up.neg_kl, ct * H};
    *coeff_logp = P.grad_scale * (sp * up.dpg + sn * down.dpg + wt * P.kl_coef * dkl);
    *coeff_h = P.grad_scale * wt * -static_cast<double>(P.entropy_coef);
  }
};

// ---- 2. one row per cluster: statistics, token terms, gradient slice.
template <typename T, typename Rule>
__global__ void __launch_bounds__(1024) loss_rows(TokenTerms* terms, float* grad, float* logprobs, float* entropy,
                                                  const T* logits, const int32_t* targets, int64_t V, float inv_t,
                                                  int cluster, const Status* status, Rule rule) {
  __shared__ Online scratch[33];
  __shared__ Online slot;
  __shared__ float s_zt;
  __shared__ float s_coef[3];  // a = -coeff_logp / temperature, c = -coeff_h / temperature, target term
  if (status->code != kOk) return;  // uniform: nothing is written for a rejected call
  constexpr int N = Elem<T>::kPerVec;
  const int64_t t = blockIdx.x / cluster;
  const int rank = static_cast<int>(blockIdx.x % cluster);
  const T* row = logits + t * V;
  const int32_t tg = targets[t];
  // Read the target logit before the cluster barrier: after it, the block
  // owning that element may overwrite it (grad aliasing the logits).
  if (threadIdx.x == 0) s_zt = tg >= 0 ? Elem<T>::to_float(row[tg]) * inv_t : 0.0f;
  int64_t b, e;
  row_slice(V, rank, cluster, &b, &e);
  Online acc = online_empty();
  for_slice<T, 4, false>(
      row, b, e,
      [&](const float* x, int64_t) {
        float z[N];
#pragma unroll
        for (int i = 0; i < N; ++i) z[i] = x[i] * inv_t;
        online_add<N>(acc, z);
      },
      [&](float x, int64_t) {
        const float z = x * inv_t;
        online_add<1>(acc, &z);
      });
  acc = block_merge(acc, scratch);  // its barriers also publish s_zt
  acc = cluster_merge(acc, &slot, scratch, cluster);
  const double lse = online_lse(acc), H = online_entropy(acc);
  if (threadIdx.x == 0) {
    const float zt = s_zt;
    double logp = 0;
    if (tg >= 0) logp = (zt == kNegInf || acc.m == kNegInf) ? -HUGE_VAL : static_cast<double>(zt) - lse;
    TokenTerms tt{0, 0, 0, 0, 0, 0, 0};
    double coeff_logp = 0, coeff_h = 0;
    if (tg >= 0) rule(t, logp, H, &tt, &coeff_logp, &coeff_h);
    if (rank == 0) {
      terms[t] = tt;
      if (logprobs) logprobs[t] = static_cast<float>(logp);
      if (entropy) entropy[t] = static_cast<float>(H);
    }
    const bool zero_row = (coeff_logp == 0 && coeff_h == 0) || acc.m == kNegInf;
    s_coef[0] = zero_row ? 0.0f : static_cast<float>(-coeff_logp * inv_t);
    s_coef[1] = zero_row ? 0.0f : static_cast<float>(-coeff_h * inv_t);
    s_coef[2] = zero_row ? 0.0f : static_cast<float>(coeff_logp * inv_t);
  }
  if (!grad) return;
  __syncthreads();
  const float a = s_coef[0], c = s_coef[1], target_term = s_coef[2];
  const bool zero_row = a == 0.0f && c == 0.0f && target_term == 0.0f;
  // grad_j = [coeff_logp (1[j = target] - p_j) + coeff_h (-p_j (log p_j + H))] / temperature
  //        = a p_j + c p_j (log p_j + H) (+ target term at j = target),
  // log p_j = (z_j - m) - (lse - m): both differences small, no cancellation.
  const float m = acc.m, lsm = static_cast<float>(lse - static_cast<double>(acc.m)), h = static_cast<float>(H);
  float* g = grad + t * V;
  auto grad_of = [&](float x, int64_t j) {
    if (zero_row) return 0.0f;
    const float y = fmaxf((x * inv_t - m) - lsm, kExpFloor);
    const float p = exp2f(y * kLog2e);
    float v = a * p + c * p * (y + h);
    if (j == tg) v += target_term;
    return v;
  };
  for_slice<T, 4, true>(
      row, b, e,
      [&](const float* x, int64_t j0) {
        float out[N];
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = grad_of(x[i], j0 + i);
        float* dst = g + j0;
        if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
#pragma unroll
          for (int i = 0; i < N; i += 4) __stcs(reinterpret_cast<float4*>(dst + i), make_float4(out[i], out[i + 1], out[i + 2], out[i + 3]));
        } else {
#pragma unroll
          for (int i = 0; i < N; ++i) __stcs(dst + i, out[i]);
        }
      },
      [&](float x, int64_t j) { __stcs(g + j, grad_of(x, j)); });
}

// ---- 3. deterministic reduction of the (already weighted) token terms (one block, double).
__global__ void __launch_bounds__(1024) loss_reduce(double* out, const TokenTerms* terms, int64_t T,
                                                    const Status* status) {
  __shared__ double scratch[33];
  if (status->code != kOk) return;
  double acc[7] = {0, 0, 0, 0, 0, 0, 0};
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    const TokenTerms& x = terms[t];
    acc[0] += x.loss;
    acc[1] += x.pg;
    acc[2] += x.clip;
    acc[3] += x.clip_lower;
    acc[4] += x.ppo_kl;
    acc[5] += x.ent;
    acc[6] += x.kl;
  }
#pragma unroll
  for (int i = 0; i < 7; ++i) {
    const double v = block_sum(acc[i], scratch);
    if (threadIdx.x == 0) out[i] = v;
  }
}

// ---- 1b. copy rows: validation of the sums, live rows, sum(count) and the denominator.
__global__ void __launch_bounds__(1024) copies_prepare(Batch* batch, uint8_t* live, const int32_t* targets,
                                                       kernels::TokenCopySums sums, int64_t T, int64_t V,
                                                       int aggregation, double denominator, double norm_constant,
                                                       int64_t num_seqs, Status* status) {
  __shared__ double scratch[33];
  double tokens = 0;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    const double v[6] = {sums.adv_pos[t], sums.adv_neg[t], sums.weight[t],
                         sums.count_pos[t], sums.count_neg[t], sums.count[t]};
    for (int i = 0; i < 6; ++i) {
      const bool ok = isfinite(v[i]) && (i == 1 ? v[i] <= 0 : v[i] >= 0);
      if (!ok) fail(status, kCopySum, t, i, __double_as_longlong(v[i]));
    }
    const bool lv = v[0] != 0 || v[1] != 0 || v[2] != 0 || v[5] != 0;
    live[t] = lv ? 1 : 0;
    const int32_t tg = targets[t];
    if (tg >= V || (tg < 0 && lv)) fail(status, kLossTarget, t, tg, lv ? 1 : 0);
    tokens += v[5];
  }
  tokens = block_sum(tokens, scratch);
  if (threadIdx.x == 0) {
    double D = denominator;
    if (D == 0) {
      const Aggregation agg = static_cast<Aggregation>(aggregation);
      D = agg == Aggregation::TokenMean ? tokens
          : agg == Aggregation::SeqMeanTokenSumNorm ? norm_constant
                                                    : static_cast<double>(num_seqs);
    }
    batch->tokens = tokens;
    batch->inv_d = D != 0 ? 1.0 / D : 0.0;
  }
}

std::string num(double v) { return std::to_string(v); }
std::string n(long long v) { return std::to_string(v); }

void check_config(const PolicyLossConfig& c, const char* name) {
  auto finite = [](double v) { return std::isfinite(v); };
  const std::string op = std::string(name) + " (cuda): ";
  if (!finite(c.clip_low) || c.clip_low < 0) throw Error(op + "clip_low must be finite and >= 0, got " + num(c.clip_low));
  if (!finite(c.clip_high) || c.clip_high < 0) throw Error(op + "clip_high must be finite and >= 0, got " + num(c.clip_high));
  if (!finite(c.dual_clip_c)) throw Error(op + "dual_clip_c must be finite (<= 1 disables), got " + num(c.dual_clip_c));
  if (!finite(c.kl_coef)) throw Error(op + "kl_coef must be finite, got " + num(c.kl_coef));
  if (!finite(c.entropy_coef)) throw Error(op + "entropy_coef must be finite, got " + num(c.entropy_coef));
  if (!finite(c.temperature) || !(c.temperature > 0))
    throw Error(op + "temperature must be finite and > 0, got " + num(c.temperature));
  if (!finite(c.denominator) || c.denominator < 0)
    throw Error(op + "denominator must be finite and >= 0 (0 = from the batch), got " + num(c.denominator));
  if (!finite(c.norm_constant) || c.norm_constant < 0)
    throw Error(op + "norm_constant must be finite and >= 0, got " + num(c.norm_constant));
  if (!finite(c.grad_scale)) throw Error(op + "grad_scale must be finite, got " + num(c.grad_scale));
  const int kl = static_cast<int>(c.kl_type), agg = static_cast<int>(c.aggregation);
  if (kl < 0 || kl > 3) throw Error(op + "kl_type must be 0 (k1), 1 (k2), 2 (k3) or 3 (abs), got " + std::to_string(kl));
  if (agg < 0 || agg > 3) throw Error(op + "aggregation must be 0..3, got " + std::to_string(agg));
}

// Blocks per row: slices of ~64 KB (at most 8, the portable cluster size),
// and at most 2 resident blocks of 512 threads per SM by default so the live
// slices fit in L2 (see the file comment). Clusters need sm_90.
RowLaunch loss_geometry(int64_t V, size_t elem_bytes, const char* op) {
  const DeviceInfo& dev = device_info(op);
  RowLaunch g;
  g.threads = 512;
  const int64_t bytes = V * static_cast<int64_t>(elem_bytes);
  int64_t c = (bytes + 65535) / 65536;
  g.cluster = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(8, c)));
  Tuning t = get_tuning();
  if (t.loss_blocks_per_sm == 0 && g.cluster > 1) g.pad_smem = 227 * 1024 / 2 - 1024 - 2048;  // 2 blocks per SM
  g = apply_tuning(g, 1);
  if (dev.major < 9) g.cluster = 1;
  return g;
}

// loss_rows over every row of `logits` with `rule`, f32 or bf16.
template <typename Rule>
void launch_loss_rows(TokenTerms* terms, float* grad, float* logprobs, float* entropy, const Logits& logits,
                      const int32_t* targets, float inv_t, cudaStream_t stream, const Status* status, const Rule& rule,
                      const char* op) {
  const bool f32 = logits.dtype == kernels::DType::F32;
  const RowLaunch g = loss_geometry(logits.vocab, f32 ? 4 : 2, op);
  if (f32)
    launch_rows(loss_rows<float, Rule>, logits.rows, g, stream, op, "loss_rows<f32>", terms, grad, logprobs, entropy,
                static_cast<const float*>(logits.data), targets, logits.vocab, inv_t, g.cluster, status, rule);
  else
    launch_rows(loss_rows<uint16_t, Rule>, logits.rows, g, stream, op, "loss_rows<bf16>", terms, grad, logprobs, entropy,
                static_cast<const uint16_t*>(logits.data), targets, logits.vocab, inv_t, g.cluster, status, rule);
}

// Results and status back to the host (synchronising the stream); throws the
// CPU kernel's message for a rejected call.
void finish_loss(PolicyLossResult* result, const double* out, const Batch* batch, Status* status, int64_t V,
                 double grad_scale, cudaStream_t stream, const char* op) {
  double host[8] = {0};
  Batch hb{};
  check(cudaMemcpyAsync(host, out, sizeof(double) * 7, cudaMemcpyDeviceToHost, stream), op, "cudaMemcpyAsync (result)");
  check(cudaMemcpyAsync(&hb, batch, sizeof hb, cudaMemcpyDeviceToHost, stream), op, "cudaMemcpyAsync (batch)");
  const Status st = read_status(status, stream, op);
  const std::string o = std::string(op) + " (cuda): ";
  if (st.code == kMaskNotFinite) {
    const uint32_t bits = static_cast<uint32_t>(st.value);
    float v;
    std::memcpy(&v, &bits, sizeof v);
    throw Error(o + "mask[" + n(st.index) + "] = " + num(v) + " is not finite");
  }
  if (st.code == kCopySum) {
    static const char* names[6] = {"adv_pos", "adv_neg", "weight", "count_pos", "count_neg", "count"};
    const uint64_t bits = static_cast<uint64_t>(st.extra);
    double v;
    std::memcpy(&v, &bits, sizeof v);
    const int which = static_cast<int>(st.value);
    throw Error(o + names[which] + "[" + n(st.index) + "] = " + num(v) + " must be " +
                (which == 1 ? "finite and <= 0" : "finite and >= 0"));
  }
  if (st.code == kLossTarget)
    throw Error(o + "targets[" + n(st.index) + "] = " + n(st.value) + " is outside [0, " + n(V) + ")" +
                (st.value < 0 ? (std::strcmp(op, "policy_loss") == 0 ? " where mask is not 0" : " where the copy sums are not 0")
                              : ""));
  if (st.code == kSeqId)
    throw Error(o + "seq_ids[" + n(st.index) + "] = " + n(st.value) + " is outside [0, " + n(st.extra) + ")");
  if (st.code != kOk) throw Error(o + "device reported status " + n(st.code));
  const double tokens = hb.tokens;
  result->loss = host[0] * grad_scale;
  result->pg_loss = host[1];
  result->tokens = tokens;
  if (tokens != 0) {
    result->pg_clipfrac = host[2] / tokens;
    result->pg_clipfrac_lower = host[3] / tokens;
    result->ppo_kl = host[4] / tokens;
    result->entropy = host[5] / tokens;
    result->kl = host[6] / tokens;
  }
}

}  // namespace
}  // namespace detail

void policy_loss(PolicyLossResult* result, float* grad, float* logprobs, float* entropy, const Logits& logits,
                 const int32_t* targets, const float* old_logprobs, const float* advantages, const float* mask,
                 const int32_t* seq_ids, int64_t num_seqs, const float* ref_logprobs, const PolicyLossConfig& cfg,
                 void* stream_ptr) {
  using namespace detail;
  const char* op = "policy_loss";
  kernels::detail::check_logits(logits, "policy_loss (cuda)");
  check_config(cfg, op);
  if (!result) throw Error("policy_loss (cuda): result is null");
  *result = PolicyLossResult{};
  const int64_t T = logits.rows, V = logits.vocab;
  if (T == 0) return;
  if (!targets || !old_logprobs || !advantages || !mask)
    throw Error("policy_loss (cuda): targets, old_logprobs, advantages and mask are required (T = " + n(T) + ")");
  if (cfg.kl_coef != 0 && !ref_logprobs) throw Error("policy_loss (cuda): kl_coef = " + num(cfg.kl_coef) + " needs ref_logprobs");
  if (grad && logits.dtype == kernels::DType::BF16 && static_cast<const void*>(grad) == logits.data)
    throw Error("policy_loss (cuda): grad cannot alias bf16 logits (it is float32)");
  const Aggregation agg = cfg.aggregation;
  const bool per_seq = agg == Aggregation::SeqMeanTokenMean || agg == Aggregation::SeqMeanTokenSum;
  if (per_seq && cfg.denominator == 0 && num_seqs < 1)
    throw Error("policy_loss (cuda): num_seqs must be >= 1 for seq-mean aggregations, got " + n(num_seqs));
  if (agg == Aggregation::SeqMeanTokenMean && !seq_ids)
    throw Error("policy_loss (cuda): seq_ids are required for seq-mean-token-mean");
  if (agg == Aggregation::SeqMeanTokenSumNorm && cfg.denominator == 0 && !(cfg.norm_constant > 0))
    throw Error("policy_loss (cuda): norm_constant must be > 0 for seq-mean-token-sum-norm, got " + num(cfg.norm_constant));
  if (seq_ids && (num_seqs < 1 || num_seqs > (int64_t{1} << 30)))
    throw Error("policy_loss (cuda): num_seqs must be in [1, 2^30] with seq_ids, got " + n(num_seqs));

  // Workspace: status | batch | results | seq_count (S doubles) | w (T doubles) | terms (T).
  const bool counts = agg == Aggregation::SeqMeanTokenMean;
  const size_t seq_bytes = counts ? aligned(sizeof(double) * static_cast<size_t>(num_seqs)) : 0;
  const size_t o_batch = kStatusBytes, o_out = o_batch + aligned(sizeof(Batch)), o_seq = o_out + aligned(8 * sizeof(double));
  const size_t o_w = o_seq + seq_bytes, o_terms = o_w + aligned(sizeof(double) * static_cast<size_t>(T));
  const size_t total = o_terms + aligned(sizeof(TokenTerms) * static_cast<size_t>(T));
  const cudaStream_t stream = as_stream(stream_ptr);
  char* ws = workspace(total, o_w, stream, op);  // zeroes status, batch, results and seq_count
  auto* status = reinterpret_cast<Status*>(ws);
  auto* batch = reinterpret_cast<Batch*>(ws + o_batch);
  auto* out = reinterpret_cast<double*>(ws + o_out);
  auto* seq_count = reinterpret_cast<double*>(ws + o_seq);
  auto* w = reinterpret_cast<double*>(ws + o_w);
  auto* terms = reinterpret_cast<TokenTerms*>(ws + o_terms);

  loss_prepare<<<1, 1024, 0, stream>>>(w, batch, seq_count, targets, mask, seq_ids, T, V, num_seqs,
                                       static_cast<int>(agg), cfg.denominator, cfg.norm_constant, status);
  check_launch(op, "loss_prepare");
  LossParams P{cfg.clip_low, cfg.clip_high, cfg.dual_clip_c, cfg.kl_coef, cfg.entropy_coef, 1.0f / cfg.temperature,
               static_cast<int>(cfg.kl_type), static_cast<double>(cfg.grad_scale)};
  const FlatRule rule{P, advantages, old_logprobs, ref_logprobs, mask, w};
  launch_loss_rows(terms, grad, logprobs, entropy, logits, targets, P.inv_t, stream, status, rule, op);
  loss_reduce<<<1, 1024, 0, stream>>>(out, terms, T, status);
  check_launch(op, "loss_reduce");
  finish_loss(result, out, batch, status, V, cfg.grad_scale, stream, op);
}

void policy_loss_copies(PolicyLossResult* result, float* grad, float* logprobs, float* entropy, const Logits& logits,
                        const int32_t* targets, const float* old_logprobs, const kernels::TokenCopySums& sums,
                        int64_t num_seqs, const float* ref_logprobs, const PolicyLossConfig& cfg, void* stream_ptr) {
  using namespace detail;
  const char* op = "policy_loss_copies";
  kernels::detail::check_logits(logits, "policy_loss_copies (cuda)");
  check_config(cfg, op);
  if (!result) throw Error("policy_loss_copies (cuda): result is null");
  if (grad && logits.dtype == kernels::DType::BF16 && static_cast<const void*>(grad) == logits.data)
    throw Error("policy_loss_copies (cuda): grad cannot alias bf16 logits (it is float32)");
  *result = PolicyLossResult{};
  const int64_t T = logits.rows, V = logits.vocab;
  if (T == 0) return;
  if (!targets || !sums.adv_pos || !sums.adv_neg || !sums.weight || !sums.count_pos || !sums.count_neg || !sums.count)
    throw Error("policy_loss_copies (cuda): targets and every copy-sum array are required (T = " + n(T) + ")");
  if (cfg.kl_coef != 0 && !ref_logprobs)
    throw Error("policy_loss_copies (cuda): kl_coef = " + num(cfg.kl_coef) + " needs ref_logprobs");
  const Aggregation agg = cfg.aggregation;
  if (cfg.denominator == 0) {
    if (agg == Aggregation::SeqMeanTokenSumNorm && !(cfg.norm_constant > 0))
      throw Error("policy_loss_copies (cuda): norm_constant must be > 0 for seq-mean-token-sum-norm, got " + num(cfg.norm_constant));
    if ((agg == Aggregation::SeqMeanTokenMean || agg == Aggregation::SeqMeanTokenSum) && num_seqs < 1)
      throw Error("policy_loss_copies (cuda): num_seqs must be >= 1 for seq-mean aggregations, got " + n(num_seqs));
  }

  // Workspace: status | batch | results | live (T bytes) | terms (T).
  const size_t o_batch = kStatusBytes, o_out = o_batch + aligned(sizeof(Batch)), o_live = o_out + aligned(8 * sizeof(double));
  const size_t o_terms = o_live + aligned(static_cast<size_t>(T));
  const size_t total = o_terms + aligned(sizeof(TokenTerms) * static_cast<size_t>(T));
  const cudaStream_t stream = as_stream(stream_ptr);
  char* ws = workspace(total, o_live, stream, op);  // zeroes status, batch and results
  auto* status = reinterpret_cast<Status*>(ws);
  auto* batch = reinterpret_cast<Batch*>(ws + o_batch);
  auto* out = reinterpret_cast<double*>(ws + o_out);
  auto* live = reinterpret_cast<uint8_t*>(ws + o_live);
  auto* terms = reinterpret_cast<TokenTerms*>(ws + o_terms);

  copies_prepare<<<1, 1024, 0, stream>>>(batch, live, targets, sums, T, V, static_cast<int>(agg), cfg.denominator,
                                         cfg.norm_constant, num_seqs, status);
  check_launch(op, "copies_prepare");
  LossParams P{cfg.clip_low, cfg.clip_high, cfg.dual_clip_c, cfg.kl_coef, cfg.entropy_coef, 1.0f / cfg.temperature,
               static_cast<int>(cfg.kl_type), static_cast<double>(cfg.grad_scale)};
  const CopiesRule rule{P, old_logprobs, ref_logprobs, sums, live, batch};
  launch_loss_rows(terms, grad, logprobs, entropy, logits, targets, P.inv_t, stream, status, rule, op);
  loss_reduce<<<1, 1024, 0, stream>>>(out, terms, T, status);
  check_launch(op, "loss_reduce");
  finish_loss(result, out, batch, status, V, cfg.grad_scale, stream, op);
}

}  // namespace cuda
}  // namespace arpo
