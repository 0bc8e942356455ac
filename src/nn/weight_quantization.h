// Quantizing float weights at load (--quantize, kiln convert): what nn::Weights does to linear
// weights when a quantization is set.
#pragma once
#include "core/tensor.h"

namespace kiln::nn {

// `w` (a float [N,K] matrix on the host, K a whole number of `type`'s blocks) quantized into
// storage type `type`, row by row over the threads, in a new host buffer. The f32 values of a row
// exist only while that row is quantized.
Tensor quantize_weight(const Tensor& w, DType type);

}  // namespace kiln::nn
