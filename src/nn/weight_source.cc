#include "nn/weight_source.h"

#include "io/safetensors.h"

namespace kiln::nn {

namespace {

class SafetensorsSource final : public WeightSource {
 public:
  explicit SafetensorsSource(const std::filesystem::path& path) : index_(path) {}
  std::string describe() const override { return index_.path().string(); }
  bool contains(const std::string& key) const override { return index_.contains(key); }
  Shape shape(const std::string& key) const override { return index_.info(key).shape; }
  Tensor load(const std::string& key, DType dtype) const override { return index_.load(key, dtype); }

 private:
  io::SafetensorsIndex index_;
};

}  // namespace

std::shared_ptr<const WeightSource> open_checkpoint(const std::filesystem::path& path) {
  return std::make_shared<const SafetensorsSource>(path);
}

}  // namespace kiln::nn
