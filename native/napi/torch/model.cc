// N-API binding of the policy model: the NativeModel class (model + KV-cache
// engine + optimiser + frozen reference). Heavy calls run in AsyncWorkers and
// return Promises; one mutex per model serialises them (the TS wrapper also
// queues them). Errors reject / throw with the C++ message; TS prefixes it.
#include <napi.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "napi/torch/group.h"
#include "torch/compat.h"
#include "torch/device.h"
#include "torch/engine.h"
#include "torch/fork_guard.h"
#include "torch/model.h"
#include "torch/safetensors.h"
#include "torch/trainer.h"
#include "torch/tree.h"

namespace arpo {
namespace napi {

namespace {

using model::Engine;
using model::KVCache;
using model::Model;

struct ModelState {
  std::mutex mu;
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<model::AdamW> optimizer;  // created by the first trainStep or loadOptimizer
  std::unique_ptr<Model> reference;         // frozen copy for the KL term
  std::shared_ptr<dist::Group> group;       // data parallel: train steps sum over its ranks (null: one process)
  int32_t threads = 0;
};

// c10::Error carries a C++ backtrace in what(); keep the message only.
std::string message_of(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

// A task's work under the compute lock (no fork() while BLAS runs:
// torch/fork_guard.h) and the model's mutex, on whichever thread runs it.
void run_task(ModelState& s, const std::function<void(ModelState&)>& work) {
  model::ComputeLock compute;
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.model) throw std::runtime_error("the model was disposed");
  if (std::getenv("ARPO_FTZ")) at::globalContext().setFlushDenormal(true);
  work(s);
}

// Runs `work` on the libuv pool under the model's mutex; resolves with `done`.
class ModelTask : public Napi::AsyncWorker {
 public:
  ModelTask(Napi::Env env, std::shared_ptr<ModelState> state, std::function<void(ModelState&)> work,
            std::function<Napi::Value(Napi::Env)> done)
      : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)), state_(std::move(state)),
        work_(std::move(work)), done_(std::move(done)) {}
  Napi::Promise Promise() { return deferred_.Promise(); }

 protected:
  void Execute() override {
    try {
      run_task(*state_, work_);
    } catch (const std::exception& e) {
      SetError(message_of(e));
    } catch (...) {
      SetError("unknown native error");
    }
  }
  void OnOK() override {
    try {
      deferred_.Resolve(done_ ? done_(Env()) : Env().Undefined());
    } catch (const Napi::Error& e) {
      deferred_.Reject(e.Value());
    }
  }
  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  Napi::Promise::Deferred deferred_;
  std::shared_ptr<ModelState> state_;
  std::function<void(ModelState&)> work_;
  std::function<Napi::Value(Napi::Env)> done_;
};

// ---- argument readers (TS validated already; these guard the C++ side)

[[noreturn]] void type_error(Napi::Env env, const std::string& what) { throw Napi::TypeError::New(env, what); }

double num(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  if (!v.IsNumber()) type_error(o.Env(), std::string("expected a number for ") + key);
  return v.As<Napi::Number>().DoubleValue();
}
double num_or(const Napi::Object& o, const char* key, double fallback) {
  Napi::Value v = o.Get(key);
  return v.IsUndefined() ? fallback : num(o, key);
}
bool flag(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  if (!v.IsBoolean()) type_error(o.Env(), std::string("expected a boolean for ") + key);
  return v.As<Napi::Boolean>().Value();
}
std::string str(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  if (!v.IsString()) type_error(o.Env(), std::string("expected a string for ") + key);
  return v.As<Napi::String>().Utf8Value();
}
uint64_t u64(const Napi::Value& v, const char* name) {
  if (v.IsBigInt()) {
    bool lossless = true;
    return v.As<Napi::BigInt>().Uint64Value(&lossless);
  }
  if (v.IsNumber()) return static_cast<uint64_t>(v.As<Napi::Number>().Int64Value());
  type_error(v.Env(), std::string("expected a bigint or number for ") + name);
}
template <typename T, napi_typedarray_type kind>
std::vector<T> typed(const Napi::Value& v, const char* name) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != kind)
    type_error(v.Env(), std::string("expected a typed array of the right kind for ") + name);
  auto a = v.As<Napi::TypedArrayOf<T>>();
  return std::vector<T>(a.Data(), a.Data() + a.ElementLength());
}
std::vector<int32_t> i32s(const Napi::Value& v, const char* name) { return typed<int32_t, napi_int32_array>(v, name); }
std::vector<float> f32s(const Napi::Value& v, const char* name) {
  if (v.IsUndefined() || v.IsNull()) return {};
  return typed<float, napi_float32_array>(v, name);
}
std::vector<double> f64s(const Napi::Value& v, const char* name) { return typed<double, napi_float64_array>(v, name); }
std::vector<uint8_t> u8s(const Napi::Value& v, const char* name) {
  if (v.IsUndefined() || v.IsNull()) return {};
  return typed<uint8_t, napi_uint8_array>(v, name);
}
std::vector<int64_t> lengths_of(const Napi::Value& v, const char* name) {
  std::vector<int32_t> l = i32s(v, name);
  return std::vector<int64_t>(l.begin(), l.end());
}

Napi::Float32Array float_array(Napi::Env env, const float* data, size_t n) {
  auto a = Napi::Float32Array::New(env, n);
  std::copy(data, data + n, a.Data());
  return a;
}
Napi::Int32Array int_array(Napi::Env env, const int32_t* data, size_t n) {
  auto a = Napi::Int32Array::New(env, n);
  std::copy(data, data + n, a.Data());
  return a;
}

model::ModelConfig read_config(const Napi::Object& o) {
  model::ModelConfig c;
  c.model_type = str(o, "modelType");
  c.vocab_size = static_cast<int64_t>(num(o, "vocabSize"));
  c.hidden_size = static_cast<int64_t>(num(o, "hiddenSize"));
  c.intermediate_size = static_cast<int64_t>(num(o, "intermediateSize"));
  c.num_hidden_layers = static_cast<int64_t>(num(o, "numHiddenLayers"));
  c.num_attention_heads = static_cast<int64_t>(num(o, "numAttentionHeads"));
  c.num_key_value_heads = static_cast<int64_t>(num(o, "numKeyValueHeads"));
  c.head_dim = static_cast<int64_t>(num_or(o, "headDim", 0));
  c.max_position_embeddings = static_cast<int64_t>(num(o, "maxPositionEmbeddings"));
  c.rope_theta = num(o, "ropeTheta");
  c.rms_norm_eps = num(o, "rmsNormEps");
  c.qkv_bias = flag(o, "qkvBias");
  c.output_bias = flag(o, "outputBias");
  c.mlp_bias = flag(o, "mlpBias");
  c.tie_word_embeddings = flag(o, "tieWordEmbeddings");
  c.initializer_range = num_or(o, "initializerRange", 0.02);
  Napi::Value rs = o.Get("ropeScaling");
  if (rs.IsObject()) {
    Napi::Object r = rs.As<Napi::Object>();
    c.rope_scaling.type = str(r, "type");
    c.rope_scaling.factor = num_or(r, "factor", 1.0);
    c.rope_scaling.low_freq_factor = num_or(r, "lowFreqFactor", 1.0);
    c.rope_scaling.high_freq_factor = num_or(r, "highFreqFactor", 4.0);
    c.rope_scaling.original_max_position_embeddings =
        static_cast<int64_t>(num_or(r, "originalMaxPositionEmbeddings", 8192));
  }
  c.validate();
  return c;
}

kernels::PolicyLossConfig read_loss(const Napi::Object& o) {
  kernels::PolicyLossConfig c;
  c.clip_low = static_cast<float>(num_or(o, "clipLow", c.clip_low));
  c.clip_high = static_cast<float>(num_or(o, "clipHigh", c.clip_high));
  c.dual_clip_c = static_cast<float>(num_or(o, "dualClipC", c.dual_clip_c));
  c.kl_type = static_cast<kernels::KLType>(static_cast<int32_t>(num_or(o, "klType", 2)));
  c.kl_coef = static_cast<float>(num_or(o, "klCoef", 0));
  c.entropy_coef = static_cast<float>(num_or(o, "entropyCoef", 0));
  c.aggregation = static_cast<kernels::Aggregation>(static_cast<int32_t>(num_or(o, "aggregation", 0)));
  c.temperature = static_cast<float>(num_or(o, "temperature", 1));
  c.denominator = num_or(o, "denominator", 0);
  c.norm_constant = num_or(o, "normConstant", 0);
  c.grad_scale = static_cast<float>(num_or(o, "gradScale", 1));
  return c;
}

model::OptimConfig read_optim(const Napi::Object& o) {
  model::OptimConfig c;
  c.lr = num_or(o, "lr", c.lr);
  c.beta1 = num_or(o, "beta1", c.beta1);
  c.beta2 = num_or(o, "beta2", c.beta2);
  c.eps = num_or(o, "eps", c.eps);
  c.weight_decay = num_or(o, "weightDecay", c.weight_decay);
  c.max_grad_norm = num_or(o, "maxGradNorm", c.max_grad_norm);
  c.warmup_steps = static_cast<int64_t>(num_or(o, "warmupSteps", 0));
  c.total_steps = static_cast<int64_t>(num_or(o, "totalSteps", 0));
  c.schedule = static_cast<model::Schedule>(static_cast<int32_t>(num_or(o, "schedule", 0)));
  c.min_lr_ratio = num_or(o, "minLrRatio", 0);
  return c;
}

// Before a training step: the optimiser (first step), and the frozen KL
// reference as a copy of the current weights when the loss needs one.
void prepare_step(ModelState& s, bool needs_reference) {
  if (!s.optimizer) s.optimizer = std::make_unique<model::AdamW>(s.model->named_tensors());
  if (needs_reference && !s.reference) s.reference = std::make_unique<Model>(s.model->clone(s.model->dtype()));
}

Napi::Object metrics_object(Napi::Env e, const model::TrainMetrics& m) {
  Napi::Object o = Napi::Object::New(e);
  o.Set("loss", m.loss);
  o.Set("pgLoss", m.pg_loss);
  o.Set("pgClipfrac", m.pg_clipfrac);
  o.Set("pgClipfracLower", m.pg_clipfrac_lower);
  o.Set("ppoKl", m.ppo_kl);
  o.Set("entropy", m.entropy);
  o.Set("kl", m.kl);
  o.Set("gradNorm", m.grad_norm);
  o.Set("lr", m.lr);
  o.Set("tokens", m.tokens);
  o.Set("step", static_cast<double>(m.step));
  o.Set("skipped", m.skipped);
  o.Set("commSeconds", m.comm_seconds);
  return o;
}

// ---- the class

class NativeModel : public Napi::ObjectWrap<NativeModel> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "NativeModel",
                       {
                           InstanceMethod("initWeights", &NativeModel::InitWeights),
                           InstanceMethod("loadCheckpoint", &NativeModel::LoadCheckpoint),
                           InstanceMethod("saveWeights", &NativeModel::SaveWeights),
                           InstanceMethod("saveOptimizer", &NativeModel::SaveOptimizer),
                           InstanceMethod("loadOptimizer", &NativeModel::LoadOptimizer),
                           InstanceMethod("newPath", &NativeModel::NewPath),
                           InstanceMethod("fork", &NativeModel::Fork),
                           InstanceMethod("freePath", &NativeModel::FreePath),
                           InstanceMethod("pathLength", &NativeModel::PathLength),
                           InstanceMethod("extend", &NativeModel::Extend),
                           InstanceMethod("extendLogits", &NativeModel::ExtendLogits),
                           InstanceMethod("logprobs", &NativeModel::Logprobs),
                           InstanceMethod("forwardLogits", &NativeModel::ForwardLogits),
                           InstanceMethod("trainStep", &NativeModel::TrainStep),
                           InstanceMethod("treeLogprobs", &NativeModel::TreeLogprobs),
                           InstanceMethod("forwardTreeLogits", &NativeModel::ForwardTreeLogits),
                           InstanceMethod("trainTreeStep", &NativeModel::TrainTreeStep),
                           InstanceMethod("snapshotReference", &NativeModel::SnapshotReference),
                           InstanceMethod("loadReference", &NativeModel::LoadReference),
                           InstanceMethod("setGroup", &NativeModel::SetGroup),
                           InstanceMethod("broadcastParameters", &NativeModel::BroadcastParameters),
                           InstanceMethod("cacheStats", &NativeModel::CacheStats),
                           InstanceMethod("setThreads", &NativeModel::SetThreads),
                           InstanceMethod("setBatchInvariant", &NativeModel::SetBatchInvariant),
                           InstanceMethod("setFusedDecode", &NativeModel::SetFusedDecode),
                           InstanceMethod("info", &NativeModel::Info),
                           InstanceMethod("dispose", &NativeModel::Dispose),
                       });
  }

  // new NativeModel(config, { dtype, device?, threads, blockSize, initialBlocks, maxBlocks })
  explicit NativeModel(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NativeModel>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 2 || !info[0].IsObject() || !info[1].IsObject())
      type_error(env, "NativeModel(config, options) expects two objects");
    try {
      model::ModelConfig config = read_config(info[0].As<Napi::Object>());
      Napi::Object opts = info[1].As<Napi::Object>();
      const at::ScalarType dtype = model::parse_dtype(str(opts, "dtype"));
      const at::Device device = opts.Get("device").IsUndefined() ? at::Device(at::kCPU)
                                                                 : model::parse_device(str(opts, "device"), "options.device");
      state_ = std::make_shared<ModelState>();
      state_->threads = static_cast<int32_t>(num_or(opts, "threads", 0));
      compat::set_compute_threads(state_->threads);
      KVCache::Options kv;
      kv.block_size = static_cast<int64_t>(num_or(opts, "blockSize", 16));
      kv.initial_blocks = static_cast<int64_t>(num_or(opts, "initialBlocks", 64));
      kv.max_blocks = static_cast<int64_t>(num_or(opts, "maxBlocks", 0));
      state_->model = std::make_unique<Model>(config, dtype, device);
      state_->engine = std::make_unique<Engine>(*state_->model, kv, state_->threads);
    } catch (const Napi::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Napi::Error::New(env, message_of(e));
    }
  }

 private:
  std::shared_ptr<ModelState> state_;

  ModelState& live(Napi::Env env) {
    if (!state_ || !state_->model) throw Napi::Error::New(env, "the model was disposed");
    return *state_;
  }
  Napi::Value queue(Napi::Env env, std::function<void(ModelState&)> work,
                    std::function<Napi::Value(Napi::Env)> done = nullptr) {
    live(env);
    auto* task = new ModelTask(env, state_, std::move(work), std::move(done));
    Napi::Promise p = task->Promise();
    task->Queue();
    return p;
  }
  // queue(), except that a call the engine rates small (model::runs_inline)
  // runs here on the JavaScript thread; its promise is settled before this
  // returns, with the same value or error the pool would have given. It
  // takes the same locks as a pooled task: while another model's task holds
  // the compute lock (fork_guard.h), the JavaScript thread waits for it.
  Napi::Value queue_or_inline(Napi::Env env, bool small, std::function<void(ModelState&)> work,
                              std::function<Napi::Value(Napi::Env)> done) {
    if (!small) return queue(env, std::move(work), std::move(done));
    ModelState& s = live(env);
    Napi::Promise::Deferred deferred = Napi::Promise::Deferred::New(env);
    try {
      run_task(s, work);
      deferred.Resolve(done(env));
    } catch (const Napi::Error& e) {
      deferred.Reject(e.Value());
    } catch (const std::exception& e) {
      deferred.Reject(Napi::Error::New(env, message_of(e)).Value());
    } catch (...) {
      deferred.Reject(Napi::Error::New(env, "unknown native error").Value());
    }
    return deferred.Promise();
  }
  // Runs a quick call synchronously under the mutex, mapping C++ errors.
  template <typename F>
  auto sync(Napi::Env env, F&& f) -> decltype(f(std::declval<ModelState&>())) {
    ModelState& s = live(env);
    try {
      model::ComputeLock compute;
      std::lock_guard<std::mutex> lock(s.mu);
      if (!s.model) throw std::runtime_error("the model was disposed");
      return f(s);
    } catch (const std::exception& e) {
      throw Napi::Error::New(env, message_of(e));
    }
  }

  Napi::Value InitWeights(const Napi::CallbackInfo& info) {
    const uint64_t seed = u64(info[0], "seed");
    return queue(info.Env(), [seed](ModelState& s) { s.model->init_weights(seed); });
  }

  // loadCheckpoint(dir): every tensor of an HF directory (single file or shards).
  Napi::Value LoadCheckpoint(const Napi::CallbackInfo& info) {
    if (!info[0].IsString()) type_error(info.Env(), "expected a directory path");
    const std::string dir = info[0].As<Napi::String>().Utf8Value();
    return queue(info.Env(), [dir](ModelState& s) {
      model::NamedTensors tensors = st::load_checkpoint(dir, s.model->dtype());
      s.model->load_tensors(tensors);
    });
  }

  // saveWeights(file, dtype?): one safetensors file of the HF-named parameters.
  Napi::Value SaveWeights(const Napi::CallbackInfo& info) {
    if (!info[0].IsString()) type_error(info.Env(), "expected a file path");
    const std::string file = info[0].As<Napi::String>().Utf8Value();
    const std::string dtype = info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : "";
    return queue(info.Env(), [file, dtype](ModelState& s) {
      const at::ScalarType out = dtype.empty() ? s.model->dtype() : model::parse_dtype(dtype);
      model::NamedTensors tensors;
      for (const auto& [name, t] : s.model->named_tensors()) tensors.emplace_back(name, t.detach().to(out));
      st::save_safetensors(file, tensors, {{"format", "pt"}});
    });
  }

  Napi::Value SaveOptimizer(const Napi::CallbackInfo& info) {
    if (!info[0].IsString()) type_error(info.Env(), "expected a file path");
    const std::string file = info[0].As<Napi::String>().Utf8Value();
    return queue(info.Env(), [file](ModelState& s) {
      if (!s.optimizer) s.optimizer = std::make_unique<model::AdamW>(s.model->named_tensors());
      st::save_safetensors(file, s.optimizer->state(), {{"format", "arpo-adamw"}});
    });
  }

  Napi::Value LoadOptimizer(const Napi::CallbackInfo& info) {
    if (!info[0].IsString()) type_error(info.Env(), "expected a file path");
    const std::string file = info[0].As<Napi::String>().Utf8Value();
    return queue(info.Env(), [file](ModelState& s) {
      auto f = st::SafetensorsFile::open(file);
      model::NamedTensors state;
      for (const auto& [name, ti] : f->tensors()) state.emplace_back(name, f->load(name));
      auto opt = std::make_unique<model::AdamW>(s.model->named_tensors());
      opt->load_state(state);
      s.optimizer = std::move(opt);
    });
  }

  Napi::Value NewPath(const Napi::CallbackInfo& info) {
    const uint64_t stream = u64(info[0], "stream");
    return Napi::Number::New(info.Env(), sync(info.Env(), [&](ModelState& s) { return s.engine->cache().new_path(stream); }));
  }
  Napi::Value Fork(const Napi::CallbackInfo& info) {
    const int32_t path = info[0].As<Napi::Number>().Int32Value();
    const int64_t prefix = info[1].As<Napi::Number>().Int64Value();
    const uint64_t stream = u64(info[2], "stream");
    return Napi::Number::New(info.Env(),
                             sync(info.Env(), [&](ModelState& s) { return s.engine->cache().fork(path, prefix, stream); }));
  }
  Napi::Value FreePath(const Napi::CallbackInfo& info) {
    const int32_t path = info[0].As<Napi::Number>().Int32Value();
    sync(info.Env(), [&](ModelState& s) {
      s.engine->cache().free_path(path);
      return 0;
    });
    return info.Env().Undefined();
  }
  Napi::Value PathLength(const Napi::CallbackInfo& info) {
    const int32_t path = info[0].As<Napi::Number>().Int32Value();
    return Napi::Number::New(info.Env(),
                             static_cast<double>(sync(info.Env(), [&](ModelState& s) { return s.engine->cache().length(path); })));
  }

  // Splits flat tokens by lengths into per-path inputs.
  static std::vector<std::vector<int32_t>> split(Napi::Env env, const std::vector<int32_t>& tokens,
                                                 const std::vector<int64_t>& lengths) {
    std::vector<std::vector<int32_t>> out;
    size_t at = 0;
    for (int64_t n : lengths) {
      if (n < 0 || at + static_cast<size_t>(n) > tokens.size()) throw Napi::RangeError::New(env, "input lengths exceed the tokens given");
      out.emplace_back(tokens.begin() + at, tokens.begin() + at + n);
      at += n;
    }
    if (at != tokens.size()) throw Napi::RangeError::New(env, "input lengths do not cover the tokens given");
    return out;
  }

  // extend(paths, tokens, lengths, {temperature, topK, topP, seed})
  Napi::Value Extend(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    auto paths = i32s(info[0], "paths");
    auto inputs = split(env, i32s(info[1], "tokens"), lengths_of(info[2], "lengths"));
    if (!info[3].IsObject()) type_error(env, "expected sampling options");
    Napi::Object so = info[3].As<Napi::Object>();
    kernels::SamplingParams sp;
    sp.temperature = static_cast<float>(num(so, "temperature"));
    sp.top_k = static_cast<int32_t>(num_or(so, "topK", 0));
    sp.top_p = static_cast<float>(num_or(so, "topP", 1));
    sp.seed = u64(so.Get("seed"), "seed");
    auto result = std::make_shared<model::DecodeResult>();
    const ModelState& st = live(env);
    int64_t tokens = 0;
    for (const auto& in : inputs) tokens += static_cast<int64_t>(in.size());
    const bool small = st.model->device().is_cpu() && model::runs_inline(st.model->config(), tokens, static_cast<int64_t>(paths.size()));
    return queue_or_inline(
        env, small, [paths, inputs, sp, result](ModelState& s) { *result = s.engine->extend(paths, inputs, sp); },
        [result](Napi::Env e) {
          Napi::Object o = Napi::Object::New(e);
          const size_t n = result->tokens.size();
          o.Set("tokens", int_array(e, result->tokens.data(), n));
          o.Set("logprobs", float_array(e, result->logprobs.data(), n));
          o.Set("entropies", float_array(e, result->entropies.data(), n));
          o.Set("normEntropies", float_array(e, result->norm_entropies.data(), n));
          return o;
        });
  }

  // extendLogits(paths, tokens, lengths) -> Float32Array (P * V): extend without sampling.
  Napi::Value ExtendLogits(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    auto paths = i32s(info[0], "paths");
    auto inputs = split(env, i32s(info[1], "tokens"), lengths_of(info[2], "lengths"));
    auto out = std::make_shared<at::Tensor>();
    return queue(
        env, [paths, inputs, out](ModelState& s) { *out = s.engine->extend_logits(paths, inputs); },
        [out](Napi::Env e) { return float_array(e, out->data_ptr<float>(), out->numel()); });
  }

  // logprobs(tokens, lengths, temperature) -> {logprobs, entropies} aligned to tokens.
  Napi::Value Logprobs(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    auto tokens = i32s(info[0], "tokens");
    auto lengths = lengths_of(info[1], "lengths");
    const float temperature = static_cast<float>(info[2].As<Napi::Number>().DoubleValue());
    auto out = std::make_shared<model::TokenStats>();
    return queue(
        env,
        [tokens, lengths, temperature, out](ModelState& s) {
          const auto& c = s.model->config();
          auto packed = model::pack_sequences(tokens, lengths, c.vocab_size, c.max_position_embeddings, "logprobs");
          *out = model::score_sequences(*s.model, packed, temperature, s.threads);
        },
        [out](Napi::Env e) {
          Napi::Object o = Napi::Object::New(e);
          o.Set("logprobs", float_array(e, out->logprobs.data(), out->logprobs.size()));
          o.Set("entropies", float_array(e, out->entropies.data(), out->entropies.size()));
          return o;
        });
  }

  // forwardLogits(tokens, lengths) -> Float32Array (N * V): every position's logits (tests, small inputs).
  Napi::Value ForwardLogits(const Napi::CallbackInfo& info) {
    auto tokens = i32s(info[0], "tokens");
    auto lengths = lengths_of(info[1], "lengths");
    auto out = std::make_shared<at::Tensor>();
    return queue(
        info.Env(),
        [tokens, lengths, out](ModelState& s) {
          at::NoGradGuard g;
          const auto& c = s.model->config();
          auto p = model::pack_sequences(tokens, lengths, c.vocab_size, c.max_position_embeddings, "forwardLogits");
          at::Tensor h = s.model->forward_hidden(p.ids, p.positions, model::packed_causal_attention(p.offsets));
          *out = s.model->logits(h).to(at::kFloat).contiguous();
        },
        [out](Napi::Env e) { return float_array(e, out->data_ptr<float>(), out->numel()); });
  }

  // treeLogprobs(tokens, parent, nodeTokens, temperature, wanted?, reference?) ->
  // {logprobs, entropies} aligned to the packed tokens (0 where a token is no
  // target or not wanted): the policy's, or the frozen reference's.
  Napi::Value TreeLogprobs(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    auto tokens = i32s(info[0], "tokens");
    auto parent = i32s(info[1], "parent");
    auto node_tokens = lengths_of(info[2], "nodeTokens");
    if (!info[3].IsNumber()) type_error(env, "expected a number for temperature");
    const float temperature = static_cast<float>(info[3].As<Napi::Number>().DoubleValue());
    auto wanted = u8s(info[4], "wanted");
    const bool use_reference = info[5].IsBoolean() && info[5].As<Napi::Boolean>().Value();
    auto out = std::make_shared<model::TokenStats>();
    return queue(
        env,
        [tokens, parent, node_tokens, temperature, wanted, use_reference, out](ModelState& s) {
          if (use_reference && !s.reference) s.reference = std::make_unique<Model>(s.model->clone(s.model->dtype()));
          const Model& m = use_reference ? *s.reference : *s.model;
          const auto& c = m.config();
          auto tree = model::pack_tree(tokens, parent, node_tokens, c.vocab_size, c.max_position_embeddings, "treeLogprobs");
          *out = model::score_tree(m, tree, temperature, s.threads, wanted);
        },
        [out](Napi::Env e) {
          Napi::Object o = Napi::Object::New(e);
          o.Set("logprobs", float_array(e, out->logprobs.data(), out->logprobs.size()));
          o.Set("entropies", float_array(e, out->entropies.data(), out->entropies.size()));
          return o;
        });
  }

  // forwardTreeLogits(tokens, parent, nodeTokens) -> Float32Array (N * V): every packed token's logits (tests).
  Napi::Value ForwardTreeLogits(const Napi::CallbackInfo& info) {
    auto tokens = i32s(info[0], "tokens");
    auto parent = i32s(info[1], "parent");
    auto node_tokens = lengths_of(info[2], "nodeTokens");
    auto out = std::make_shared<at::Tensor>();
    return queue(
        info.Env(),
        [tokens, parent, node_tokens, out](ModelState& s) {
          at::NoGradGuard g;
          const auto& c = s.model->config();
          auto t = model::pack_tree(tokens, parent, node_tokens, c.vocab_size, c.max_position_embeddings, "forwardTreeLogits");
          at::Tensor h = s.model->forward_hidden(t.ids, t.positions, model::tree_attention(t));
          *out = s.model->logits(h).to(at::kFloat).contiguous();
        },
        [out](Napi::Env e) { return float_array(e, out->data_ptr<float>(), out->numel()); });
  }

  // trainStep(batches, lossConfig, optimConfig, mode) -> metrics
  Napi::Value TrainStep(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!info[0].IsArray() || !info[1].IsObject() || !info[2].IsObject() || !info[3].IsString())
      type_error(env, "trainStep(batches, lossConfig, optimConfig, mode)");
    Napi::Array arr = info[0].As<Napi::Array>();
    std::vector<model::MicroBatch> batches;
    for (uint32_t i = 0; i < arr.Length(); ++i) {
      Napi::Object b = arr.Get(i).As<Napi::Object>();
      model::MicroBatch mb;
      mb.tokens = i32s(b.Get("tokens"), "tokens");
      mb.lengths = lengths_of(b.Get("lengths"), "lengths");
      mb.mask = f32s(b.Get("mask"), "mask");
      mb.old_logprobs = f32s(b.Get("oldLogprobs"), "oldLogprobs");
      mb.advantages = f32s(b.Get("advantages"), "advantages");
      mb.ref_logprobs = f32s(b.Get("refLogprobs"), "refLogprobs");
      batches.push_back(std::move(mb));
    }
    const kernels::PolicyLossConfig loss = read_loss(info[1].As<Napi::Object>());
    const model::OptimConfig optim = read_optim(info[2].As<Napi::Object>());
    const model::LossMode mode = info[3].As<Napi::String>().Utf8Value() == "sft" ? model::LossMode::SFT : model::LossMode::Policy;
    auto m = std::make_shared<model::TrainMetrics>();
    return queue(
        env,
        [batches = std::move(batches), loss, optim, mode, m](ModelState& s) {
          prepare_step(s, mode == model::LossMode::Policy && loss.kl_coef != 0);
          *m = model::train_step(*s.model, *s.optimizer, batches, loss, mode, optim, s.reference.get(), s.threads, s.group.get());
        },
        [m](Napi::Env e) { return metrics_object(e, *m); });
  }

  // trainTreeStep(batches, lossConfig, optimConfig) -> metrics: batches of
  // packed trees {tokens, parent, nodeTokens, oldLogprobs, refLogprobs?,
  // advPos, advNeg, weight, countPos, countNeg, count (Float64Array), sequences}.
  Napi::Value TrainTreeStep(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!info[0].IsArray() || !info[1].IsObject() || !info[2].IsObject())
      type_error(env, "trainTreeStep(batches, lossConfig, optimConfig)");
    Napi::Array arr = info[0].As<Napi::Array>();
    std::vector<model::TreeMicroBatch> batches;
    for (uint32_t i = 0; i < arr.Length(); ++i) {
      Napi::Object b = arr.Get(i).As<Napi::Object>();
      model::TreeMicroBatch mb;
      mb.tokens = i32s(b.Get("tokens"), "tokens");
      mb.parent = i32s(b.Get("parent"), "parent");
      mb.node_tokens = lengths_of(b.Get("nodeTokens"), "nodeTokens");
      mb.old_logprobs = f32s(b.Get("oldLogprobs"), "oldLogprobs");
      mb.ref_logprobs = f32s(b.Get("refLogprobs"), "refLogprobs");
      mb.adv_pos = f64s(b.Get("advPos"), "advPos");
      mb.adv_neg = f64s(b.Get("advNeg"), "advNeg");
      mb.weight = f64s(b.Get("weight"), "weight");
      mb.count_pos = f64s(b.Get("countPos"), "countPos");
      mb.count_neg = f64s(b.Get("countNeg"), "countNeg");
      mb.count = f64s(b.Get("count"), "count");
      mb.sequences = static_cast<int64_t>(num(b, "sequences"));
      batches.push_back(std::move(mb));
    }
    const kernels::PolicyLossConfig loss = read_loss(info[1].As<Napi::Object>());
    const model::OptimConfig optim = read_optim(info[2].As<Napi::Object>());
    const int64_t chunk_rows = info[3].IsNumber() ? info[3].As<Napi::Number>().Int64Value() : 0;
    auto m = std::make_shared<model::TrainMetrics>();
    return queue(
        env,
        [batches = std::move(batches), loss, optim, chunk_rows, m](ModelState& s) {
          prepare_step(s, loss.kl_coef != 0);
          *m = model::train_tree_step(*s.model, *s.optimizer, batches, loss, optim, s.reference.get(), s.threads, chunk_rows,
                                      s.group.get());
        },
        [m](Napi::Env e) { return metrics_object(e, *m); });
  }

  // snapshotReference(): the frozen KL reference becomes a copy of the current weights.
  Napi::Value SnapshotReference(const Napi::CallbackInfo& info) {
    return queue(info.Env(), [](ModelState& s) {
      s.reference = std::make_unique<Model>(s.model->clone(s.model->dtype()));
    });
  }

  // loadReference(dir): the frozen KL reference holds an HF checkpoint's weights (a resumed run's initial policy).
  Napi::Value LoadReference(const Napi::CallbackInfo& info) {
    if (!info[0].IsString()) type_error(info.Env(), "expected a directory path");
    const std::string dir = info[0].As<Napi::String>().Utf8Value();
    return queue(info.Env(), [dir](ModelState& s) {
      auto ref = std::make_unique<Model>(s.model->clone(s.model->dtype()));
      ref->load_tensors(st::load_checkpoint(dir, s.model->dtype()));
      s.reference = std::move(ref);
    });
  }

  // setGroup(group | null): train steps become data-parallel over the group's ranks (or one process again).
  Napi::Value SetGroup(const Napi::CallbackInfo& info) {
    std::shared_ptr<dist::Group> g = info[0].IsNull() || info[0].IsUndefined() ? nullptr : unwrap_group(info[0]);
    if (info[0].IsObject() && !g) type_error(info.Env(), "setGroup: the process group is not initialised (or was closed)");
    sync(info.Env(), [g](ModelState& s) {
      s.group = g;
      return 0;
    });
    return info.Env().Undefined();
  }

  // broadcastParameters(root): every rank's weights (and frozen reference, if made) become rank root's.
  Napi::Value BroadcastParameters(const Napi::CallbackInfo& info) {
    if (!info[0].IsNumber()) type_error(info.Env(), "broadcastParameters(root) expects a rank");
    const int root = info[0].As<Napi::Number>().Int32Value();
    return queue(info.Env(), [root](ModelState& s) {
      if (!s.group) throw std::runtime_error("broadcastParameters: no process group (setGroup first)");
      model::broadcast_parameters(*s.model, *s.group, root);
      if (s.reference) model::broadcast_parameters(*s.reference, *s.group, root);
    });
  }

  Napi::Value CacheStats(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    KVCache::Stats st = sync(env, [](ModelState& s) { return s.engine->cache().stats(); });
    Napi::Object o = Napi::Object::New(env);
    o.Set("blockSize", static_cast<double>(st.block_size));
    o.Set("blocksTotal", static_cast<double>(st.blocks_total));
    o.Set("blocksUsed", static_cast<double>(st.blocks_used));
    o.Set("bytesPerBlock", static_cast<double>(st.bytes_per_block));
    o.Set("bytesUsed", static_cast<double>(st.bytes_used));
    o.Set("bytesUnshared", static_cast<double>(st.bytes_unshared));
    o.Set("paths", static_cast<double>(st.paths));
    o.Set("tokens", static_cast<double>(st.tokens));
    return o;
  }

  Napi::Value SetThreads(const Napi::CallbackInfo& info) {
    const int32_t n = info[0].As<Napi::Number>().Int32Value();
    sync(info.Env(), [n](ModelState& s) {
      s.threads = n;
      s.engine->set_threads(n);
      compat::set_compute_threads(n);
      return 0;
    });
    return info.Env().Undefined();
  }

  // setBatchInvariant(on): decoding whose numbers do not depend on which paths share a call.
  Napi::Value SetBatchInvariant(const Napi::CallbackInfo& info) {
    if (!info[0].IsBoolean()) type_error(info.Env(), "expected a boolean for batchInvariant");
    const bool on = info[0].As<Napi::Boolean>().Value();
    sync(info.Env(), [on](ModelState& s) {
      s.engine->set_batch_invariant(on);
      return 0;
    });
    return info.Env().Undefined();
  }

  // setFusedDecode(on): the engine's decode-time CPU kernels (RMSNorm, RoPE,
  // paged attention) instead of torch op compositions; on by default.
  Napi::Value SetFusedDecode(const Napi::CallbackInfo& info) {
    if (!info[0].IsBoolean()) type_error(info.Env(), "expected a boolean for fusedDecode");
    const bool on = info[0].As<Napi::Boolean>().Value();
    sync(info.Env(), [on](ModelState& s) {
      s.model->set_fused_inference(on);
      return 0;
    });
    return info.Env().Undefined();
  }

  Napi::Value Info(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Napi::Object o = Napi::Object::New(env);
    sync(env, [&](ModelState& s) {
      o.Set("dtype", model::dtype_name(s.model->dtype()));
      o.Set("device", model::device_name(s.model->device()));
      o.Set("numParameters", static_cast<double>(s.model->num_parameters()));
      o.Set("optimizerSteps", static_cast<double>(s.optimizer ? s.optimizer->steps() : 0));
      o.Set("hasReference", s.reference != nullptr);
      o.Set("threads", at::get_num_threads());
      o.Set("batchInvariant", s.engine->batch_invariant());
      o.Set("fusedDecode", s.model->fused_inference_enabled());
      return 0;
    });
    return o;
  }

  // dispose(): waits for a running call, then frees everything.
  Napi::Value Dispose(const Napi::CallbackInfo& info) {
    if (state_) {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->engine.reset();
      state_->optimizer.reset();
      state_->reference.reset();
      state_->group.reset();
      state_->model.reset();
    }
    return info.Env().Undefined();
  }
};

}  // namespace

void InitTorch(Napi::Env env, Napi::Object exports) {
  model::install_fork_guard();
  exports.Set("NativeModel", NativeModel::Define(env));
  exports.Set("cudaBuild", Napi::Boolean::New(env, model::cuda_build()));
  exports.Set("torchVersion", Napi::String::New(env, compat::torch_version()));
  InitDist(env, exports);
}

}  // namespace napi
}  // namespace arpo
