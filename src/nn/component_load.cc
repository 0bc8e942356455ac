#include "nn/component_load.h"

namespace kiln::nn {

namespace {
thread_local const ComponentLoad* t_active = nullptr;
}  // namespace

ComponentLoad::ComponentLoad(std::shared_ptr<const WeightSource> replacement, std::optional<DType> quantization)
    : replacement_(std::move(replacement)), quantization_(quantization), previous_(t_active) {
  t_active = this;
}

ComponentLoad::~ComponentLoad() { t_active = previous_; }

const ComponentLoad* ComponentLoad::active() { return t_active; }

}  // namespace kiln::nn
