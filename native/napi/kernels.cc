// N-API bindings of the fused kernels (native/kernels). Filled in by the kernels work.
#include <napi.h>

namespace arpo {
namespace napi {

static Napi::Value Noop(const Napi::CallbackInfo& info) { return info.Env().Undefined(); }

void InitKernels(Napi::Env env, Napi::Object exports) {
  exports.Set("noop", Napi::Function::New(env, Noop, "noop"));
}

}  // namespace napi
}  // namespace arpo
