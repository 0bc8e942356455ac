// Writing GGUF files (version 3; layout in io/gguf.h). Tensors are streamed: the header (every
// name, type, shape and offset) is written first, then each tensor's bytes, taken from a kiln
// Tensor or produced piece by piece by a caller's function (kiln convert quantizes a transformer
// a weight at a time), so the file is never held in memory.
//
// The file is written as every kiln output is (io/output_file.h): to a temporary next to the
// target, fsynced and renamed into place, so on any error no partial file is left at `path` and
// what was there is untouched.
//
// Every tensor starts at a multiple of the alignment (32 unless given; general.alignment is
// written when it differs) and is padded with zeros to the next multiple, as ggml and gguf-py
// write them. Shapes are kiln's (outermost first) and are written reversed (ggml's innermost-first
// dims); a block type's innermost dim must be a multiple of its block size.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/gguf.h"

namespace kiln::io {

class GgufWriter {
 public:
  // Hands the next `bytes` bytes of a tensor to the file.
  using Emit = std::function<void(const void* data, size_t bytes)>;
  // Produces a tensor's bytes, in order, through `emit`, in pieces of any size that add up to
  // the tensor's size (checked: too few or too many is an error naming the tensor).
  using Producer = std::function<void(const Emit& emit)>;

  // Nothing is written before write(). `alignment`: a nonzero power of two.
  explicit GgufWriter(std::filesystem::path path, uint32_t alignment = 32);

  // Sets (or replaces) a metadata entry. general.alignment comes from the constructor: setting
  // it to anything but that u32 is an error. Array items must all be of the array's type.
  void set_metadata(const std::string& key, GgufValue value);
  void set_metadata(const GgufMetadata& metadata);

  // A contiguous CPU tensor whose value is computed (the writer reads data_ptr(); the caller
  // syncs pending device work first), kept by reference until write(). Its dtype must have a
  // ggml type (not bool or fp8).
  void add_tensor(const std::string& name, const Tensor& t);
  // A tensor of `dtype` and `shape` whose bytes `produce` writes during write().
  void add_tensor(const std::string& name, DType dtype, const Shape& shape, Producer produce);

  // The size write() gives the file.
  uint64_t file_bytes() const;
  // Writes the file (metadata in key order, tensors in the order added) and returns its size.
  uint64_t write();

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t nbytes;
    Producer produce;
  };
  void check_tensor(const std::string& name, DType dtype, const Shape& shape) const;
  std::string header() const;

  std::filesystem::path path_;
  uint32_t alignment_;
  GgufMetadata metadata_;
  std::vector<Entry> tensors_;
};

// The common case: `tensors` (contiguous CPU tensors with computed values) and `metadata`.
// Returns the file's size.
uint64_t write_gguf(const std::filesystem::path& path, const GgufMetadata& metadata,
                    const std::vector<std::pair<std::string, Tensor>>& tensors,
                    uint32_t alignment = 32);

}  // namespace kiln::io
