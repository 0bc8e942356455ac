#include "nn/weights.h"

#include "core/error.h"

namespace kiln::nn {

Weights::Weights(const std::filesystem::path& checkpoint)
    : index_(std::make_shared<const io::SafetensorsIndex>(checkpoint)) {}

Weights::Weights(std::shared_ptr<const io::SafetensorsIndex> index, std::string prefix)
    : index_(std::move(index)), prefix_(std::move(prefix)) {}

Weights Weights::sub(const std::string& name) const { return Weights(index_, prefix_ + name + "."); }

bool Weights::has(const std::string& name) const { return index_ && index_->contains(key(name)); }

Tensor Weights::get(const std::string& name, const Shape& shape, DType dtype) const {
  KILN_CHECK(index_ != nullptr, "weights", "no checkpoint loaded for '", key(name), "'");
  const std::string k = key(name);
  KILN_CHECK(index_->contains(k), "weights", index_->path().string(), ": tensor '", k,
             "' is missing (the model's config expects it with shape ", to_string(shape), ")");
  const io::TensorInfo info = index_->info(k);
  KILN_CHECK(info.shape == shape, "weights", index_->path().string(), ": tensor '", k, "' has shape ",
             to_string(info.shape), " but the config implies ", to_string(shape));
  return index_->load(k, dtype);
}

}  // namespace kiln::nn
