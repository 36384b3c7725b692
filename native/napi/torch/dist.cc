// NativeGroup: a c10d process group from JS (see group.h). Every call that
// talks to other ranks runs in an AsyncWorker and returns a Promise; the TS
// wrapper (lib/train/dist.ts) issues them one at a time, in the same order on
// every rank.
//   new NativeGroup()
//   init({ rank, world, masterAddr, masterPort, timeoutMs }) -> Promise<void>
//   allreduceSum(Float64Array) -> Promise<Float64Array>   (elementwise sums)
//   broadcast(Float64Array, root) -> Promise<Float64Array>
//   barrier() -> Promise<void>
//   rank(), world(), close()
#include "napi/torch/group.h"

#include <c10/util/Exception.h>

#include <functional>
#include <string>
#include <vector>

namespace arpo {
namespace napi {

namespace {

std::string error_text(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

class GroupTask : public Napi::AsyncWorker {
 public:
  GroupTask(Napi::Env env, std::function<void()> work, std::function<Napi::Value(Napi::Env)> done)
      : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)), work_(std::move(work)), done_(std::move(done)) {}
  Napi::Promise Promise() { return deferred_.Promise(); }

 protected:
  void Execute() override {
    try {
      work_();
    } catch (const std::exception& e) {
      SetError(error_text(e));
    } catch (...) {
      SetError("unknown native error");
    }
  }
  void OnOK() override { deferred_.Resolve(done_ ? done_(Env()) : Env().Undefined()); }
  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  Napi::Promise::Deferred deferred_;
  std::function<void()> work_;
  std::function<Napi::Value(Napi::Env)> done_;
};

Napi::FunctionReference* constructor = nullptr;

class NativeGroup : public Napi::ObjectWrap<NativeGroup> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "NativeGroup",
                       {InstanceMethod("init", &NativeGroup::Init), InstanceMethod("allreduceSum", &NativeGroup::AllreduceSum),
                        InstanceMethod("broadcast", &NativeGroup::Broadcast), InstanceMethod("barrier", &NativeGroup::Barrier),
                        InstanceMethod("rank", &NativeGroup::Rank), InstanceMethod("world", &NativeGroup::World),
                        InstanceMethod("close", &NativeGroup::Close)});
  }
  explicit NativeGroup(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NativeGroup>(info) {}
  std::shared_ptr<dist::Group> group() const { return *holder_; }

 private:
  // The group lives in a holder shared with the workers, so close() during a call cannot free it under them.
  std::shared_ptr<std::shared_ptr<dist::Group>> holder_ = std::make_shared<std::shared_ptr<dist::Group>>();

  std::shared_ptr<dist::Group> live(Napi::Env env) const {
    if (!*holder_) throw Napi::Error::New(env, "the process group is not initialised (or was closed)");
    return *holder_;
  }
  static Napi::Value run(Napi::Env env, std::function<void()> work, std::function<Napi::Value(Napi::Env)> done = nullptr) {
    auto* task = new GroupTask(env, std::move(work), std::move(done));
    Napi::Promise p = task->Promise();
    task->Queue();
    return p;
  }
  static std::vector<double> doubles(const Napi::Value& v) {
    if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_float64_array)
      throw Napi::TypeError::New(v.Env(), "expected a Float64Array");
    auto a = v.As<Napi::Float64Array>();
    return std::vector<double>(a.Data(), a.Data() + a.ElementLength());
  }
  static Napi::Value array_of(Napi::Env env, const std::vector<double>& v) {
    auto a = Napi::Float64Array::New(env, v.size());
    std::copy(v.begin(), v.end(), a.Data());
    return a;
  }

  Napi::Value Init(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (*holder_) throw Napi::Error::New(env, "the process group is already initialised");
    if (!info[0].IsObject()) throw Napi::TypeError::New(env, "init({ rank, world, masterAddr, masterPort, timeoutMs })");
    Napi::Object o = info[0].As<Napi::Object>();
    auto number = [&](const char* key) {
      Napi::Value v = o.Get(key);
      if (!v.IsNumber()) throw Napi::TypeError::New(env, std::string("expected a number for ") + key);
      return v.As<Napi::Number>().Int64Value();
    };
    dist::Config c;
    c.rank = static_cast<int>(number("rank"));
    c.world = static_cast<int>(number("world"));
    c.master_port = static_cast<int>(number("masterPort"));
    c.timeout = std::chrono::milliseconds(number("timeoutMs"));
    Napi::Value addr = o.Get("masterAddr");
    if (!addr.IsString()) throw Napi::TypeError::New(env, "expected a string for masterAddr");
    c.master_addr = addr.As<Napi::String>().Utf8Value();
    auto holder = holder_;
    auto made = std::make_shared<std::unique_ptr<dist::Group>>();
    return run(
        env, [c, made] { *made = dist::Group::create(c); },
        [holder, made](Napi::Env e) {
          *holder = std::shared_ptr<dist::Group>(std::move(*made));
          return e.Undefined();
        });
  }

  Napi::Value AllreduceSum(const Napi::CallbackInfo& info) {
    auto g = live(info.Env());
    auto v = std::make_shared<std::vector<double>>(doubles(info[0]));
    return run(
        info.Env(),
        [g, v] {
          std::vector<torch::Tensor> t{torch::from_blob(v->data(), {static_cast<int64_t>(v->size())}, torch::kDouble)};
          g->allreduce_sum(t);
        },
        [v](Napi::Env e) { return array_of(e, *v); });
  }

  Napi::Value Broadcast(const Napi::CallbackInfo& info) {
    auto g = live(info.Env());
    auto v = std::make_shared<std::vector<double>>(doubles(info[0]));
    if (!info[1].IsNumber()) throw Napi::TypeError::New(info.Env(), "expected a number for root");
    const int root = info[1].As<Napi::Number>().Int32Value();
    return run(
        info.Env(),
        [g, v, root] {
          std::vector<torch::Tensor> t{torch::from_blob(v->data(), {static_cast<int64_t>(v->size())}, torch::kDouble)};
          g->broadcast(t, root);
        },
        [v](Napi::Env e) { return array_of(e, *v); });
  }

  Napi::Value Barrier(const Napi::CallbackInfo& info) {
    auto g = live(info.Env());
    return run(info.Env(), [g] { g->barrier(); });
  }

  Napi::Value Rank(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), live(info.Env())->rank()); }
  Napi::Value World(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), live(info.Env())->world()); }
  Napi::Value Close(const Napi::CallbackInfo& info) {
    holder_->reset();  // a model that holds it keeps it until setGroup(null) or dispose
    return info.Env().Undefined();
  }
};

}  // namespace

std::shared_ptr<dist::Group> unwrap_group(const Napi::Value& v) {
  if (!v.IsObject() || constructor == nullptr || !v.As<Napi::Object>().InstanceOf(constructor->Value()))
    throw Napi::TypeError::New(v.Env(), "expected a NativeGroup");
  return NativeGroup::Unwrap(v.As<Napi::Object>())->group();
}

void InitDist(Napi::Env env, Napi::Object exports) {
  Napi::Function f = NativeGroup::Define(env);
  constructor = new Napi::FunctionReference(Napi::Persistent(f));
  exports.Set("NativeGroup", f);
  exports.Set("hasGloo", Napi::Boolean::New(env, dist::have_gloo()));
}

}  // namespace napi
}  // namespace arpo
