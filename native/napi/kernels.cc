// N-API bindings of the fused kernels (native/kernels): typed arrays in and
// out, zero-copy. TypeScript (lib/native/kernels.ts) validates arguments
// first; this layer re-checks what it cannot trust (array types, lengths
// against T and V) and turns every C++ exception into a JS Error. The large
// kernels also have ...Async variants: an AsyncWorker runs the kernel off the
// JS thread, holding references to every buffer until it settles.
#include <napi.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernels.h"

namespace arpo {
namespace napi {
namespace {

namespace K = arpo::kernels;

// ---------------------------------------------------------------- arguments
// Reads positional arguments; every failure throws K::Error naming the
// argument, which the entry points convert into a JS Error.
class Args {
 public:
  Args(const Napi::CallbackInfo& info, const char* op) : info_(info), op_(op) {}

  const char* op() const { return op_; }
  Napi::Env env() const { return info_.Env(); }

  bool is_null(size_t i) const { return i >= info_.Length() || info_[i].IsNull() || info_[i].IsUndefined(); }

  double number(size_t i, const char* name) const {
    if (i >= info_.Length() || !info_[i].IsNumber()) fail(name, "a number");
    return info_[i].As<Napi::Number>().DoubleValue();
  }
  int64_t integer(size_t i, const char* name, int64_t lo, int64_t hi) const {
    const double v = number(i, name);
    if (!(v == std::floor(v)) || v < static_cast<double>(lo) || v > static_cast<double>(hi))
      fail(name, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(v));
    return static_cast<int64_t>(v);
  }
  uint64_t u64(size_t i, const char* name) const {
    if (i < info_.Length() && info_[i].IsBigInt()) {
      bool lossless = false;
      const uint64_t v = info_[i].As<Napi::BigInt>().Uint64Value(&lossless);
      if (!lossless) fail(name, "a bigint in [0, 2^64)");
      return v;
    }
    return static_cast<uint64_t>(integer(i, name, 0, (int64_t{1} << 53)));
  }
  Napi::Object object(size_t i, const char* name) const {
    if (i >= info_.Length() || !info_[i].IsObject()) fail(name, "an object");
    return info_[i].As<Napi::Object>();
  }
  double field(const Napi::Object& o, const char* name) const {
    const Napi::Value v = o.Get(name);
    if (!v.IsNumber()) fail(name, "a number field");
    return v.As<Napi::Number>().DoubleValue();
  }

  // A typed array of the given type and, when expected >= 0, that many
  // elements; null/undefined is allowed when optional (returns nullptr).
  template <typename T>
  T* array(size_t i, const char* name, napi_typedarray_type type, int64_t expected, bool optional = false) {
    if (is_null(i)) {
      if (optional) return nullptr;
      fail(name, std::string("a ") + type_name(type));
    }
    if (!info_[i].IsTypedArray()) fail(name, std::string("a ") + type_name(type));
    Napi::TypedArray ta = info_[i].As<Napi::TypedArray>();
    if (ta.TypedArrayType() != type) fail(name, std::string("a ") + type_name(type));
    const int64_t len = static_cast<int64_t>(ta.ElementLength());
    if (expected >= 0 && len != expected)
      fail(name, std::string("a ") + type_name(type) + " of length " + std::to_string(expected) + ", got length " +
                     std::to_string(len));
    void* base = ta.ArrayBuffer().Data();
    if (len > 0 && base == nullptr) fail(name, "a typed array with a live (not detached) buffer");
    keep_.push_back(Napi::Persistent(info_[i].As<Napi::Object>()));
    return reinterpret_cast<T*>(static_cast<uint8_t*>(base) + ta.ByteOffset());
  }
  int64_t length(size_t i) const {
    return is_null(i) || !info_[i].IsTypedArray() ? -1 : static_cast<int64_t>(info_[i].As<Napi::TypedArray>().ElementLength());
  }

  // Logits: Float32Array (F32) or Uint16Array (bf16 bits) of length T * V.
  K::Logits logits(size_t i, int64_t T, int64_t V) {
    K::Logits lg;
    lg.rows = T;
    lg.vocab = V;
    if (!is_null(i) && info_[i].IsTypedArray() && info_[i].As<Napi::TypedArray>().TypedArrayType() == napi_uint16_array) {
      lg.dtype = K::DType::BF16;
      lg.data = array<uint16_t>(i, "logits", napi_uint16_array, T * V);
    } else {
      lg.dtype = K::DType::F32;
      lg.data = array<float>(i, "logits", napi_float32_array, T * V);
    }
    return lg;
  }

  std::vector<Napi::ObjectReference> take_references() { return std::move(keep_); }

  [[noreturn]] void fail(const char* name, const std::string& what) const {
    throw K::Error(std::string(op_) + ": expected " + what + " for " + name);
  }

 private:
  static const char* type_name(napi_typedarray_type t) {
    switch (t) {
      case napi_float32_array: return "Float32Array";
      case napi_float64_array: return "Float64Array";
      case napi_int32_array: return "Int32Array";
      case napi_uint16_array: return "Uint16Array";
      case napi_bigint64_array: return "BigInt64Array";
      case napi_biguint64_array: return "BigUint64Array";
      default: return "typed array";
    }
  }
  const Napi::CallbackInfo& info_;
  const char* op_;
  std::vector<Napi::ObjectReference> keep_;
};

// A parsed call: the kernel to run (touching no JS) and how to build the
// JS result afterwards.
struct Job {
  std::function<void()> run;
  std::function<Napi::Value(Napi::Env)> result;
};

// Runs a Job off the JS thread; resolves/rejects a Promise on the JS thread.
class KernelWorker : public Napi::AsyncWorker {
 public:
  KernelWorker(Napi::Env env, std::string op, Job job, std::vector<Napi::ObjectReference> keep)
      : Napi::AsyncWorker(env, op.c_str()), op_(std::move(op)), job_(std::move(job)), keep_(std::move(keep)),
        deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise promise() { return deferred_.Promise(); }

 protected:
  void Execute() override {
    try {
      job_.run();
    } catch (const std::exception& e) {
      SetError(e.what());
    } catch (...) {
      SetError(op_ + ": unknown native error");
    }
  }
  void OnOK() override { deferred_.Resolve(job_.result(Env())); }
  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  std::string op_;
  Job job_;
  std::vector<Napi::ObjectReference> keep_;  // buffers stay alive until the worker is deleted
  Napi::Promise::Deferred deferred_;
};

using Parser = Job (*)(Args&);

// Sync entry: parse, run, return; every C++ exception becomes a JS Error.
template <Parser P>
Napi::Value Sync(const Napi::CallbackInfo& info, const char* op) {
  Args args(info, op);
  try {
    Job job = P(args);
    job.run();
    return job.result(info.Env());
  } catch (const Napi::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Napi::Error::New(info.Env(), e.what());
  } catch (...) {
    throw Napi::Error::New(info.Env(), std::string(op) + ": unknown native error");
  }
}

// Async entry: parse on the JS thread (argument errors reject the Promise),
// run in the worker pool.
template <Parser P>
Napi::Value Async(const Napi::CallbackInfo& info, const char* op) {
  Args args(info, op);
  Job job;
  try {
    job = P(args);
  } catch (const std::exception& e) {
    auto d = Napi::Promise::Deferred::New(info.Env());
    d.Reject(Napi::Error::New(info.Env(), e.what()).Value());
    return d.Promise();
  }
  auto* w = new KernelWorker(info.Env(), op, std::move(job), args.take_references());
  Napi::Promise p = w->promise();
  w->Queue();
  return p;
}

Napi::Value Undefined(Napi::Env env) { return env.Undefined(); }

// ---------------------------------------------------------------- parsers
constexpr int64_t kMaxDim = int64_t{1} << 40;

// logitsStats(logits, T, V, targets|null, temperature, threads, outLse|null, outEntropy|null, outNorm|null, outLogprob|null)
Job ParseLogitsStats(Args& a) {
  const int64_t T = a.integer(1, "T", 0, kMaxDim), V = a.integer(2, "V", 1, kMaxDim);
  const K::Logits lg = a.logits(0, T, V);
  const int32_t* targets = a.array<int32_t>(3, "targets", napi_int32_array, T, true);
  const float temperature = static_cast<float>(a.number(4, "temperature"));
  const int32_t threads = static_cast<int32_t>(a.integer(5, "threads", 0, 1024));
  float* lse = a.array<float>(6, "logsumexp", napi_float32_array, T, true);
  float* ent = a.array<float>(7, "entropy", napi_float32_array, T, true);
  float* norm = a.array<float>(8, "entropyNorm", napi_float32_array, T, true);
  float* logp = a.array<float>(9, "targetLogprob", napi_float32_array, T, true);
  return Job{[=] { K::logits_stats(lse, ent, norm, logp, lg, targets, temperature, threads); }, Undefined};
}

// sampleTokens(logits, T, V, streams|null, positions|null, temperature, topK, topP, seed, threads,
//              outTokens, outLogprob|null, outEntropy|null, outNorm|null)
Job ParseSampleTokens(Args& a) {
  const int64_t T = a.integer(1, "T", 0, kMaxDim), V = a.integer(2, "V", 1, kMaxDim);
  const K::Logits lg = a.logits(0, T, V);
  const uint64_t* streams = a.array<uint64_t>(3, "streams", napi_biguint64_array, T, true);
  const int64_t* positions = a.array<int64_t>(4, "positions", napi_bigint64_array, T, true);
  K::SamplingParams p;
  p.temperature = static_cast<float>(a.number(5, "temperature"));
  p.top_k = static_cast<int32_t>(a.integer(6, "topK", 0, INT32_MAX));
  p.top_p = static_cast<float>(a.number(7, "topP"));
  p.seed = a.u64(8, "seed");
  const int32_t threads = static_cast<int32_t>(a.integer(9, "threads", 0, 1024));
  int32_t* tokens = a.array<int32_t>(10, "tokens", napi_int32_array, T);
  float* logp = a.array<float>(11, "logprobs", napi_float32_array, T, true);
  float* ent = a.array<float>(12, "entropy", napi_float32_array, T, true);
  float* norm = a.array<float>(13, "entropyNorm", napi_float32_array, T, true);
  return Job{[=] { K::sample_tokens(tokens, logp, ent, norm, lg, streams, positions, p, threads); }, Undefined};
}

// entropyDelta(entropy, starts, ends, baseline|null, k, outMean, outCount|null, outDelta|null)
Job ParseEntropyDelta(Args& a) {
  const float* entropy = a.array<float>(0, "entropy", napi_float32_array, -1);
  const int64_t T = a.length(0);
  const int64_t* starts = a.array<int64_t>(1, "starts", napi_bigint64_array, -1);
  const int64_t S = a.length(1);
  const int64_t* ends = a.array<int64_t>(2, "ends", napi_bigint64_array, S);
  const int32_t* baseline = a.array<int32_t>(3, "baseline", napi_int32_array, S, true);
  const int32_t k = static_cast<int32_t>(a.integer(4, "k", INT32_MIN, INT32_MAX));
  float* mean = a.array<float>(5, "windowMean", napi_float32_array, S);
  int32_t* count = a.array<int32_t>(6, "windowCount", napi_int32_array, S, true);
  float* delta = a.array<float>(7, "delta", napi_float32_array, S, true);
  return Job{[=] { K::entropy_delta(mean, count, delta, entropy, T, starts, ends, baseline, S, k); }, Undefined};
}

Napi::Value LossResult(Napi::Env env, const K::PolicyLossResult& r) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("loss", r.loss);
  o.Set("pgLoss", r.pg_loss);
  o.Set("pgClipfrac", r.pg_clipfrac);
  o.Set("pgClipfracLower", r.pg_clipfrac_lower);
  o.Set("ppoKl", r.ppo_kl);
  o.Set("entropy", r.entropy);
  o.Set("kl", r.kl);
  o.Set("tokens", r.tokens);
  return o;
}

// policyLoss(logits, T, V, targets, oldLogprobs, advantages, mask, seqIds|null, numSeqs, refLogprobs|null,
//            config, threads, grad|null, outLogprobs|null, outEntropy|null) -> result
// config: { clipLow, clipHigh, dualClipC, klType (0..3), klCoef, entropyCoef, aggregation (0..3),
//           temperature, denominator, normConstant, gradScale } (numbers).
Job ParsePolicyLoss(Args& a) {
  const int64_t T = a.integer(1, "T", 0, kMaxDim), V = a.integer(2, "V", 1, kMaxDim);
  const K::Logits lg = a.logits(0, T, V);
  const int32_t* targets = a.array<int32_t>(3, "targets", napi_int32_array, T);
  const float* old_lp = a.array<float>(4, "oldLogprobs", napi_float32_array, T);
  const float* adv = a.array<float>(5, "advantages", napi_float32_array, T);
  const float* mask = a.array<float>(6, "mask", napi_float32_array, T);
  const int32_t* seq_ids = a.array<int32_t>(7, "seqIds", napi_int32_array, T, true);
  const int64_t num_seqs = a.integer(8, "numSeqs", 0, kMaxDim);
  const float* ref_lp = a.array<float>(9, "refLogprobs", napi_float32_array, T, true);
  const Napi::Object c = a.object(10, "config");
  K::PolicyLossConfig cfg;
  cfg.clip_low = static_cast<float>(a.field(c, "clipLow"));
  cfg.clip_high = static_cast<float>(a.field(c, "clipHigh"));
  cfg.dual_clip_c = static_cast<float>(a.field(c, "dualClipC"));
  cfg.kl_type = static_cast<K::KLType>(static_cast<int32_t>(a.field(c, "klType")));
  cfg.kl_coef = static_cast<float>(a.field(c, "klCoef"));
  cfg.entropy_coef = static_cast<float>(a.field(c, "entropyCoef"));
  cfg.aggregation = static_cast<K::Aggregation>(static_cast<int32_t>(a.field(c, "aggregation")));
  cfg.temperature = static_cast<float>(a.field(c, "temperature"));
  cfg.denominator = a.field(c, "denominator");
  cfg.norm_constant = a.field(c, "normConstant");
  cfg.grad_scale = static_cast<float>(a.field(c, "gradScale"));
  const int32_t threads = static_cast<int32_t>(a.integer(11, "threads", 0, 1024));
  float* grad = a.array<float>(12, "grad", napi_float32_array, T * V, true);
  float* out_lp = a.array<float>(13, "logprobs", napi_float32_array, T, true);
  float* out_ent = a.array<float>(14, "entropy", napi_float32_array, T, true);
  auto result = std::make_shared<K::PolicyLossResult>();
  return Job{[=] { K::policy_loss(result.get(), grad, out_lp, out_ent, lg, targets, old_lp, adv, mask, seq_ids, num_seqs,
                                  ref_lp, cfg, threads); },
             [result](Napi::Env env) { return LossResult(env, *result); }};
}

// treeReduce(parent, leafNode, leafAdv, outSum|null, outMean|null, outCount|null)
Job ParseTreeReduce(Args& a) {
  const int32_t* parent = a.array<int32_t>(0, "parent", napi_int32_array, -1);
  const int64_t N = a.length(0);
  const int32_t* leaf_node = a.array<int32_t>(1, "leafNode", napi_int32_array, -1);
  const int64_t L = a.length(1);
  const float* leaf_adv = a.array<float>(2, "leafAdvantage", napi_float32_array, L);
  float* sum = a.array<float>(3, "nodeSum", napi_float32_array, N, true);
  float* mean = a.array<float>(4, "nodeMean", napi_float32_array, N, true);
  int32_t* count = a.array<int32_t>(5, "nodeCount", napi_int32_array, N, true);
  return Job{[=] { K::tree_reduce(sum, mean, count, parent, N, leaf_node, leaf_adv, L); }, Undefined};
}

// treeReduceSigned(parent, leafNode, leafAdv, leafWeight, posSum, negSum, weightSum, posCount, negCount, count)
Job ParseTreeReduceSigned(Args& a) {
  const int32_t* parent = a.array<int32_t>(0, "parent", napi_int32_array, -1);
  const int64_t N = a.length(0);
  const int32_t* leaf_node = a.array<int32_t>(1, "leafNode", napi_int32_array, -1);
  const int64_t L = a.length(1);
  const double* leaf_adv = a.array<double>(2, "leafAdvantage", napi_float64_array, L);
  const double* leaf_weight = a.array<double>(3, "leafWeight", napi_float64_array, L);
  double* pos = a.array<double>(4, "posSum", napi_float64_array, N, true);
  double* neg = a.array<double>(5, "negSum", napi_float64_array, N, true);
  double* wsum = a.array<double>(6, "weightSum", napi_float64_array, N, true);
  int32_t* cpos = a.array<int32_t>(7, "posCount", napi_int32_array, N, true);
  int32_t* cneg = a.array<int32_t>(8, "negCount", napi_int32_array, N, true);
  int32_t* call = a.array<int32_t>(9, "count", napi_int32_array, N, true);
  return Job{[=] { K::tree_reduce_signed(pos, neg, wsum, cpos, cneg, call, parent, N, leaf_node, leaf_adv, leaf_weight, L); },
             Undefined};
}

// treeExpand(tokenValue, nodeValue, tokenOffset, tokenCount)
Job ParseTreeExpand(Args& a) {
  float* token_value = a.array<float>(0, "tokenValue", napi_float32_array, -1);
  const int64_t P = a.length(0);
  const float* node_value = a.array<float>(1, "nodeValue", napi_float32_array, -1);
  const int64_t N = a.length(1);
  const int64_t* offset = a.array<int64_t>(2, "tokenOffset", napi_bigint64_array, N);
  const int64_t* count = a.array<int64_t>(3, "tokenCount", napi_bigint64_array, N);
  return Job{[=] { K::tree_expand(token_value, P, node_value, offset, count, N); }, Undefined};
}

// benchSum(values, threads) -> sum (the bandwidth baseline of bench/stats.ts)
Job ParseBenchSum(Args& a) {
  const float* x = a.array<float>(0, "values", napi_float32_array, -1);
  const int64_t n = a.length(0);
  const int32_t threads = static_cast<int32_t>(a.integer(1, "threads", 0, 1024));
  auto out = std::make_shared<double>(0.0);
  return Job{[=] { *out = K::plain_sum(x, n, threads); }, [out](Napi::Env env) { return Napi::Number::New(env, *out); }};
}

Napi::Value Noop(const Napi::CallbackInfo& info) { return info.Env().Undefined(); }

#define ARPO_SYNC(name, parser) [](const Napi::CallbackInfo& info) { return Sync<parser>(info, name); }
#define ARPO_ASYNC(name, parser) [](const Napi::CallbackInfo& info) { return Async<parser>(info, name); }

}  // namespace

void InitKernels(Napi::Env env, Napi::Object exports) {
  exports.Set("noop", Napi::Function::New(env, Noop, "noop"));
  exports.Set("logitsStats", Napi::Function::New(env, ARPO_SYNC("logitsStats", ParseLogitsStats), "logitsStats"));
  exports.Set("logitsStatsAsync", Napi::Function::New(env, ARPO_ASYNC("logitsStats", ParseLogitsStats), "logitsStatsAsync"));
  exports.Set("sampleTokens", Napi::Function::New(env, ARPO_SYNC("sampleTokens", ParseSampleTokens), "sampleTokens"));
  exports.Set("sampleTokensAsync", Napi::Function::New(env, ARPO_ASYNC("sampleTokens", ParseSampleTokens), "sampleTokensAsync"));
  exports.Set("entropyDelta", Napi::Function::New(env, ARPO_SYNC("entropyDelta", ParseEntropyDelta), "entropyDelta"));
  exports.Set("policyLoss", Napi::Function::New(env, ARPO_SYNC("policyLoss", ParsePolicyLoss), "policyLoss"));
  exports.Set("policyLossAsync", Napi::Function::New(env, ARPO_ASYNC("policyLoss", ParsePolicyLoss), "policyLossAsync"));
  exports.Set("treeReduce", Napi::Function::New(env, ARPO_SYNC("treeReduce", ParseTreeReduce), "treeReduce"));
  exports.Set("treeReduceSigned", Napi::Function::New(env, ARPO_SYNC("treeReduceSigned", ParseTreeReduceSigned), "treeReduceSigned"));
  exports.Set("treeExpand", Napi::Function::New(env, ARPO_SYNC("treeExpand", ParseTreeExpand), "treeExpand"));
  exports.Set("benchSum", Napi::Function::New(env, ARPO_SYNC("benchSum", ParseBenchSum), "benchSum"));
}

}  // namespace napi
}  // namespace arpo
