// PretrainedTransformer: what a diffusion transformer class declares once and exposes the way
// every one does, as Diffusers' ModelMixin subclasses get it from class attributes: its class
// name (Model::kClassName), _repeated_blocks (the Diffusers class names of `RepeatedBlocks`),
// from_pretrained with and without tensor parallelism, and its config. A model derives from
// PretrainedTransformer<Model, Config, Block...> and keeps only its declarations and forward.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "distributed/tensor_parallel.h"
#include "nn/diffusion_transformer.h"

namespace kiln::nn {

template <typename Model, typename Config, typename... RepeatedBlocks>
class PretrainedTransformer : public DiffusionTransformer {
 public:
  const char* class_name() const override { return Model::kClassName; }
  // Diffusers' _repeated_blocks: the block classes compile_repeated_blocks compiles one by one.
  static const std::vector<std::string>& repeated_blocks() {
    static const std::vector<std::string> names{RepeatedBlocks::kClassName...};
    return names;
  }
  const std::vector<std::string>& repeated_block_classes() const override { return repeated_blocks(); }

  // Checkpoint keys the model leaves unread on purpose: none (the pipeline loader's audit refuses
  // any other unread tensor).
  static std::vector<std::string> checkpoint_keys_not_loaded() { return {}; }
  // `dir` is the transformer folder (config.json and diffusion_pytorch_model*.safetensors);
  // `dtype` is torch_dtype, the dtype its weights are held and computed in (std::nullopt: "auto",
  // the checkpoint's).
  static Model from_pretrained(const std::filesystem::path& dir, std::optional<DType> dtype = DType::f32) {
    return load_pretrained<Model>(dir, dtype);
  }
  // Tensor parallel: this rank loads (and reads from disk) only its shard of every planned
  // weight. Errors before any load when the mesh does not divide the heads or a planned width.
  static Model from_pretrained(const std::filesystem::path& dir, const TensorParallelConfig& tp,
                               std::optional<DType> dtype = DType::f32) {
    return load_pretrained<Model>(dir, dtype, &tp);
  }

  const Config& config() const { return config_; }

 protected:
  explicit PretrainedTransformer(Config config) : config_(std::move(config)) {}

  Config config_;
};

}  // namespace kiln::nn
