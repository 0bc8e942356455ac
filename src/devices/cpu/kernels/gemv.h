// Single-row linear layers (y = x W^T + b with one row of x): the timestep/guidance/text
// embedders and every block's modulation projection of a DiT. They are weight-streaming
// (memory-bound) products, so kiln runs them with its own kernel: each output column is one
// dot product computed entirely by one thread in a fixed order, so a column's bits never depend
// on the thread count or on which other columns share the call. That is what lets deferred and
// compiled modes run several such linears that read the same row as ONE launch (a grouped GEMV,
// graph/fusion.h) with results identical to strict eager's one-launch-per-linear.
//
// Weights are read in their stored dtype, f32 or bf16: a bf16 row is widened to f32 in
// registers, so the product streams half the bytes and no f32 copy of the weight is ever made.
// bf16 x bf16 products are exact in f32, so a bf16 column is the f32 kernel's column on the
// widened values, bit for bit, before its one rounding to the output dtype.
#pragma once
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "devices/runtime.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

// One single-row product: y[j] = dot(x, w[j, :]) + bias[j] for j < n; w is [n, k] row-major
// (a PyTorch Linear weight); bias may be null. w, bias and y are each f32 or bf16 (the *_type
// fields); the sum is f32 and rounded once into y's dtype.
struct RowProduct {
  const void* w;
  const void* bias;
  void* y;
  int64_t n;
  DType w_type = DType::f32, bias_type = DType::f32, y_type = DType::f32;
};

// Runs every product (all with the same x of length k, f32 or bf16) in one parallel pass over
// all their output columns.
void gemv_rows(const void* x, DType x_type, int64_t k, const std::vector<RowProduct>& products);
inline void gemv_rows(const float* x, int64_t k, const std::vector<RowProduct>& products) {
  gemv_rows(x, DType::f32, k, products);
}

// The linear kernel's single-row path over tensors: every element is one linear's arguments
// (x, w[, bias]) -> out, all with the same one-row x; f32 and bf16 operands are read as they are,
// other float dtypes through f32 copies. Strict eager calls it with one linear, a grouped launch
// with all of them.
void grouped_linear_rows(const std::vector<KernelArgs>& linears);

}  // namespace kiln::cpu::KILN_CPU_LEVEL
