// How the model component being built on this thread gets its weights, when the pipeline loader
// says more than "its folder": a checkpoint file that replaces the folder's weights (--transformer
// FILE, a GGUF or single-file checkpoint; the config still comes from the folder) and a
// quantization for its linear weights (--quantize). A model's from_pretrained opens its folder
// with nn::Weights(dir); while a ComponentLoad is alive on the thread, that Weights reads the
// replacement and carries the quantization instead. Scopes nest like CheckpointAudit.
#pragma once
#include <memory>
#include <optional>

#include "core/dtype.h"
#include "core/thread_scope.h"
#include "nn/weight_source.h"

namespace kiln::nn {

class ComponentLoad : public ThreadScope<ComponentLoad> {
 public:
  ComponentLoad(std::shared_ptr<const WeightSource> replacement, std::optional<DType> quantization);
  static const ComponentLoad* active() { return current(); }

  const std::shared_ptr<const WeightSource>& replacement() const { return replacement_; }
  std::optional<DType> quantization() const { return quantization_; }

 private:
  std::shared_ptr<const WeightSource> replacement_;
  std::optional<DType> quantization_;
};

}  // namespace kiln::nn
