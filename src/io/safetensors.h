// Reading and writing safetensors checkpoints (https://github.com/huggingface/safetensors).
//
// Layout: u64 little-endian header length N, N bytes of JSON header, then the data section.
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} with
// offsets relative to the data section, plus an optional "__metadata__" string map.
//
// A file is untrusted input: SafetensorsFile validates the whole header (sizes, dtypes,
// ranges, overlaps) before exposing anything, and every problem is a kiln::Error whose
// message names the file, the tensor and what was expected. Full loads are zero-copy views
// of a read-only mapping; slice loads (tensor parallelism) pread() exactly the bytes needed.
// Truncating or rewriting a file while it is mapped is not supported (the OS may SIGBUS).
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/mapped_file.h"  // also io::bytes_read()

namespace kiln::io {

struct TensorInfo {
  std::string dtype_string;    // as in the file: "F32", "BF16", "F64", ...
  std::optional<DType> dtype;  // empty when kiln has no such dtype (F64, I8, F8_E4M3, ...)
  Shape shape;
  uint64_t byte_begin = 0;  // absolute file offsets of the tensor's bytes
  uint64_t byte_end = 0;
  uint64_t nbytes() const { return byte_end - byte_begin; }
};

class SafetensorsFile {
 public:
  // Maps and validates the file; throws kiln::Error naming `path` on any problem.
  explicit SafetensorsFile(const std::filesystem::path& path);
  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::filesystem::path& path() const { return file_.path(); }
  // Tensor names sorted by name (not file order: the header is a JSON object).
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor in its stored dtype, on kiln::Device::cpu(). Zero-copy (a read-only view into the
  // mapping, which stays alive as long as the tensor does) unless its address in the file is
  // not aligned to the element size, in which case it is copied into an allocated buffer.
  Tensor load(const std::string& name) const;
  // As load(name), converted to `want` (into a new buffer) when the stored dtype differs.
  Tensor load(const std::string& name, DType want) const;
  // Rows (dim 0) or columns (dim 1) [start, start+length) of a 2-D tensor, or rows of a 1-D one,
  // read with pread() (one read for rows, one per row for columns) into a new buffer, converted
  // to `want`.
  Tensor load_slice(const std::string& name, int dim, int64_t start, int64_t length,
                    DType want) const;

  // The mapped bytes (whole file), so callers and tests can tell zero-copy tensors apart.
  std::span<const std::byte> mapped_range() const { return file_.bytes(); }

 private:
  void parse_header();
  // The tensor's kiln dtype; throws naming it when kiln has none (F64, I8, ...).
  DType supported_dtype(const TensorInfo& ti, const std::string& name) const;

  MappedFile file_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint that may be split into shards. Opens one of:
//   - a single "*.safetensors" file;
//   - a "*.safetensors.index.json" ({"metadata": {...}, "weight_map": {tensor: shard file}});
//   - a directory holding diffusion_pytorch_model.safetensors.index.json,
//     model.safetensors.index.json, or exactly one "*.safetensors" file.
// Shard names follow io/relative_name.h (not empty, no "..", not absolute) and are opened as
// index folder / name: symlinks are followed wherever they lead (a Hugging Face hub cache).
// Shards are opened on first use, once; methods are safe to call from several threads.
class SafetensorsIndex {
 public:
  explicit SafetensorsIndex(const std::filesystem::path& path);
  ~SafetensorsIndex();
  SafetensorsIndex(const SafetensorsIndex&) = delete;
  SafetensorsIndex& operator=(const SafetensorsIndex&) = delete;

  // The file that was opened: the index JSON, or the single safetensors file.
  const std::filesystem::path& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted by name
  bool contains(const std::string& name) const;
  TensorInfo info(const std::string& name) const;
  // For an index: its "metadata" (non-string values as JSON text); else the file's metadata.
  const std::map<std::string, std::string>& metadata() const;
  // The shard file holding `name`.
  std::filesystem::path shard_path(const std::string& name) const;

  Tensor load(const std::string& name) const;
  Tensor load(const std::string& name, DType want) const;
  Tensor load_slice(const std::string& name, int dim, int64_t start, int64_t length,
                    DType want) const;

 private:
  void open_index(const std::filesystem::path& index_path);
  const SafetensorsFile& shard_for(const std::string& name) const;

  std::filesystem::path path_;
  std::map<std::string, std::string> weight_map_;  // tensor -> shard name; empty for one file
  std::map<std::string, std::string> metadata_;
  std::map<std::string, std::filesystem::path> shard_paths_;  // shard name -> folder / name
  mutable std::mutex mu_;
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
  std::unique_ptr<SafetensorsFile> single_;
};

// Writes `tensors` (in this order, contiguous, no gaps) with an 8-byte aligned data section.
// Tensors must be contiguous CPU tensors whose values are already computed: the writer reads
// data_ptr() directly, so the caller syncs any pending device work first. The file is written
// to a temporary name in the same folder and renamed into place, so on error no partial file
// is left at `path`.
void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The safetensors dtype string of a kiln dtype ("F32", "BF16", ...).
const char* safetensors_dtype_name(DType t);

}  // namespace kiln::io
