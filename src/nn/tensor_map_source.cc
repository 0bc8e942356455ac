#include "nn/tensor_map_source.h"

#include "core/error.h"
#include "exec/ops.h"

namespace kiln::nn {

TensorMapSource::TensorMapSource(std::map<std::string, Tensor> t, std::string what)
    : tensors(std::move(t)), what_(std::move(what)) {}

const Tensor& TensorMapSource::at(const std::string& key) const {
  const auto it = tensors.find(key);
  KILN_CHECK(it != tensors.end(), "weights", what_, ": no tensor '", key, "'");
  return it->second;
}

Shape TensorMapSource::shape(const std::string& key) const { return at(key).shape(); }
std::optional<DType> TensorMapSource::stored_dtype(const std::string& key) const { return at(key).dtype(); }

Tensor TensorMapSource::load(const std::string& key, DType dtype) const {
  const Tensor& t = at(key);
  return t.dtype() == dtype ? t : contiguous(cast(t, dtype));
}

std::vector<std::string> TensorMapSource::names() const {
  std::vector<std::string> out;
  for (const auto& [k, t] : tensors) out.push_back(k);
  return out;
}

}  // namespace kiln::nn
