// Activation functions by their transformers ACT2FN / Diffusers names ("gelu" is the exact
// erf form; "gelu_new" and "gelu_pytorch_tanh" the tanh approximation), so models can take
// them straight from a config field.
#pragma once
#include <string>

#include "core/tensor.h"

namespace kiln::nn {

bool is_known_activation(const std::string& name);
// Throws "[activation] unsupported activation 'name'" for other names.
Tensor activation(const std::string& name, const Tensor& x);
// fp16 activations clamped to the finite range (±65504) after a block, as Diffusers does; other
// dtypes as they are.
Tensor clamp_fp16(const Tensor& x);

}  // namespace kiln::nn
