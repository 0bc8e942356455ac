// Writing safetensors files whose tensors are never held in memory: the header (every name,
// dtype, shape and offset) is written first, then each tensor's bytes are produced in chunks by
// a caller's function and written straight to the file. For checkpoints of many gigabytes
// (kiln make-random writes FLUX.1's 24 GB transformer this way); save_safetensors
// (io/safetensors.h) writes tensors that already exist.
//
// The file layout is save_safetensors': an 8-byte aligned data section, tensors in the given
// order with no gaps. The file is written to a temporary `.NAME.tmp.PID.N` next to `path`,
// fsynced and renamed into place, so on any error no partial file is left at `path`.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"

namespace kiln::io {

struct StreamedTensor {
  std::string name;
  // f32, bf16 or f16: the writer rounds fill's f32 values to it; i32 or i64: truncates them
  // (integers up to 2^24 are exact), e.g. a BatchNorm's num_batches_tracked.
  DType dtype = DType::f32;
  Shape shape;
  // Writes elements [begin, begin + count) of the row-major tensor to `dst` as f32. Called from
  // several threads at once, on disjoint ranges, in no particular order: it must depend on
  // nothing but its arguments for the file to be the same whatever the thread count.
  // Null: the tensor's bytes are a hole in the file (reading as zeros, taking no disk space): a
  // layout-only checkpoint, whose shapes are all that is wanted (kiln plan).
  std::function<void(int64_t begin, int64_t count, float* dst)> fill;

  uint64_t nbytes() const { return uint64_t(numel(shape)) * dtype_size(dtype); }
};

// The file size write_safetensors_streamed gives these tensors (header and data).
uint64_t streamed_file_bytes(const std::vector<StreamedTensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {});

// Writes the file (see above) and returns its size in bytes. Errors name `path` and, for a bad
// entry, the tensor.
uint64_t write_safetensors_streamed(const std::filesystem::path& path, const std::vector<StreamedTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata = {});

}  // namespace kiln::io
