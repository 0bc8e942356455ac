// Quantizing float weights at load (--quantize, kiln convert): what nn::Weights does to linear
// weights when a quantization is set.
#pragma once
#include <string>

#include "core/tensor.h"

namespace kiln::nn {

// fp8 has no per-block scale of its own, so a weight is stored as W / s with one f32 scale s per
// tensor that maps its largest magnitude `amax` onto the format's largest finite value (448 for
// e4m3, 57344 for e5m2), as scaled-fp8 checkpoints do: weights of magnitude ~0.02 would
// otherwise fall among e4m3's subnormals. 1 for the block types (their blocks carry scales) and
// for an all-zero weight.
float quantization_scale(DType type, float amax);

// `w` (a float [N,K] matrix on the host, K a whole number of `type`'s blocks) divided by `scale`
// and quantized into storage type `type`, row by row over the threads, in a new host buffer.
// `what` names the weight in errors (a non-finite value cannot be block-quantized).
Tensor quantize_weight(const Tensor& w, DType type, float scale = 1.0f, const std::string& what = "weight");

// The largest |value| of a float tensor on the host.
float max_abs(const Tensor& w);

}  // namespace kiln::nn
