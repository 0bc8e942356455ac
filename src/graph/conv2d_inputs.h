// Where conv2d's inputs sit, read the same way by the op's inference and reference
// (graph/ops/contraction_ops.cc) and by every device's kernel: [x, weight, bias?, residual?], the
// residual last when the attribute `residual` is 1.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/attrs.h"

namespace kiln {

struct Conv2dInputs {
  bool bias = false;      // input 2 is the bias
  bool residual = false;  // the last input is the residual
};

// For a conv2d of `count` inputs (at least x and weight) and attributes `attrs`.
inline Conv2dInputs conv2d_inputs(size_t count, const Attrs& attrs) {
  const bool residual = attrs.get_int("residual", 0) != 0;
  return {count - (residual ? 1 : 0) > 2, residual};
}

// One output dim of a convolution: `in` padded by `pad` on both sides, windows of `kernel` taken
// `stride` apart, a trailing part window dropped (as PyTorch does).
inline int64_t conv2d_out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
  return (in + 2 * pad - kernel) / stride + 1;
}

}  // namespace kiln
