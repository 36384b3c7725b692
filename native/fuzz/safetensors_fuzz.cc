// Fuzz target: a whole safetensors file image through format/safetensors_format
// (length prefix, header JSON, dtypes, shapes, offsets, overlaps). An accepted
// file is re-checked naively (every range inside the data section, sized by
// its dtype and shape, no two ranges sharing a byte) and every byte of every
// tensor is read, so ASan catches a range the validator let past the end. A
// rejection must be a std::runtime_error starting with the file name.
#include "driver.h"
#include "format/json.h"
#include "format/safetensors_format.h"

namespace st = arpo::st;
namespace json = arpo::json;

static const char* const kSource = "fuzz.safetensors";

namespace {

struct SeedTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
};

std::string image(const std::vector<SeedTensor>& tensors, bool metadata, size_t pad_to, size_t gap) {
  json::Value header = json::Value::object();
  if (metadata) header.set("__metadata__", json::Value::object({{"format", json::Value::string("pt")}}));
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t bytes = static_cast<uint64_t>(st::dtype_size(t.dtype));
    json::Value shape = json::Value::array();
    for (const int64_t d : t.shape) {
      bytes *= static_cast<uint64_t>(d);
      shape.mutable_array().push_back(json::Value::integer(d));
    }
    json::Value e = json::Value::object();
    e.set("dtype", json::Value::string(t.dtype));
    e.set("shape", std::move(shape));
    e.set("data_offsets", json::Value::array({json::Value::integer(static_cast<int64_t>(offset)),
                                              json::Value::integer(static_cast<int64_t>(offset + bytes))}));
    header.set(t.name, std::move(e));
    offset += bytes + gap;
  }
  std::string text = json::dump(header);
  if (pad_to) text.append((pad_to - text.size() % pad_to) % pad_to, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out += text;
  for (uint64_t i = 0; i < offset; ++i) out += static_cast<char>(i * 37 + 11);
  return out;
}

}  // namespace

std::vector<std::string> fuzz_seeds() {
  return {
      image({{"a.weight", "F32", {3, 4}}, {"b", "BF16", {5}}, {"c.bias", "I64", {2}}}, true, 8, 0),
      image({{"model.embed_tokens.weight", "F16", {7, 3}}, {"scalar", "F64", {}}, {"empty", "U8", {0, 5}}}, false, 0, 3),
      image({{"m", "BOOL", {2, 2, 2}}, {"n", "I8", {1}}, {"o", "I16", {3}}, {"p", "I32", {2}}}, true, 8, 1),
  };
}

bool fuzz_one(const uint8_t* data, size_t size) {
  std::map<std::string, st::TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;
  try {
    data_start = st::parse_file(kSource, data, size, &tensors, &metadata);
  } catch (const std::runtime_error& e) {
    fuzz_expect_message(e, std::string(kSource) + ": ");
    return false;
  }
  if (data_start < 9 || data_start > size) fuzz_fail("data section starts at " + std::to_string(data_start) + " of " + std::to_string(size));
  const uint64_t data_bytes = size - data_start;
  std::vector<const st::TensorInfo*> all;
  for (const auto& kv : tensors) {
    const st::TensorInfo& t = kv.second;
    uint64_t bytes = static_cast<uint64_t>(st::dtype_size(t.dtype));  // throws (a defect) if an unknown dtype got in
    for (const int64_t d : t.shape) {
      if (d < 0) fuzz_fail("accepted a negative dimension in " + kv.first);
      if (d != 0 && bytes > UINT64_MAX / static_cast<uint64_t>(d)) fuzz_fail("accepted an overflowing shape in " + kv.first);
      bytes *= static_cast<uint64_t>(d);
    }
    if (t.begin > t.end || t.end > data_bytes) fuzz_fail("accepted a range outside the data section: " + kv.first);
    if (t.end - t.begin != bytes) fuzz_fail("accepted a range whose size does not match dtype and shape: " + kv.first);
    all.push_back(&t);
    // Touch every byte: ASan reports a read past the (exactly sized) input.
    unsigned sum = 0;
    for (uint64_t i = t.begin; i < t.end; ++i) sum += data[data_start + i];
    (void)sum;
  }
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (all[i]->begin < all[j]->end && all[j]->begin < all[i]->end) fuzz_fail("accepted two tensors sharing bytes");
  return true;
}
