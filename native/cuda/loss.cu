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

// Batch-level values written by loss_prepare.
struct Batch {
  double tokens;  // sum(mask)
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

// Token terms and d loss / d logp, d loss / d H for one token (loss.cc).
__device__ __forceinline__ void token_terms(const LossParams& P, double logp, double H, double A, double old_logp,
                                            const float* ref_logprobs, int64_t t, double wt, TokenTerms* out,
                                            double* coeff_logp, double* coeff_h) {
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
  double pg = clipped, dpg = dclipped;
  out->clip_lower = 0;
  if (P.dual_clip_c > 1.0f && A < 0) {
    const double pg3 = -A * P.dual_clip_c;
    pg = fmin(pg3, clipped);
    dpg = clipped < pg3 ? dclipped : (clipped > pg3 ? 0.0 : 0.5 * dclipped);
    out->clip_lower = clipped > pg3 ? 1.0 : 0.0;
  }
  out->clip = pg2 > pg1 ? 1.0 : 0.0;
  out->ppo_kl = -neg_kl;
  double kl = 0, dkl = 0;
  if (ref_logprobs) kl_penalty(P.kl_type, logp, ref_logprobs[t], &kl, &dkl);
  out->pg = pg;
  out->kl = kl;
  out->loss = pg + P.kl_coef * kl - P.entropy_coef * H;
  *coeff_logp = wt * P.grad_scale * (dpg + P.kl_coef * dkl);
  *coeff_h = wt * P.grad_scale * -static_cast<double>(P.entropy_coef);
}

// ---- 2. one row per cluster: statistics, token terms, gradient slice.
template <typename T>
__global__ void __launch_bounds__(1024) loss_rows(TokenTerms* terms, float* grad, float* logprobs, float* entropy,
                                                  const T* logits, const int32_t* targets, const float* old_logprobs,
                                                  const float* advantages, const float* ref_logprobs, const double* w,
                                                  int64_t V, LossParams P, int cluster, const Status* status) {
  __shared__ Online scratch[33];
  __shared__ Online slot;
  __shared__ float s_zt;
  __shared__ float s_coef[3];  // a = -coeff_logp / temperature, c = -coeff_h / temperature, target term
  if (status->code != kOk) return;  // uniform: nothing is written for a rejected call
  constexpr int N = Elem<T>::kPerVec;
  const int64_t t = blockIdx.x / cluster;
  const int rank = static_cast<int>(blockIdx.x % cluster);
  const T* row = logits + t * V;
  const float inv_t = P.inv_t;
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
    TokenTerms tt{0, 0, 0, 0, 0, 0, H};
    double coeff_logp = 0, coeff_h = 0;
    if (tg >= 0) token_terms(P, logp, H, advantages[t], old_logprobs[t], ref_logprobs, t, w[t], &tt, &coeff_logp, &coeff_h);
    if (rank == 0) {
      tt.ent = H;
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

// ---- 3. deterministic reduction of the token terms (one block, double).
__global__ void __launch_bounds__(1024) loss_reduce(double* out, const TokenTerms* terms, const double* w,
                                                    const float* mask, int64_t T, const Status* status) {
  __shared__ double scratch[33];
  if (status->code != kOk) return;
  double acc[7] = {0, 0, 0, 0, 0, 0, 0};
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
    const double mt = mask[t];
    if (mt == 0) continue;  // masked tokens may hold -inf terms; 0 * inf would be NaN
    const TokenTerms& x = terms[t];
    acc[0] += w[t] * x.loss;
    acc[1] += w[t] * x.pg;
    acc[2] += mt * x.clip;
    acc[3] += mt * x.clip_lower;
    acc[4] += mt * x.ppo_kl;
    acc[5] += mt * x.ent;
    acc[6] += mt * x.kl;
  }
#pragma unroll
  for (int i = 0; i < 7; ++i) {
    const double v = block_sum(acc[i], scratch);
    if (threadIdx.x == 0) out[i] = v;
  }
}

std::string num(double v) { return std::to_string(v); }
std::string n(long long v) { return std::to_string(v); }

void check_config(const PolicyLossConfig& c) {
  auto finite = [](double v) { return std::isfinite(v); };
  const std::string op = "policy_loss (cuda): ";
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

}  // namespace
}  // namespace detail

void policy_loss(PolicyLossResult* result, float* grad, float* logprobs, float* entropy, const Logits& logits,
                 const int32_t* targets, const float* old_logprobs, const float* advantages, const float* mask,
                 const int32_t* seq_ids, int64_t num_seqs, const float* ref_logprobs, const PolicyLossConfig& cfg,
                 void* stream_ptr) {
  using namespace detail;
  const char* op = "policy_loss";
  kernels::detail::check_logits(logits, "policy_loss (cuda)");
  check_config(cfg);
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
  const bool f32 = logits.dtype == kernels::DType::F32;
  const RowLaunch g = loss_geometry(V, f32 ? 4 : 2, op);
  if (f32)
    launch_rows(loss_rows<float>, T, g, stream, op, "loss_rows<f32>", terms, grad, logprobs, entropy,
                static_cast<const float*>(logits.data), targets, old_logprobs, advantages, ref_logprobs,
                static_cast<const double*>(w), V, P, g.cluster, static_cast<const Status*>(status));
  else
    launch_rows(loss_rows<uint16_t>, T, g, stream, op, "loss_rows<bf16>", terms, grad, logprobs, entropy,
                static_cast<const uint16_t*>(logits.data), targets, old_logprobs, advantages, ref_logprobs,
                static_cast<const double*>(w), V, P, g.cluster, static_cast<const Status*>(status));
  loss_reduce<<<1, 1024, 0, stream>>>(out, terms, w, mask, T, status);
  check_launch(op, "loss_reduce");
  double host[8] = {0};
  Batch hb{};
  check(cudaMemcpyAsync(host, out, sizeof(double) * 7, cudaMemcpyDeviceToHost, stream), op, "cudaMemcpyAsync (result)");
  check(cudaMemcpyAsync(&hb, batch, sizeof hb, cudaMemcpyDeviceToHost, stream), op, "cudaMemcpyAsync (batch)");
  const Status st = read_status(status, stream, op);
  if (st.code == kMaskNotFinite) {
    const uint32_t bits = static_cast<uint32_t>(st.value);
    float v;
    std::memcpy(&v, &bits, sizeof v);
    throw Error("policy_loss (cuda): mask[" + n(st.index) + "] = " + num(v) + " is not finite");
  }
  if (st.code == kLossTarget)
    throw Error("policy_loss (cuda): targets[" + n(st.index) + "] = " + n(st.value) + " is outside [0, " + n(V) + ")" +
                (st.value < 0 ? " where mask is not 0" : ""));
  if (st.code == kSeqId)
    throw Error("policy_loss (cuda): seq_ids[" + n(st.index) + "] = " + n(st.value) + " is outside [0, " + n(st.extra) + ")");
  if (st.code != kOk) throw Error("policy_loss (cuda): device reported status " + n(st.code));
  const double tokens = hb.tokens;
  result->loss = host[0] * cfg.grad_scale;
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

}  // namespace cuda
}  // namespace arpo
