// Safetensors I/O on libtorch: a memory-mapped, fully validated reader, a
// checkpoint loader for HF directories (single file or sharded index) and an
// atomic writer. Format (huggingface/safetensors): u64 little-endian header
// length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]},
// "__metadata__": {str: str}}, then the data; offsets are relative to the data
// section (the format itself, without libtorch: format/safetensors_format.h).
// Every error is a std::runtime_error naming the file (and tensor).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "format/safetensors_format.h"

namespace arpo {
namespace st {

// The safetensors dtype string for a torch dtype and back; both throw on
// dtypes safetensors (or this reader) does not have.
std::string dtype_name(torch::ScalarType dtype);
torch::ScalarType scalar_type(const std::string& dtype_name);

class SafetensorsFile {
 public:
  // Maps the file read-only and validates the whole header; throws
  // std::runtime_error("<path>: ...") on any problem.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

  // Copies tensor `name` out of the mapping into a new CPU tensor, converted
  // to `dtype` when given (e.g. BF16 on disk -> float32). Throws when absent.
  torch::Tensor load(const std::string& name, std::optional<torch::ScalarType> dtype = std::nullopt) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* map_ = nullptr;  // whole file
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;       // 8 + N
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of an HF checkpoint directory: `model.safetensors`, or the
// shards named by `model.safetensors.index.json` ("weight_map": {tensor:
// file}). Sorted by name; converted to `dtype` when given.
std::vector<std::pair<std::string, torch::Tensor>> load_checkpoint(
    const std::string& dir, std::optional<torch::ScalarType> dtype = std::nullopt);

// The same tensors, one at a time, in name order: `visit(name, tensor)` gets
// each as it is copied out, so a caller that copies into its own parameters
// holds one checkpoint tensor at a time instead of the whole checkpoint.
void visit_checkpoint(const std::string& dir,
                      const std::function<void(const std::string& name, const torch::Tensor& tensor)>& visit,
                      std::optional<torch::ScalarType> dtype = std::nullopt);

// Writes tensors (any device/layout; copied to contiguous CPU) as one
// safetensors file, names sorted, header padded with spaces to a multiple of
// 8 bytes. Atomic: written to path + ".tmp-<pid>", fsynced, renamed over path.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace st
}  // namespace arpo
