// Fuzz target: model.safetensors.index.json's weight_map through
// format/safetensors_format's parse_index. An accepted index maps every
// tensor to a plain file name inside the checkpoint directory (no '/', no
// '.' or '..', no NUL: nothing that could open a file elsewhere); a rejection
// must be a std::runtime_error starting with the file name.
#include "driver.h"
#include "format/safetensors_format.h"

namespace st = arpo::st;

static const char* const kSource = "fuzz/model.safetensors.index.json";

std::vector<std::string> fuzz_seeds() {
  return {
      R"({"metadata":{"total_size":12},"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}})",
      R"({"weight_map":{"model.layers.0.mlp.up_proj.weight":"a.safetensors","lm_head.weight":"b.safetensors","z":"a.safetensors"}})",
  };
}

bool fuzz_one(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> map;
  try {
    map = st::parse_index(kSource, reinterpret_cast<const char*>(data), size);
  } catch (const std::runtime_error& e) {
    fuzz_expect_message(e, std::string(kSource) + ": ");
    return false;
  }
  for (const auto& kv : map) {
    const std::string& f = kv.second;
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos || f.find('\0') != std::string::npos)
      fuzz_fail("accepted shard name \"" + f + "\" for tensor " + kv.first);
  }
  return true;
}
