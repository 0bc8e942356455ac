// A GGUF file (io/gguf.h) as a WeightSource: what nn::open_checkpoint opens for a path ending
// in ".gguf" or a file starting with the magic "GGUF". Tensors keep their stored dtype (stored_dtype says which: f32, f16, bf16, i32,
// i64 or a block type), loads are zero-copy views when no conversion is asked for, and slices
// read only their bytes.
#pragma once
#include <filesystem>
#include <memory>

#include "nn/weight_source.h"

namespace kiln::nn {

// Opens and validates the file (kiln::Error naming it on any problem).
std::shared_ptr<const WeightSource> open_gguf_source(const std::filesystem::path& path);

}  // namespace kiln::nn
