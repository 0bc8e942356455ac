#include "nn/component_load.h"

namespace kiln::nn {

ComponentLoad::ComponentLoad(std::shared_ptr<const WeightSource> replacement, std::optional<DType> quantization)
    : replacement_(std::move(replacement)), quantization_(quantization) {}

}  // namespace kiln::nn
