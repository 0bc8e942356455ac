// Named tensors already in memory as a WeightSource (a model's named_parameters() to write in
// another layout, tests' hand-made checkpoints). Stored dtype = each tensor's dtype; a load in
// another dtype converts.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "nn/weight_source.h"

namespace kiln::nn {

class TensorMapSource final : public WeightSource {
 public:
  explicit TensorMapSource(std::map<std::string, Tensor> tensors, std::string what = "(tensors in memory)");
  std::string describe() const override { return what_; }
  bool contains(const std::string& key) const override { return tensors.count(key) != 0; }
  Shape shape(const std::string& key) const override;
  std::optional<DType> stored_dtype(const std::string& key) const override;
  Tensor load(const std::string& key, DType dtype) const override;
  std::vector<std::string> names() const override;

  std::map<std::string, Tensor> tensors;

 private:
  const Tensor& at(const std::string& key) const;
  std::string what_;
};

}  // namespace kiln::nn
