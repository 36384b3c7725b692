// The engine's decode-time fast paths (kernels.h section 5, Model::
// set_fused_inference) against the plain torch compositions they replace, on
// the same inputs: RMSNorm, RoPE, paged decode attention and the linear
// layers one by one (float64 and float32, GQA, ragged context lengths,
// scattered cache slots; the linear kernel also against an exact sum and for
// batch invariance),
// then whole engines — every model type, decode and prefill rows mixed,
// forks sharing blocks — with fusion on and off: a float64 model's logits
// (returned as float32) within 1e-12 relative (bitwise in practice) and the
// same sampled tokens; a float32 model's within 1e-5. A train
// step never takes the fast path (autograd on), nor does score_sequences.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdio>
#include <random>

#include "test/check.h"
#include "tiny_model.h"
#include "torch/device.h"
#include "torch/engine.h"
#include "torch/model.h"

using namespace arpo::model;
using arpo_test::random_tokens;
using arpo_test::tiny_config;
using arpo_test::tolerance_ratio;

namespace {

double tol(at::ScalarType t) { return t == at::kDouble ? 1e-12 : 1e-5; }

void test_rms_norm_and_rope(at::ScalarType dt) {
  ModelConfig c = tiny_config("qwen3");
  Model m(c, dt);
  m.init_weights(3);
  at::manual_seed(5);
  at::Tensor x = at::randn({7, 4, 16}, at::TensorOptions().dtype(dt)) * 3;
  at::Tensor w = at::randn({16}, at::TensorOptions().dtype(dt));
  at::Tensor plain, fused;
  {
    at::NoGradGuard ng;
    plain = m.rms_norm(x, w);  // no scope: the composition
    {
      const FusedInferenceScope scope;
      CHECK(m.fused_inference(x));
      fused = m.rms_norm(x, w);
    }
  }
  CHECK(tolerance_ratio(fused, plain, tol(dt), tol(dt)) <= 1.0);
  // The composition's own definition, independently: w * x / sqrt(mean(x^2) + eps).
  at::Tensor xd = x.to(at::kDouble);
  at::Tensor ref = w.to(at::kDouble) * xd / (xd.pow(2).mean(-1, true) + c.rms_norm_eps).sqrt();
  CHECK(tolerance_ratio(fused, ref, tol(dt) * 10, tol(dt) * 10) <= 1.0);

  at::Tensor pos = at::tensor(std::vector<int64_t>{0, 1, 5, 17, 300, 301, 2047});
  at::Tensor q = at::randn({7, 4, 16}, at::TensorOptions().dtype(dt));
  at::Tensor rp, rf;
  {
    at::NoGradGuard ng;
    const auto tables = m.rope_tables(pos);
    rp = m.apply_rope(q, tables);
    const FusedInferenceScope scope;
    rf = m.apply_rope(q.clone(), tables);
  }
  CHECK(tolerance_ratio(rf, rp, tol(dt), tol(dt)) <= 1.0);
  CHECK(!rf.equal(q));  // it did rotate
  // With autograd on (a train step) the composition runs even inside a scope.
  {
    const FusedInferenceScope scope;
    at::Tensor g = x.clone().requires_grad_(true);
    CHECK(!m.fused_inference(g));
    at::Tensor y = m.rms_norm(g, w);
    CHECK(y.requires_grad());
  }
  // Off switch: the model composes inside the scope too.
  m.set_fused_inference(false);
  {
    at::NoGradGuard ng;
    const FusedInferenceScope scope;
    CHECK(!m.fused_inference(x));
  }
}

// dispatch::linear (kernels::linear_rows, W read in place) against a naive
// long-double triple loop and against at::linear, over row counts that fill
// the kernel's 4-row tiles and leave every remainder, K a multiple of the
// vector width or not, output counts that fill 16-output spans or leave a
// tail, with and without bias. Then batch invariance, which the kernel
// promises: row r of an M-row call is bitwise the row computed alone, in
// another batch and on 1, 2 or 3 threads.
void test_linear(at::ScalarType dt) {
  const auto opt = at::TensorOptions().dtype(dt);
  at::manual_seed(11);
  int cases = 0;
  double worst = 0, worst_torch = 0;
  for (int64_t K : {128, 12, 131, 384}) {
    for (int64_t N : {1, 5, 16, 37, 64, 130}) {
      at::Tensor W = at::randn({N, K}, opt), b = at::randn({N}, opt);
      for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33}) {
        at::Tensor x = at::randn({M, K}, opt);
        for (bool bias : {false, true}) {
          const at::Tensor bb = bias ? b : at::Tensor();
          at::Tensor y;
          {
            at::NoGradGuard ng;
            y = dispatch::linear(x, W, bb);
          }
          CHECK(y.sizes() == at::IntArrayRef({M, N}) && y.scalar_type() == dt);
          // Naive reference in long double.
          at::Tensor xd = x.to(at::kDouble).contiguous(), wd = W.to(at::kDouble).contiguous(), bd = b.to(at::kDouble);
          const double* xp = xd.data_ptr<double>();
          const double* wp = wd.data_ptr<double>();
          at::Tensor ref = at::empty({M, N}, at::kDouble);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              long double s = 0;
              for (int64_t k = 0; k < K; ++k) s += static_cast<long double>(xp[m * K + k]) * wp[n * K + k];
              if (bias) s += bd[n].item<double>();
              ref[m][n] = static_cast<double>(s);
            }
          // Tolerance scaled by the sum of |terms| (the condition of a dot product).
          at::Tensor scale = at::matmul(xd.abs(), wd.abs().t()) + (bias ? bd.abs() : at::zeros({N}, at::kDouble));
          const double eps = dt == at::kDouble ? 1e-15 : 1e-6;
          const double err = ((y.to(at::kDouble) - ref).abs() / scale).max().item<double>() / eps;
          worst = std::max(worst, err);
          const at::Tensor t = at::linear(x, W, bb);
          worst_torch = std::max(worst_torch, ((y - t).abs().to(at::kDouble) / scale).max().item<double>() / eps);
          ++cases;
        }
      }
    }
  }
  std::printf("linear %s: %d cases, worst |kernel - exact| = %.3g eps x sum|terms|, |kernel - at::linear| = %.3g\n",
              c10::toString(dt), cases, worst, worst_torch);
  CHECK(worst <= 32.0);
  CHECK(worst_torch <= 64.0);

  // Batch invariance: each row alone, in the full call, in a reordered call
  // with other rows, and with 1, 2 and 3 threads.
  const int64_t K = 131, N = 1206, M = 11;
  at::Tensor W = at::randn({N, K}, opt), b = at::randn({N}, opt);
  at::Tensor x = at::randn({M, K}, opt);
  at::NoGradGuard ng;
  const int threads0 = at::get_num_threads();
  std::vector<at::Tensor> full;
  for (int th : {1, 2, 3}) {
    at::set_num_threads(th);
    full.push_back(dispatch::linear(x, W, b));
  }
  at::set_num_threads(threads0);
  CHECK(full[0].equal(full[1]) && full[0].equal(full[2]));
  bool alone = true, mixed = true;
  at::Tensor other = at::randn({5, K}, opt);
  for (int64_t r = 0; r < M; ++r) {
    alone = alone && dispatch::linear(x.slice(0, r, r + 1).contiguous(), W, b)[0].equal(full[0][r]);
    // r as the last row behind 5 others (another tile position and remainder).
    at::Tensor batch = at::cat({other, x.slice(0, r, r + 1)}, 0).contiguous();
    mixed = mixed && dispatch::linear(batch, W, b)[5].equal(full[0][r]);
  }
  CHECK(alone);
  CHECK(mixed);

  // Bad input names what is wrong.
  CHECK_THROWS(dispatch::linear(x, W.slice(1, 0, 130).contiguous(), b), "does not match rows of 131");
  CHECK_THROWS(dispatch::linear(x, W, b.slice(0, 0, 7)), "bias has 7 elements for 1206 outputs");
  CHECK_THROWS(dispatch::linear(x, W.to(dt == at::kDouble ? at::kFloat : at::kDouble), b), "the weight");
  CHECK_THROWS(dispatch::linear(x.t(), W, b), "contiguous (M, K)");

  // Empty shapes: no rows, and rows of no inputs (the bias alone).
  CHECK(dispatch::linear(at::zeros({0, K}, opt), W, b).sizes() == at::IntArrayRef({0, N}));
  CHECK(dispatch::linear(at::zeros({3, 0}, opt), at::zeros({N, 0}, opt), b).equal(b.unsqueeze(0).expand({3, N})));

  // The model takes the torch path for a weight the kernel cannot read in
  // place (a transposed view) instead of failing.
  {
    Model m(tiny_config("qwen3"), dt);
    const FusedInferenceScope scope;
    CHECK(m.fused_inference(x));
    const at::Tensor Wt = at::randn({K, 7}, opt).t();  // (7, K), not contiguous
    CHECK(tolerance_ratio(m.project(x, Wt, at::Tensor(), false), at::linear(x, Wt), tol(dt), tol(dt)) <= 1.0);
    CHECK(tolerance_ratio(m.project(x, W, b, true), at::linear(x, W, b), tol(dt), tol(dt)) <= 1.0);
  }
}

// The plain decode attention of engine.cc: gather, pad, softmax, matmul.
at::Tensor plain_decode(const at::Tensor& q, const at::Tensor& kpool, const at::Tensor& vpool, const at::Tensor& rows,
                        const at::Tensor& slots, const at::Tensor& lengths, double scale) {
  const int64_t B = rows.size(0), max_ctx = slots.size(1), H = q.size(1), D = q.size(2), KVH = kpool.size(1), G = H / KVH;
  at::Tensor qd = q.index_select(0, rows).view({B, KVH, G, D});
  at::Tensor kd = kpool.index_select(0, slots.view(-1)).view({B, max_ctx, KVH, D});
  at::Tensor vd = vpool.index_select(0, slots.view(-1)).view({B, max_ctx, KVH, D});
  at::Tensor scores = at::matmul(qd, kd.permute({0, 2, 3, 1})).mul(scale);
  at::Tensor pad = at::arange(max_ctx, at::kLong).unsqueeze(0) >= lengths.unsqueeze(1);
  scores = scores.masked_fill(pad.view({B, 1, 1, max_ctx}), -std::numeric_limits<double>::infinity());
  at::Tensor probs = at::softmax(scores, -1, q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat).to(q.scalar_type());
  return at::matmul(probs, vd.permute({0, 2, 1, 3})).reshape({B, H * D});
}

// qscale 30: scores spread over hundreds, so most softmax weights underflow
// (the float kernel's exp clamps below -87).
void test_decode_attention(at::ScalarType dt, int64_t D, double qscale) {
  at::manual_seed(9);
  const int64_t N = 9, H = 8, KVH = 2, pool = 200, B = 5, max_ctx = 37;
  const auto o = at::TensorOptions().dtype(dt);
  at::Tensor q = at::randn({N, H, D}, o) * qscale, kpool = at::randn({pool, KVH, D}, o) * 2, vpool = at::randn({pool, KVH, D}, o);
  at::Tensor rows = at::tensor(std::vector<int64_t>{8, 0, 3, 5, 1});
  at::Tensor lengths = at::tensor(std::vector<int64_t>{37, 1, 12, 30, 2});
  at::Tensor slots = at::randint(0, pool, {B, max_ctx}, at::kLong);  // scattered, repeated slots allowed
  at::Tensor out = at::full({N, H * D}, 7.0, o);                       // rows not decoded stay untouched
  const double scale = 0.25;
  dispatch::decode_attention(out, q, kpool, vpool, rows, slots, lengths, scale);
  at::Tensor ref = plain_decode(q, kpool, vpool, rows, slots, lengths, scale);
  CHECK(tolerance_ratio(out.index_select(0, rows), ref, tol(dt), tol(dt)) <= 1.0);
  CHECK(out[2].eq(7.0).all().item<bool>() && out[4].eq(7.0).all().item<bool>());
  // Bad input is an error naming what is wrong, not a read out of bounds.
  at::Tensor bad = slots.clone();
  bad[1][0] = pool + 3;
  CHECK_THROWS(dispatch::decode_attention(out, q, kpool, vpool, rows, bad, lengths, scale), "outside the pool of 200");
  at::Tensor badlen = lengths.clone();
  badlen[0] = max_ctx + 1;
  CHECK_THROWS(dispatch::decode_attention(out, q, kpool, vpool, rows, slots, badlen, scale), "outside [1, 37]");
  CHECK_THROWS(dispatch::decode_attention(out, q, kpool.to(at::kBFloat16), vpool, rows, slots, lengths, scale), "key pool");

  // Flat layout: one slot list shared by the rows of a multi-token path
  // (lengths past + 1 .. past + n: causal attention) next to single rows;
  // the reference is the padded plain path over each row's own copy.
  at::Tensor flat = at::randint(0, pool, {60}, at::kLong);
  const std::vector<int64_t> frows{0, 1, 2, 3, 4, 6, 7}, flens{20, 21, 22, 23, 5, 40, 1}, foffs{10, 10, 10, 10, 0, 20, 59};
  at::Tensor padded = at::zeros({7, 40}, at::kLong);
  for (int64_t b = 0; b < 7; ++b) padded[b].slice(0, 0, flens[b]).copy_(flat.slice(0, foffs[b], foffs[b] + flens[b]));
  at::Tensor frow_t = at::tensor(frows), flen_t = at::tensor(flens), foff_t = at::tensor(foffs);
  at::Tensor fout = at::full({N, H * D}, 7.0, o);
  dispatch::decode_attention(fout, q, kpool, vpool, frow_t, flat, flen_t, scale, foff_t);
  CHECK(tolerance_ratio(fout.index_select(0, frow_t), plain_decode(q, kpool, vpool, frow_t, padded, flen_t, scale), tol(dt), tol(dt)) <= 1.0);
  CHECK(fout[5].eq(7.0).all().item<bool>() && fout[8].eq(7.0).all().item<bool>());
  // A row is computed alone: the same row in another company gives the same bits.
  at::Tensor solo = at::full({N, H * D}, 7.0, o);
  dispatch::decode_attention(solo, q, kpool, vpool, frow_t.slice(0, 2, 3), flat, flen_t.slice(0, 2, 3), scale, foff_t.slice(0, 2, 3));
  CHECK(solo[2].equal(fout[2]));
  at::Tensor badoff = foff_t.clone();
  badoff[5] = 30;  // 30 + 40 > 60 entries
  CHECK_THROWS(dispatch::decode_attention(fout, q, kpool, vpool, frow_t, flat, flen_t, scale, badoff), "outside the list of 60");
  CHECK_THROWS(dispatch::decode_attention(fout, q, kpool, vpool, frow_t, flat, flen_t, scale, foff_t.slice(0, 0, 3)), "7 rows but 3 offsets");

  // Groups: rows 0-3 as one group of 4 (lengths 20..23 of the list at 10),
  // rows 6-8 as a group of 3 (lengths 38..40 at 20), row 4 alone; the same
  // numbers as the row-by-row call above, bit for bit (a row's sums do not
  // depend on its group), and the padded plain path within tolerance.
  at::Tensor grows = at::tensor(std::vector<int64_t>{0, 4, 6}), glens = at::tensor(std::vector<int64_t>{20, 5, 38});
  at::Tensor goffs = at::tensor(std::vector<int64_t>{10, 0, 20}), gcounts = at::tensor(std::vector<int64_t>{4, 1, 3});
  at::Tensor gout = at::full({N, H * D}, 7.0, o);
  dispatch::decode_attention(gout, q, kpool, vpool, grows, flat, glens, scale, goffs, gcounts);
  at::Tensor rrows = at::tensor(std::vector<int64_t>{0, 1, 2, 3, 4, 6, 7, 8});
  at::Tensor rlens = at::tensor(std::vector<int64_t>{20, 21, 22, 23, 5, 38, 39, 40});
  at::Tensor roffs = at::tensor(std::vector<int64_t>{10, 10, 10, 10, 0, 20, 20, 20});
  at::Tensor rout = at::full({N, H * D}, 7.0, o);
  dispatch::decode_attention(rout, q, kpool, vpool, rrows, flat, rlens, scale, roffs);
  CHECK(gout.equal(rout));
  at::Tensor rpadded = at::zeros({8, 40}, at::kLong);
  for (int64_t b = 0; b < 8; ++b) {
    const int64_t off = roffs[b].item<int64_t>(), len = rlens[b].item<int64_t>();
    rpadded[b].slice(0, 0, len).copy_(flat.slice(0, off, off + len));
  }
  CHECK(tolerance_ratio(gout.index_select(0, rrows), plain_decode(q, kpool, vpool, rrows, rpadded, rlens, scale), tol(dt), tol(dt)) <= 1.0);
  CHECK(gout[5].eq(7.0).all().item<bool>());
  at::Tensor bigcount = gcounts.clone();
  bigcount[2] = 4;  // rows 6..9: past q's 9 rows
  CHECK_THROWS(dispatch::decode_attention(gout, q, kpool, vpool, grows, flat, glens, scale, goffs, bigcount), "outside q");
  at::Tensor zerocount = gcounts.clone();
  zerocount[1] = 0;
  CHECK_THROWS(dispatch::decode_attention(gout, q, kpool, vpool, grows, flat, glens, scale, goffs, zerocount), "group 1 has 0 rows");
  at::Tensor longgroup = glens.clone();
  longgroup[2] = 40;  // 40 + 3 - 1 keys from offset 20: past the 60 entries
  CHECK_THROWS(dispatch::decode_attention(gout, q, kpool, vpool, grows, flat, longgroup, scale, goffs, gcounts), "outside the list of 60");
}

// Grouped-query attention: the G query heads of a KV head are summed in one
// pass over its value rows (in passes of up to 4, or 2 at head dim 128);
// each head's output is bit for bit that of the head alone (H = KVH = 1).
void test_decode_attention_heads(at::ScalarType dt, int64_t D) {
  at::manual_seed(13);
  const int64_t G = 7, KVH = 2, H = G * KVH, pool = 300, L = 150;
  const auto o = at::TensorOptions().dtype(dt);
  at::Tensor q = at::randn({3, H, D}, o), kpool = at::randn({pool, KVH, D}, o), vpool = at::randn({pool, KVH, D}, o);
  at::Tensor flat = at::randint(0, pool, {L}, at::kLong);
  at::Tensor rows = at::tensor(std::vector<int64_t>{0, 1}), lens = at::tensor(std::vector<int64_t>{150, 40});
  at::Tensor offs = at::tensor(std::vector<int64_t>{0, 100}), counts = at::tensor(std::vector<int64_t>{1, 2});
  at::Tensor all = at::zeros({3, H * D}, o);
  dispatch::decode_attention(all, q, kpool, vpool, rows, flat, lens, 0.3, offs, counts);
  bool same = true;
  for (int64_t kvh = 0; kvh < KVH; ++kvh) {
    at::Tensor k1 = kpool.select(1, kvh).unsqueeze(1).contiguous(), v1 = vpool.select(1, kvh).unsqueeze(1).contiguous();
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = kvh * G + g;
      at::Tensor q1 = q.select(1, h).unsqueeze(1).contiguous(), one = at::zeros({3, D}, o);
      dispatch::decode_attention(one, q1, k1, v1, rows, flat, lens, 0.3, offs, counts);
      same = same && one.equal(all.view({3, H, D}).select(1, h));
    }
  }
  CHECK(same);
}

// A call big enough to be cut across threads (decode rows and 16-row groups
// up to 600 keys): the same bits at 1 and 3 threads, and the padded plain
// path within tolerance.
void test_decode_attention_threads(at::ScalarType dt) {
  at::manual_seed(11);
  const int64_t H = 8, KVH = 2, D = 16, pool = 900, L = 620;
  const auto o = at::TensorOptions().dtype(dt);
  std::vector<int64_t> rows, lens, offs, counts;
  int64_t N = 0;
  for (int64_t b = 0; b < 24; ++b) {
    const int64_t n = b % 3 == 2 ? 16 : 1, len = 20 + (b * 37) % (L - 40);
    rows.push_back(N);
    lens.push_back(len);
    offs.push_back((b * 53) % (L - len - n + 1));
    counts.push_back(n);
    N += n;
  }
  at::Tensor q = at::randn({N, H, D}, o), kpool = at::randn({pool, KVH, D}, o), vpool = at::randn({pool, KVH, D}, o);
  at::Tensor flat = at::randint(0, pool, {L}, at::kLong);
  at::Tensor rt = at::tensor(rows), lt = at::tensor(lens), ot = at::tensor(offs), ct = at::tensor(counts);
  const int threads = at::get_num_threads();
  at::Tensor one = at::zeros({N, H * D}, o), three = at::zeros({N, H * D}, o);
  at::set_num_threads(1);
  dispatch::decode_attention(one, q, kpool, vpool, rt, flat, lt, 0.25, ot, ct);
  at::set_num_threads(3);
  dispatch::decode_attention(three, q, kpool, vpool, rt, flat, lt, 0.25, ot, ct);
  at::set_num_threads(threads);
  CHECK(one.equal(three));
  // Row by row through the padded reference.
  std::vector<int64_t> rr, rl;
  at::Tensor padded = at::zeros({N, L}, at::kLong);
  for (size_t b = 0; b < rows.size(); ++b)
    for (int64_t t = 0; t < counts[b]; ++t) {
      rr.push_back(rows[b] + t);
      rl.push_back(lens[b] + t);
      padded[rows[b] + t].slice(0, 0, lens[b] + t).copy_(flat.slice(0, offs[b], offs[b] + lens[b] + t));
    }
  at::Tensor rrt = at::tensor(rr), rlt = at::tensor(rl);
  CHECK(tolerance_ratio(one.index_select(0, rrt), plain_decode(q, kpool, vpool, rrt, padded.index_select(0, rrt), rlt, 0.25), tol(dt), tol(dt)) <= 1.0);
}

// One engine run: a shared prompt, forks, then steps mixing decode rows and
// multi-token (tool result) rows; every step's logits and sampled tokens.
struct Run {
  std::vector<at::Tensor> logits;
  std::vector<std::vector<int32_t>> tokens;
};

Run run_engine(const Model& m, uint32_t seed) {
  Engine e(m, KVCache::Options{4, 8, 0}, 1);
  KVCache& kv = e.cache();
  const int64_t V = m.config().vocab_size;
  const int32_t root = kv.new_path(0);
  e.extend_logits({root}, {random_tokens(21, V, seed)});
  std::vector<int32_t> paths;
  for (int i = 0; i < 5; ++i) paths.push_back(kv.fork(root, 21 - (i % 3), 100 + i));  // mid-block forks
  std::mt19937 g(seed);
  arpo::kernels::SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = 42;
  Run r;
  std::vector<int32_t> last(paths.size(), 1);
  for (int step = 0; step < 12; ++step) {
    std::vector<std::vector<int32_t>> inputs;
    for (size_t i = 0; i < paths.size(); ++i) {
      const bool tool_result = (step + i) % 5 == 3;
      inputs.push_back(tool_result ? random_tokens(2 + g() % 9, V, seed + step * 31 + i) : std::vector<int32_t>{last[i]});
    }
    DecodeResult d = e.extend(paths, inputs, sp);
    r.tokens.push_back(d.tokens);
    for (size_t i = 0; i < paths.size(); ++i) last[i] = d.tokens[i];
    r.logits.push_back(e.extend_logits({paths[step % paths.size()]}, {{last[step % paths.size()]}}));
    last[step % paths.size()] = static_cast<int32_t>(r.logits.back().argmax(-1).item<int64_t>());
    if (step == 6) paths.push_back(kv.fork(paths[1], kv.length(paths[1]) - 2, 300));
    if (paths.size() > last.size()) last.push_back(3);
  }
  return r;
}

void test_engine(const std::string& type, at::ScalarType dt) {
  ModelConfig c = tiny_config(type);
  Model m(c, dt);
  m.init_weights(17);
  const Run fused = run_engine(m, 5);
  m.set_fused_inference(false);
  const Run plain = run_engine(m, 5);
  double worst = 0;
  for (size_t i = 0; i < plain.logits.size(); ++i) worst = std::max(worst, tolerance_ratio(fused.logits[i], plain.logits[i], tol(dt), tol(dt)));
  std::printf("%s %s: fused vs plain engine logits, worst |diff| / (tol + tol |ref|) = %.3g\n", type.c_str(),
              c10::toString(dt), worst);
  CHECK(worst <= 1.0);
  if (dt == at::kDouble) CHECK(fused.tokens == plain.tokens);
}

}  // namespace

int main() {
  for (at::ScalarType dt : {at::kDouble, at::kFloat}) {
    test_rms_norm_and_rope(dt);
    test_linear(dt);
    for (int64_t D : {16, 12, 64}) test_decode_attention(dt, D, 1.0);  // 12: not a multiple of the vector width
    test_decode_attention(dt, 16, 30.0);
    test_decode_attention_threads(dt);
    for (int64_t D : {16, 32, 64, 128, 12}) test_decode_attention_heads(dt, D);
    for (const char* type : {"qwen2", "qwen3", "llama"}) test_engine(type, dt);
  }
  return arpo_test::summary();
}
