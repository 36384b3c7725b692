// The safetensors format without libtorch; see safetensors_format.h.
#include "format/safetensors_format.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "format/json.h"

namespace arpo {
namespace st {

std::runtime_error file_error(const std::string& source, const std::string& what) {
  return std::runtime_error(source + ": " + what);
}
std::runtime_error tensor_error(const std::string& source, const std::string& name, const std::string& what) {
  return std::runtime_error(source + ": tensor " + json::quote(name) + ": " + what);
}

int dtype_index(const std::string& name) {
  for (size_t i = 0; i < kNumDTypes; ++i)
    if (name == kDTypes[i].name) return static_cast<int>(i);
  return -1;
}

std::string known_dtypes() {
  std::string s;
  for (const auto& e : kDTypes) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

int64_t dtype_size(const std::string& name) {
  const int i = dtype_index(name);
  if (i < 0) throw std::runtime_error("unknown safetensors dtype " + json::quote(name) + " (known: " + known_dtypes() + ")");
  return kDTypes[i].size;
}

// ------------------------------------------------------------------ header
void parse_header(const std::string& source, const char* header, uint64_t header_bytes, uint64_t data_bytes,
                  std::map<std::string, TensorInfo>* tensors, std::map<std::string, std::string>* metadata) {
  json::Value root;
  try {
    root = json::parse(header, header_bytes);
  } catch (const json::ParseError& e) {
    throw file_error(source, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!root.is_object())
    throw file_error(source, std::string("header is a JSON ") + json::Value::type_name(root.type()) + ", expected an object");

  tensors->clear();
  metadata->clear();
  for (const auto& kv : root.as_object()) {
    const std::string& name = kv.first;
    const json::Value& entry = kv.second;
    if (name == "__metadata__") {
      if (!entry.is_object()) throw file_error(source, "\"__metadata__\" must be an object of strings");
      for (const auto& m : entry.as_object()) {
        if (!m.second.is_string())
          throw file_error(source, "\"__metadata__\" value for " + json::quote(m.first) + " is a " +
                                       json::Value::type_name(m.second.type()) + ", expected a string");
        (*metadata)[m.first] = m.second.as_string();
      }
      continue;
    }
    if (!entry.is_object())
      throw tensor_error(source, name, std::string("entry is a ") + json::Value::type_name(entry.type()) + ", expected an object");
    TensorInfo info;

    const json::Value* dtype = entry.find("dtype");
    if (!dtype || !dtype->is_string()) throw tensor_error(source, name, "missing string field \"dtype\"");
    const int di = dtype_index(dtype->as_string());
    if (di < 0) throw tensor_error(source, name, "unknown dtype " + json::quote(dtype->as_string()) + " (known: " + known_dtypes() + ")");
    const DType* dt = &kDTypes[di];
    info.dtype = dt->name;

    const json::Value* shape = entry.find("shape");
    if (!shape || !shape->is_array()) throw tensor_error(source, name, "missing array field \"shape\"");
    // numel * itemsize with overflow checks: a hostile shape must not wrap around.
    uint64_t bytes = static_cast<uint64_t>(dt->size);
    for (const auto& d : shape->as_array()) {
      if (!d.is_integer() || d.as_int64() < 0)
        throw tensor_error(source, name, "shape " + json::dump(*shape) + " must hold non-negative integers");
      info.shape.push_back(d.as_int64());
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d.as_int64()), &bytes))
        throw tensor_error(source, name, "shape " + json::dump(*shape) + " overflows 64-bit byte counts");
    }

    const json::Value* offsets = entry.find("data_offsets");
    if (!offsets || !offsets->is_array() || offsets->as_array().size() != 2 || !offsets->as_array()[0].is_integer() ||
        !offsets->as_array()[1].is_integer() || offsets->as_array()[0].as_int64() < 0 || offsets->as_array()[1].as_int64() < 0)
      throw tensor_error(source, name, "\"data_offsets\" must be [begin, end] of non-negative integers, got " +
                                           (offsets ? json::dump(*offsets) : std::string("nothing")));
    info.begin = static_cast<uint64_t>(offsets->as_array()[0].as_int64());
    info.end = static_cast<uint64_t>(offsets->as_array()[1].as_int64());
    const std::string range = "[" + std::to_string(info.begin) + ", " + std::to_string(info.end) + "]";
    if (info.end < info.begin) throw tensor_error(source, name, "data_offsets " + range + " end before they begin");
    if (info.end > data_bytes)
      throw tensor_error(source, name, "data_offsets " + range + " exceed the data section of " + std::to_string(data_bytes) + " bytes");
    if (info.end - info.begin != bytes)
      throw tensor_error(source, name, "data_offsets " + range + " hold " + std::to_string(info.end - info.begin) +
                                           " bytes but dtype " + info.dtype + " and shape " + json::dump(*shape) + " need " +
                                           std::to_string(bytes));
    (*tensors)[name] = std::move(info);
  }

  // Tensors may leave gaps, but two tensors may never share bytes.
  std::vector<std::pair<const std::string*, const TensorInfo*>> by_offset;
  for (const auto& kv : *tensors)
    if (kv.second.end > kv.second.begin) by_offset.emplace_back(&kv.first, &kv.second);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto& prev = by_offset[i - 1];
    const auto& cur = by_offset[i];
    if (cur.second->begin < prev.second->end)
      throw tensor_error(source, *cur.first, "data_offsets [" + std::to_string(cur.second->begin) + ", " +
                                                 std::to_string(cur.second->end) + "] overlap tensor " + json::quote(*prev.first) +
                                                 " at [" + std::to_string(prev.second->begin) + ", " +
                                                 std::to_string(prev.second->end) + "]");
  }
}

// ------------------------------------------------------------------ file image
uint64_t parse_file(const std::string& source, const uint8_t* bytes, uint64_t size,
                    std::map<std::string, TensorInfo>* tensors, std::map<std::string, std::string>* metadata) {
  if (size < 8) throw file_error(source, "file is " + std::to_string(size) + " bytes, too short for the 8-byte header length");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | bytes[i];  // little-endian u64
  if (header_bytes > kMaxHeaderBytes)
    throw file_error(source, "header length " + std::to_string(header_bytes) + " exceeds the limit of " +
                                 std::to_string(kMaxHeaderBytes) + " bytes");
  if (header_bytes > size - 8)
    throw file_error(source, "header length " + std::to_string(header_bytes) + " exceeds the " + std::to_string(size - 8) +
                                 " bytes after the length prefix (truncated file?)");
  if (header_bytes == 0 || bytes[8] != '{') throw file_error(source, "header does not start with '{'");
  const uint64_t data_start = 8 + header_bytes;
  parse_header(source, reinterpret_cast<const char*>(bytes + 8), header_bytes, size - data_start, tensors, metadata);
  return data_start;
}

// ------------------------------------------------------------------ index
std::map<std::string, std::string> parse_index(const std::string& source, const char* text, size_t size) {
  json::Value index;
  try {
    index = json::parse(text, size);
  } catch (const json::ParseError& e) {
    throw file_error(source, std::string("not valid JSON (") + e.what() + ")");
  }
  const json::Value* weight_map = index.find("weight_map");
  if (!weight_map || !weight_map->is_object()) throw file_error(source, "missing object field \"weight_map\"");
  std::map<std::string, std::string> tensor_to_shard;
  for (const auto& kv : weight_map->as_object()) {
    if (!kv.second.is_string())
      throw file_error(source, "weight_map entry for " + json::quote(kv.first) + " is not a file name string");
    const std::string& shard = kv.second.as_string();
    // Shards live in the checkpoint directory itself: no paths, no escapes.
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == ".." ||
        shard.find('\0') != std::string::npos)
      throw file_error(source, "weight_map entry for " + json::quote(kv.first) + " names " + json::quote(shard) +
                                   ", which is not a plain file name in the checkpoint directory");
    tensor_to_shard[kv.first] = shard;
  }
  return tensor_to_shard;
}

}  // namespace st
}  // namespace arpo
