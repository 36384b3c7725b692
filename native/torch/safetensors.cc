// Safetensors reader (mmap + full header validation), sharded checkpoint
// loader and atomic writer; see safetensors.h for the format and contract.
#include "torch/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "format/json.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader copies bytes as-is and needs a little-endian host"
#endif

namespace arpo {
namespace st {

namespace {

std::string sys_error(const std::string& op) {
  return op + " failed: " + std::strerror(errno);
}

// libtorch's type for each entry of kDTypes, by position.
const torch::ScalarType kTorchTypes[] = {
    torch::kFloat64, torch::kFloat32, torch::kFloat16, torch::kBFloat16, torch::kInt64,
    torch::kInt32,   torch::kInt16,   torch::kInt8,    torch::kUInt8,    torch::kBool,
};
static_assert(sizeof(kTorchTypes) / sizeof(kTorchTypes[0]) == kNumDTypes, "one torch type per safetensors dtype");

std::string join_path(const std::string& dir, const std::string& file) {
  if (dir.empty() || dir.back() == '/') return dir + file;
  return dir + "/" + file;
}

bool file_exists(const std::string& path) {
  struct stat sb;
  return ::stat(path.c_str(), &sb) == 0 && S_ISREG(sb.st_mode);
}

std::string read_text_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw file_error(path, sys_error("open"));
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string msg = sys_error("read");
      ::close(fd);
      throw file_error(path, msg);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > kMaxHeaderBytes) {
      ::close(fd);
      throw file_error(path, "larger than " + std::to_string(kMaxHeaderBytes) + " bytes");
    }
  }
  ::close(fd);
  return out;
}

// Writes all of [data, data + size) (write(2) may write less than asked).
void write_all(int fd, const uint8_t* data, uint64_t size, const std::string& path) {
  while (size > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, 1u << 30));
    const ssize_t n = ::write(fd, data, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw file_error(path, sys_error("write"));
    }
    data += n;
    size -= static_cast<uint64_t>(n);
  }
}

}  // namespace

std::string dtype_name(torch::ScalarType dtype) {
  for (size_t i = 0; i < kNumDTypes; ++i)
    if (kTorchTypes[i] == dtype) return kDTypes[i].name;
  throw std::runtime_error(std::string("safetensors has no dtype for torch ") + c10::toString(dtype));
}

torch::ScalarType scalar_type(const std::string& name) {
  const int i = dtype_index(name);
  if (i < 0) throw std::runtime_error("unknown safetensors dtype " + json::quote(name) + " (known: " + known_dtypes() + ")");
  return kTorchTypes[i];
}

// ------------------------------------------------------------------ reader
std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw file_error(path, sys_error("open"));
  struct stat sb;
  if (::fstat(fd, &sb) != 0) {
    const std::string msg = sys_error("fstat");
    ::close(fd);
    throw file_error(path, msg);
  }
  if (!S_ISREG(sb.st_mode)) {
    ::close(fd);
    throw file_error(path, "not a regular file");
  }
  file->file_size_ = static_cast<uint64_t>(sb.st_size);
  if (file->file_size_ < 8) {  // mmap of an empty file fails; parse_file names the problem
    ::close(fd);
    file->data_start_ = parse_file(path, nullptr, file->file_size_, &file->tensors_, &file->metadata_);
  }
  void* map = ::mmap(nullptr, file->file_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping stays valid after close
  if (map == MAP_FAILED) {
    errno = map_errno;
    throw file_error(path, sys_error("mmap"));
  }
  file->map_ = static_cast<const uint8_t*>(map);  // unmapped by the destructor from here on
  file->data_start_ = parse_file(path, file->map_, file->file_size_, &file->tensors_, &file->metadata_);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), file_size_);
}

torch::Tensor SafetensorsFile::load(const std::string& name, std::optional<torch::ScalarType> dtype) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw tensor_error(path_, name, "not in this file");
  const TensorInfo& info = it->second;
  // Copy (not from_blob over the mapping): the result outlives the file and
  // is aligned for its dtype even when the offsets are not.
  torch::Tensor out = torch::empty(info.shape, torch::TensorOptions().dtype(scalar_type(info.dtype)));
  if (info.end > info.begin) std::memcpy(out.data_ptr(), map_ + data_start_ + info.begin, info.end - info.begin);
  if (dtype && *dtype != out.scalar_type()) out = out.to(*dtype);
  return out;
}

// ------------------------------------------------------------------ checkpoint
void visit_checkpoint(const std::string& dir,
                      const std::function<void(const std::string& name, const torch::Tensor& tensor)>& visit,
                      std::optional<torch::ScalarType> dtype) {
  const std::string single = join_path(dir, "model.safetensors");
  const std::string index_path = join_path(dir, "model.safetensors.index.json");
  if (file_exists(single)) {
    const auto file = SafetensorsFile::open(single);
    for (const auto& kv : file->tensors()) visit(kv.first, file->load(kv.first, dtype));  // std::map: sorted by name
    return;
  }
  if (!file_exists(index_path))
    throw file_error(dir, "no model.safetensors or model.safetensors.index.json in this directory");

  const std::string index_text = read_text_file(index_path);
  const std::map<std::string, std::string> tensor_to_shard = parse_index(index_path, index_text.data(), index_text.size());
  // Open (and validate) every shard and check the map before visiting anything,
  // so a bad index fails before the caller has consumed half a checkpoint.
  std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
  for (const auto& kv : tensor_to_shard) {
    auto& file = shards[kv.second];
    if (!file) file = SafetensorsFile::open(join_path(dir, kv.second));
    if (!file->contains(kv.first))
      throw file_error(index_path, "weight_map puts tensor " + json::quote(kv.first) + " in " + json::quote(kv.second) +
                                       ", which does not contain it");
  }
  for (const auto& kv : tensor_to_shard) visit(kv.first, shards[kv.second]->load(kv.first, dtype));
}

std::vector<std::pair<std::string, torch::Tensor>> load_checkpoint(const std::string& dir,
                                                                   std::optional<torch::ScalarType> dtype) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  visit_checkpoint(dir, [&](const std::string& name, const torch::Tensor& t) { out.emplace_back(name, t); }, dtype);
  return out;
}

// ------------------------------------------------------------------ writer
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, torch::Tensor>> sorted;
  sorted.reserve(tensors.size());
  for (const auto& kv : tensors) {
    if (kv.first.empty() || kv.first == "__metadata__")
      throw file_error(path, "cannot save a tensor named " + json::quote(kv.first));
    if (!kv.second.defined()) throw tensor_error(path, kv.first, "is an undefined tensor");
    dtype_name(kv.second.scalar_type());  // throws for dtypes safetensors lacks
    sorted.emplace_back(kv.first, kv.second.detach().to(torch::kCPU).contiguous());
  }
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i].first == sorted[i - 1].first) throw tensor_error(path, sorted[i].first, "given twice");

  json::Value header = json::Value::object();
  if (!metadata.empty()) {
    json::Value meta = json::Value::object();
    for (const auto& kv : metadata) meta.set(kv.first, json::Value::string(kv.second));
    header.set("__metadata__", std::move(meta));
  }
  uint64_t offset = 0;
  for (const auto& kv : sorted) {
    const uint64_t bytes = static_cast<uint64_t>(kv.second.numel()) * static_cast<uint64_t>(kv.second.element_size());
    json::Value shape = json::Value::array();
    for (const int64_t d : kv.second.sizes()) shape.mutable_array().push_back(json::Value::integer(d));
    json::Value entry = json::Value::object();
    entry.set("dtype", json::Value::string(dtype_name(kv.second.scalar_type())));
    entry.set("shape", std::move(shape));
    entry.set("data_offsets", json::Value::array({json::Value::integer(static_cast<int64_t>(offset)),
                                                  json::Value::integer(static_cast<int64_t>(offset + bytes))}));
    header.set(kv.first, std::move(entry));
    offset += bytes;
  }
  std::string text = json::dump(header);
  text.append((8 - text.size() % 8) % 8, ' ');  // data section starts 8-byte aligned (as the reference pads)
  uint8_t prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw file_error(tmp, sys_error("open"));
  try {
    write_all(fd, prefix, 8, tmp);
    write_all(fd, reinterpret_cast<const uint8_t*>(text.data()), text.size(), tmp);
    for (const auto& kv : sorted) {
      const uint64_t bytes = static_cast<uint64_t>(kv.second.numel()) * static_cast<uint64_t>(kv.second.element_size());
      if (bytes) write_all(fd, static_cast<const uint8_t*>(kv.second.data_ptr()), bytes, tmp);
    }
    if (::fsync(fd) != 0) throw file_error(tmp, sys_error("fsync"));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const std::string msg = sys_error("close");
    ::unlink(tmp.c_str());
    throw file_error(tmp, msg);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string msg = sys_error("rename to " + path);
    ::unlink(tmp.c_str());
    throw file_error(tmp, msg);
  }
  // Make the rename itself durable: fsync the directory entry.
  const size_t slash = path.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace st
}  // namespace arpo
