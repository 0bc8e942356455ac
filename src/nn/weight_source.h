// Where a model's parameters come from. Models read them through nn::Weights, which talks to
// a WeightSource: a safetensors checkpoint (file, shard index or folder) in normal use, or
// any other provider of named tensors (generated test weights; later, a rank's shard).
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace kiln::nn {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual std::string describe() const = 0;  // names the source in errors (a path)
  virtual bool contains(const std::string& key) const = 0;
  virtual Shape shape(const std::string& key) const = 0;  // key must exist
  virtual Tensor load(const std::string& key, DType dtype) const = 0;
  // Rows (dim 0) or columns (dim 1) [start, start+length) of a 2-D tensor, or rows of a 1-D
  // one (tensor parallelism: a rank's shard). The default loads the whole tensor and copies the
  // slice; a checkpoint reads only the slice's bytes.
  virtual Tensor load_slice(const std::string& key, int dim, int64_t start, int64_t length, DType dtype) const;
};

// A safetensors checkpoint: a file, a *.safetensors.index.json, or a folder holding one.
std::shared_ptr<const WeightSource> open_checkpoint(const std::filesystem::path& path);

}  // namespace kiln::nn
