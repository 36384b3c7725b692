// The safetensors format without libtorch: the header's JSON, the file image
// (u64 little-endian header length N, N bytes of JSON, then the data) and a
// sharded checkpoint's model.safetensors.index.json, all fully validated.
// Kept free of libtorch so the sanitised fuzz targets (native/fuzz/) build
// small; native/torch/safetensors.{h,cc} maps the result into tensors.
// Every error is a std::runtime_error whose message starts with the source
// (the file) and names the tensor or field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace arpo {
namespace st {

// Largest header accepted (the reference implementation's MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100000000;

struct TensorInfo {
  std::string dtype;           // "F32", "BF16", ...
  std::vector<int64_t> shape;  // may be empty (a scalar)
  uint64_t begin = 0;          // byte offsets within the data section
  uint64_t end = 0;
};

// The dtypes this reader accepts, in a fixed order (native/torch/safetensors.cc
// maps them to libtorch types by position): those libtorch 1.13 can hold.
struct DType {
  const char* name;
  int64_t size;  // bytes per element
};
constexpr DType kDTypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
    {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1},
};
constexpr size_t kNumDTypes = sizeof(kDTypes) / sizeof(kDTypes[0]);

// Index into kDTypes, or -1 when the name is not one of them.
int dtype_index(const std::string& name);
// "F64, F32, ..." for messages.
std::string known_dtypes();
// Bytes per element of a dtype name; throws when unknown.
int64_t dtype_size(const std::string& name);

// "<source>: <what>" and "<source>: tensor \"<name>\": <what>".
std::runtime_error file_error(const std::string& source, const std::string& what);
std::runtime_error tensor_error(const std::string& source, const std::string& name, const std::string& what);

// Parses and validates a header (the N bytes after the length prefix) for a
// data section of data_bytes: known dtypes, non-negative shapes whose byte
// counts do not overflow, offsets inside the data section that match the
// shape, no two tensors sharing bytes, "__metadata__" an object of strings.
void parse_header(const std::string& source, const char* header, uint64_t header_bytes, uint64_t data_bytes,
                  std::map<std::string, TensorInfo>* tensors, std::map<std::string, std::string>* metadata);

// Validates a whole file image of `size` bytes (the length prefix, the
// header, every tensor's range) and returns where the data section starts.
uint64_t parse_file(const std::string& source, const uint8_t* bytes, uint64_t size,
                    std::map<std::string, TensorInfo>* tensors, std::map<std::string, std::string>* metadata);

// The "weight_map" of a model.safetensors.index.json ({tensor: shard file}),
// each shard a plain file name in the checkpoint directory (no '/', '.', '..').
std::map<std::string, std::string> parse_index(const std::string& source, const char* text, size_t size);

}  // namespace st
}  // namespace arpo
