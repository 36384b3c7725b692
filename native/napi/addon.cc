// The one registration file of the arpo addon: each exported group registers
// itself from its own file (kernels.cc, torch/*.cc).
#include <napi.h>

namespace arpo {
namespace napi {
void InitKernels(Napi::Env env, Napi::Object exports);
#ifdef ARPO_WITH_TORCH
void InitTorch(Napi::Env env, Napi::Object exports);
#endif
}  // namespace napi
}  // namespace arpo

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
#ifdef ARPO_WITH_TORCH
  exports.Set("hasTorch", Napi::Boolean::New(env, true));
#else
  exports.Set("hasTorch", Napi::Boolean::New(env, false));
#endif
#ifdef ARPO_WITH_CUDA
  exports.Set("hasCuda", Napi::Boolean::New(env, true));
#else
  exports.Set("hasCuda", Napi::Boolean::New(env, false));
#endif
  arpo::napi::InitKernels(env, exports);
#ifdef ARPO_WITH_TORCH
  arpo::napi::InitTorch(env, exports);
#endif
  return exports;
}

NODE_API_MODULE(arpo, Init)
