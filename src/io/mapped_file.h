// A checkpoint file opened read-only and mapped whole: what the safetensors and GGUF readers
// (io/safetensors.h, io/gguf.h) share below their header parsing. It owns the descriptor that
// slice loads pread() from and the mapping that zero-copy tensors keep alive, and loads a
// tensor from its byte range: whole (a view into the mapping, or an aligned copy), converted to
// another dtype, or as a row or column slice.
//
// Errors are kiln::Error "[<where>] <file>: ...", <where> being the format ("safetensors",
// "gguf"), so a reader's messages read the same whether they come from here or its parser.
// Truncating or rewriting a file while it is mapped is not supported (the OS may SIGBUS).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace kiln::io {

// Bytes brought in from checkpoint files, process wide: a slice load counts the bytes it
// pread()s, a full load counts the tensor's stored size (zero-copy or not).
uint64_t bytes_read();
void reset_bytes_read();
void count_bytes_read(uint64_t bytes);
// The part of bytes_read() the calling thread read since it started: one in-process
// tensor-parallel rank's reads (distributed/local_ranks.h). Not reset by reset_bytes_read().
uint64_t bytes_read_by_this_thread();

class MappedFile {
 public:
  // Opens and maps `path` (an empty file is opened but not mapped: bytes() is empty, and the
  // format's parser reports it as truncated). Throws naming the file when it cannot be opened,
  // is not a regular file or cannot be mapped.
  MappedFile(const std::filesystem::path& path, const char* where);
  ~MappedFile();
  MappedFile(MappedFile&&) noexcept;
  MappedFile& operator=(MappedFile&&) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The mapped bytes (the whole file; empty for an empty or moved-from file).
  std::span<const std::byte> bytes() const;
  uint64_t size() const { return bytes().size(); }

  // "[<where>] <file>: <parts...>"
  template <typename... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    kiln::fail(where_, path_.string(), ": ", parts...);
  }

  // The tensor whose bytes start at `byte_begin`, on kiln::Device::cpu(): a read-only view into
  // the mapping (which stays alive as long as the tensor does), or a copy when its address is
  // not aligned for `dtype` (kernels read through typed pointers). Counted in bytes_read().
  Tensor view(uint64_t byte_begin, const Shape& shape, DType dtype) const;
  // As view(), converted to `want` (into a new buffer) when `dtype` differs.
  Tensor load(uint64_t byte_begin, const Shape& shape, DType dtype, DType want) const;
  // Rows (dim 0) or columns (dim 1) [start, start+length) of a 2-D tensor, or elements of a 1-D
  // one (dim 0), read with pread() (one read for rows, one per row for columns) into a new
  // buffer, converted to `want`. Of a block type, columns and 1-D elements must start and end
  // on block boundaries. `what` names the tensor in errors ("tensor 'name'").
  Tensor load_slice(uint64_t byte_begin, const Shape& shape, DType dtype, const std::string& what,
                    int dim, int64_t start, int64_t length, DType want) const;
  // Reads exactly `bytes` bytes at file offset `offset` (counted in bytes_read()); errors name
  // `what` and say whether the read failed or the file ended early.
  void pread_exact(void* dst, size_t bytes, uint64_t offset, const std::string& what) const;

 private:
  struct Mapping;

  std::filesystem::path path_;
  const char* where_;
  int fd_ = -1;
  std::shared_ptr<Mapping> mapping_;  // shared with the zero-copy tensors' buffers
};

}  // namespace kiln::io
