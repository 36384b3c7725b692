// N-API binding of the c10d process group (torch/dist.h) for data-parallel
// training: the NativeGroup class (dist.cc). The model binding reads the
// group a NativeGroup holds through unwrap_group.
#pragma once

#include <napi.h>

#include <memory>

#include "torch/dist.h"

namespace arpo {
namespace napi {

// The group of a NativeGroup object (null before init() and after close());
// a TypeError for anything else.
std::shared_ptr<dist::Group> unwrap_group(const Napi::Value& v);

void InitDist(Napi::Env env, Napi::Object exports);

}  // namespace napi
}  // namespace arpo
