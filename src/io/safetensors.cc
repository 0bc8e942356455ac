#include "io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/input_file.h"
#include "io/json_config.h"
#include "io/relative_name.h"
#include "io/safetensors_header.h"

namespace kiln::io {
namespace fs = std::filesystem;

namespace {

constexpr const char* kWhere = "safetensors";
// Real headers are kilobytes to a few MiB; anything larger is a corrupt length field, and
// parsing it would only burn memory.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeEntry {
  const char* name;
  size_t size;
  std::optional<DType> kiln;
};

constexpr DTypeEntry kDTypes[] = {
    {"F64", 8, std::nullopt},    {"F32", 4, DType::f32},       {"F16", 2, DType::f16},
    {"BF16", 2, DType::bf16},    {"I64", 8, DType::i64},       {"I32", 4, DType::i32},
    {"I16", 2, std::nullopt},    {"I8", 1, std::nullopt},      {"U8", 1, std::nullopt},
    {"U16", 2, std::nullopt},    {"U32", 4, std::nullopt},     {"U64", 8, std::nullopt},
    {"BOOL", 1, DType::boolean}, {"F8_E4M3", 1, DType::f8_e4m3}, {"F8_E5M2", 1, DType::f8_e5m2},
};

const DTypeEntry* find_dtype(const std::string& name) {
  for (const DTypeEntry& e : kDTypes)
    if (name == e.name) return &e;
  return nullptr;
}

std::string known_dtype_list() {
  std::string s;
  for (const DTypeEntry& e : kDTypes) s += std::string(s.empty() ? "" : ", ") + e.name;
  return s;
}

std::string errno_text() { return std::error_code(errno, std::generic_category()).message(); }

// "[safetensors] <file>: <parts...>"
template <typename... Parts>
[[noreturn]] void file_fail(const fs::path& file, const Parts&... parts) {
  fail(kWhere, file.string(), ": ", parts...);
}

// A JSON value as a non-negative int64, or nullopt with `why` set.
std::optional<int64_t> json_to_count(const nlohmann::json& v, std::string* why) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= uint64_t(std::numeric_limits<int64_t>::max())) return int64_t(u);
    *why = "too large";
    return std::nullopt;
  }
  if (v.is_number_integer()) {
    *why = "negative";
    return std::nullopt;
  }
  *why = json_kind(v);
  return std::nullopt;
}

// A JSON value for an error message: scalars as written (cut short), containers by kind, so
// that a hostile header cannot make the message huge.
std::string short_text(const nlohmann::json& v) {
  if (v.is_structured()) return json_kind(v);
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

}  // namespace

const char* safetensors_dtype_name(DType t) {
  for (const DTypeEntry& e : kDTypes)
    if (e.kiln == t) return e.name;
  return "?";
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(const fs::path& path) : file_(path, kWhere) { parse_header(); }

namespace {

std::map<std::string, std::string> parse_metadata(const fs::path& file, const nlohmann::json& m) {
  if (!m.is_object())
    file_fail(file, "\"__metadata__\" is ", json_kind(m), ", expected an object of strings");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : m.items()) {
    if (!value.is_string())
      file_fail(file, "\"__metadata__\" entry '", key, "' is ", json_kind(value),
                ", expected a string");
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

Shape parse_shape(const fs::path& file, const std::string& name, const nlohmann::json& entry) {
  const auto it = entry.find("shape");
  if (it == entry.end()) file_fail(file, "tensor '", name, "': missing \"shape\"");
  if (!it->is_array())
    file_fail(file, "tensor '", name, "': \"shape\" is ", json_kind(*it),
              ", expected an array of non-negative integers");
  Shape shape;
  for (size_t i = 0; i < it->size(); ++i) {
    std::string why;
    const auto d = json_to_count((*it)[i], &why);
    if (!d)
      file_fail(file, "tensor '", name, "': shape entry ", i, " (", short_text((*it)[i]), ") is ",
                why, "; expected a non-negative integer");
    shape.push_back(*d);
  }
  return shape;
}

std::pair<uint64_t, uint64_t> parse_offsets(const fs::path& file, const std::string& name,
                                            const nlohmann::json& entry) {
  const auto it = entry.find("data_offsets");
  if (it == entry.end()) file_fail(file, "tensor '", name, "': missing \"data_offsets\"");
  if (!it->is_array() || it->size() != 2)
    file_fail(file, "tensor '", name, "': \"data_offsets\" is ", short_text(*it),
              ", expected [begin, end]");
  uint64_t v[2];
  for (size_t i = 0; i < 2; ++i) {
    std::string why;
    const auto d = json_to_count((*it)[i], &why);
    if (!d)
      file_fail(file, "tensor '", name, "': data_offsets ", (i ? "end" : "begin"), " (",
                short_text((*it)[i]), ") is ", why, "; expected a non-negative integer");
    v[i] = uint64_t(*d);
  }
  if (v[0] > v[1])
    file_fail(file, "tensor '", name, "': data_offsets begin ", v[0], " > end ", v[1]);
  return {v[0], v[1]};
}

// Bytes that `shape` of `dtype` occupies, or nullopt on overflow (or numel past int64).
std::optional<uint64_t> shape_bytes(const Shape& shape, size_t elem) {
  uint64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, uint64_t(d), &n)) return std::nullopt;
  if (n > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(n, uint64_t(elem), &bytes)) return std::nullopt;
  return bytes;
}

TensorInfo parse_entry(const fs::path& file, const std::string& name, const nlohmann::json& entry,
                       uint64_t data_begin, uint64_t data_size) {
  if (!entry.is_object())
    file_fail(file, "tensor '", name, "': entry is ", json_kind(entry),
              ", expected an object with \"dtype\", \"shape\" and \"data_offsets\"");
  const auto dt = entry.find("dtype");
  if (dt == entry.end()) file_fail(file, "tensor '", name, "': missing \"dtype\"");
  if (!dt->is_string())
    file_fail(file, "tensor '", name, "': \"dtype\" is ", json_kind(*dt), ", expected a string");
  const std::string dtype_string = dt->get<std::string>();
  const DTypeEntry* known = find_dtype(dtype_string);
  if (!known)
    file_fail(file, "tensor '", name, "': unknown dtype '", dtype_string, "' (expected one of ",
              known_dtype_list(), ")");

  TensorInfo info;
  info.dtype_string = dtype_string;
  info.dtype = known->kiln;
  info.shape = parse_shape(file, name, entry);
  const auto [begin, end] = parse_offsets(file, name, entry);

  const auto need = shape_bytes(info.shape, known->size);
  if (!need)
    file_fail(file, "tensor '", name, "': shape ", to_string(info.shape), " x ", dtype_string,
              " is too large (byte size overflows 64 bits)");
  if (*need != end - begin)
    file_fail(file, "tensor '", name, "': shape ", to_string(info.shape), " x ", dtype_string,
              " needs ", *need, " bytes but data_offsets span ", end - begin);
  if (end > data_size)
    file_fail(file, "tensor '", name, "': data_offsets [", begin, ",", end,
              "] lie outside the file: the data section has only ", data_size,
              " bytes (file truncated?)");
  info.byte_begin = data_begin + begin;
  info.byte_end = data_begin + end;
  return info;
}

void check_no_overlaps(const fs::path& file, const std::map<std::string, TensorInfo>& tensors,
                       uint64_t data_begin) {
  std::vector<std::pair<const std::string*, const TensorInfo*>> order;
  for (const auto& [name, info] : tensors)
    if (info.nbytes() > 0) order.emplace_back(&name, &info);  // empty ranges hold no bytes
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second->byte_begin < b.second->byte_begin;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& prev = *order[i - 1].second;
    const TensorInfo& cur = *order[i].second;
    if (cur.byte_begin < prev.byte_end)
      file_fail(file, "tensors '", *order[i - 1].first, "' (data_offsets [",
                prev.byte_begin - data_begin, ",", prev.byte_end - data_begin, "]) and '",
                *order[i].first, "' (data_offsets [", cur.byte_begin - data_begin, ",",
                cur.byte_end - data_begin, "]) overlap");
  }
}

// The format requires the byte buffer to be entirely indexed: tensors (sorted by offset) tile the
// data section from its first byte to the end of the file, with no hole and nothing after.
void check_fully_indexed(const fs::path& file, const std::map<std::string, TensorInfo>& tensors, uint64_t data_begin,
                         uint64_t file_size) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, info] : tensors)
    if (info.nbytes() > 0) ranges.emplace_back(info.byte_begin - data_begin, info.byte_end - data_begin);
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != at)
      file_fail(file, "bytes [", at, ",", begin, ") of the data section belong to no tensor (the format forbids holes)");
    at = end;
  }
  if (at != file_size - data_begin)
    file_fail(file, file_size - data_begin - at, " bytes after the last tensor (data section bytes [", at, ",",
              file_size - data_begin, ")) belong to no tensor (the format forbids trailing bytes)");
}

}  // namespace

void SafetensorsFile::parse_header() {
  const auto* bytes = reinterpret_cast<const unsigned char*>(file_.bytes().data());
  const uint64_t file_size = file_.size();
  if (file_size < 8)
    file_.fail("file is truncated: ", file_size,
               " bytes, shorter than the 8-byte header length that starts a safetensors file");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(bytes[i]) << (8 * i);
  if (n > kMaxHeaderBytes)
    file_.fail("header length ", n, " bytes is absurd (limit ", kMaxHeaderBytes,
               " bytes); not a safetensors file?");
  if (n > file_size - 8)
    file_.fail("header length ", n, " bytes runs past the end of the file (", file_size,
               " bytes leave room for at most ", file_size - 8, ")");

  const char* text = reinterpret_cast<const char*>(bytes + 8);
  const nlohmann::json header = parse_json(text, text + n, kWhere, path().string() + " header");
  if (!header.is_object()) file_.fail("header is ", json_kind(header), ", expected a JSON object");

  const uint64_t data_begin = 8 + n;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__")
      metadata_ = parse_metadata(path(), value);
    else
      tensors_.emplace(key, parse_entry(path(), key, value, data_begin, file_size - data_begin));
  }
  check_no_overlaps(path(), tensors_, data_begin);
  check_fully_indexed(path(), tensors_, data_begin, file_size);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

bool SafetensorsFile::contains(const std::string& name) const { return tensors_.count(name) > 0; }

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end())
    file_.fail("no tensor '", name, "' in the file (it has ", tensors_.size(), " tensors)");
  return it->second;
}

DType SafetensorsFile::supported_dtype(const TensorInfo& ti, const std::string& name) const {
  if (!ti.dtype)
    file_.fail("tensor '", name, "' has dtype ", ti.dtype_string,
               ", which is not supported by kiln (supported: F32, BF16, F16, F8_E4M3, F8_E5M2, I32, I64, BOOL)");
  return *ti.dtype;
}

Tensor SafetensorsFile::load(const std::string& name) const {
  const TensorInfo& ti = info(name);
  return file_.view(ti.byte_begin, ti.shape, supported_dtype(ti, name));
}

Tensor SafetensorsFile::load(const std::string& name, DType want) const {
  const TensorInfo& ti = info(name);
  return file_.load(ti.byte_begin, ti.shape, supported_dtype(ti, name), want);
}

Tensor SafetensorsFile::load_slice(const std::string& name, int dim, int64_t start, int64_t length,
                                   DType want) const {
  const TensorInfo& ti = info(name);
  return file_.load_slice(ti.byte_begin, ti.shape, supported_dtype(ti, name),
                          "tensor '" + name + "'", dim, start, length, want);
}

// ---------------------------------------------------------------------------------------------
// SafetensorsIndex

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_text_file(const fs::path& path) {
  // Never a blocking open: a FIFO is refused (io/input_file.h).
  return read_input_file(kWhere, path, "a safetensors index (JSON)");
}

}  // namespace

SafetensorsIndex::SafetensorsIndex(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const char* index :
         {"diffusion_pytorch_model.safetensors.index.json", "model.safetensors.index.json"}) {
      if (fs::is_regular_file(path / index, ec)) {
        open_index(path / index);
        return;
      }
    }
    std::vector<fs::path> found;
    for (const auto& entry : fs::directory_iterator(path, ec))
      if (entry.path().extension() == ".safetensors") found.push_back(entry.path());
    if (ec) file_fail(path, "cannot list the folder: ", ec.message());
    std::sort(found.begin(), found.end());
    if (found.empty())
      file_fail(path,
                "no checkpoint in this folder (looked for "
                "diffusion_pytorch_model.safetensors.index.json, "
                "model.safetensors.index.json and *.safetensors)");
    if (found.size() > 1) {
      std::string list;
      for (const auto& f : found) list += (list.empty() ? "" : ", ") + f.filename().string();
      file_fail(path, found.size(),
                " .safetensors files but no index.json saying which to use: ", list);
    }
    path_ = found.front();
  } else if (ends_with(path.string(), ".index.json")) {
    open_index(path);
    return;
  } else {
    path_ = path;
  }
  single_ = std::make_unique<SafetensorsFile>(path_);
}

SafetensorsIndex::~SafetensorsIndex() = default;

void SafetensorsIndex::open_index(const fs::path& index_path) {
  path_ = index_path;
  const std::string text = read_text_file(index_path);
  const nlohmann::json j =
      parse_json(text.data(), text.data() + text.size(), kWhere, index_path.string());
  if (!j.is_object()) file_fail(path_, "index is ", json_kind(j), ", expected a JSON object");

  const auto wm = j.find("weight_map");
  if (wm == j.end()) file_fail(path_, "missing \"weight_map\"");
  if (!wm->is_object())
    file_fail(path_, "\"weight_map\" is ", json_kind(*wm), ", expected an object");
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string())
      file_fail(path_, "weight_map entry for tensor '", tensor, "' is ", json_kind(shard),
                ", expected a shard file name");
    weight_map_.emplace(tensor, shard.get<std::string>());
  }

  const auto md = j.find("metadata");
  if (md != j.end() && !md->is_null()) {
    if (!md->is_object())
      file_fail(path_, "\"metadata\" is ", json_kind(*md), ", expected an object");
    for (const auto& [key, value] : md->items())
      metadata_.emplace(key, value.is_string() ? value.get<std::string>() : value.dump());
  }

  // The rule is about the names the index gives (io/relative_name.h); shards are opened as
  // folder / name, so symlinks (a Hugging Face hub cache's links into blobs/) are the OS's.
  const fs::path folder = index_path.parent_path();
  const std::string inside =
      "a shard file inside " + (folder.empty() ? fs::path(".") : folder).string();
  for (const auto& [tensor, shard] : weight_map_) {
    if (shard_paths_.count(shard)) continue;
    check_relative_name(kWhere, path_, "weight_map entry for tensor '" + tensor + "': shard",
                        shard, inside);
    shard_paths_.emplace(shard, folder / shard);
  }
}

const SafetensorsFile& SafetensorsIndex::shard_for(const std::string& name) const {
  if (single_) return *single_;
  const auto it = weight_map_.find(name);
  if (it == weight_map_.end())
    file_fail(path_, "tensor '", name, "' is not in the weight_map (", weight_map_.size(),
              " tensors)");
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<SafetensorsFile>& slot = shards_[it->second];
  if (!slot) {
    try {
      slot = std::make_unique<SafetensorsFile>(shard_paths_.at(it->second));
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + " (shard '" + escape_controls(it->second) + "' listed in " +
                  escape_controls(path_.string()) + ")");  // values escaped as format_error does
    }
  }
  if (!slot->contains(name))
    file_fail(path_, "weight_map puts tensor '", name, "' in shard '", it->second,
              "', but that shard has no such tensor");
  return *slot;
}

std::vector<std::string> SafetensorsIndex::names() const {
  if (single_) return single_->names();
  std::vector<std::string> out;
  out.reserve(weight_map_.size());
  for (const auto& kv : weight_map_) out.push_back(kv.first);
  return out;
}

bool SafetensorsIndex::contains(const std::string& name) const {
  return single_ ? single_->contains(name) : weight_map_.count(name) > 0;
}

TensorInfo SafetensorsIndex::info(const std::string& name) const {
  return shard_for(name).info(name);
}

const std::map<std::string, std::string>& SafetensorsIndex::metadata() const {
  return single_ ? single_->metadata() : metadata_;
}

fs::path SafetensorsIndex::shard_path(const std::string& name) const {
  if (single_) {
    single_->info(name);  // throws, naming the file, when the tensor is missing
    return path_;
  }
  const auto it = weight_map_.find(name);
  if (it == weight_map_.end())
    file_fail(path_, "tensor '", name, "' is not in the weight_map (", weight_map_.size(),
              " tensors)");
  return shard_paths_.at(it->second);
}

Tensor SafetensorsIndex::load(const std::string& name) const { return shard_for(name).load(name); }

Tensor SafetensorsIndex::load(const std::string& name, DType want) const {
  return shard_for(name).load(name, want);
}

Tensor SafetensorsIndex::load_slice(const std::string& name, int dim, int64_t start, int64_t length,
                                    DType want) const {
  return shard_for(name).load_slice(name, dim, start, length, want);
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

// Removes the temporary file unless it was renamed into place.
class TempFile {
 public:
  explicit TempFile(const fs::path& target) {
    static std::atomic<uint64_t> counter{0};
    path_ = target.parent_path() /
            ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
             std::to_string(counter.fetch_add(1)));
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0)
      file_fail(target, "cannot create temporary file ", path_.string(), ": ", errno_text());
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write(const fs::path& target, const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t w = ::write(fd_, p, bytes);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) file_fail(target, "write failed: ", errno_text());
      p += w;
      bytes -= size_t(w);
    }
  }

  void commit(const fs::path& target) {
    if (::fsync(fd_) != 0) file_fail(target, "fsync failed: ", errno_text());
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) file_fail(target, "close failed: ", errno_text());
    if (::rename(path_.c_str(), target.c_str()) != 0)
      file_fail(target, "cannot rename ", path_.string(), " into place: ", errno_text());
    committed_ = true;
  }

 private:
  fs::path path_;
  int fd_ = -1;
  bool committed_ = false;
};

std::string build_header(const fs::path& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  SafetensorsHeader header(path, metadata);
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) file_fail(path, "tensor '", name, "' is undefined");
    if (t.device() != Device::cpu())
      file_fail(path, "tensor '", name, "' is on ", t.device().str(), "; move it to cpu first");
    if (!t.is_contiguous())
      file_fail(path, "tensor '", name, "' (", t.describe(), ") is not contiguous");
    header.add(name, t.dtype(), t.shape(), t.nbytes());
  }
  return header.text();
}

}  // namespace

void save_safetensors(const fs::path& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string header = build_header(path, tensors, metadata);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<unsigned char>(uint64_t(header.size()) >> (8 * i));
  TempFile out(path);
  out.write(path, len, sizeof len);
  out.write(path, header.data(), header.size());
  for (const auto& [name, t] : tensors) out.write(path, t.data_ptr(), t.nbytes());
  out.commit(path);
}

}  // namespace kiln::io
