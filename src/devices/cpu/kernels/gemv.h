// Single-row linear layers (y = x W^T + b with one row of x): the timestep/guidance/text
// embedders and every block's modulation projection of a DiT. They are weight-streaming
// (memory-bound) products, so kiln runs them with its own kernel: each output column is one
// dot product computed entirely by one thread in a fixed order, so a column's bits never depend
// on the thread count or on which other columns share the call. That is what lets deferred and
// compiled modes run several such linears that read the same row as ONE launch (a grouped GEMV,
// graph/fusion.h) with results identical to strict eager's one-launch-per-linear.
#pragma once
#include <cstdint>
#include <vector>

#include "devices/runtime.h"

namespace kiln::cpu {

// One single-row product: y[j] = dot(x, w[j, :]) + bias[j] for j < n; w is [n, k] row-major
// (a PyTorch Linear weight); bias may be null.
struct RowProduct {
  const float* w;
  const float* bias;
  float* y;
  int64_t n;
};

// Runs every product (all with the same x of length k) in one parallel pass over all their
// output columns.
void gemv_rows(const float* x, int64_t k, const std::vector<RowProduct>& products);

// The linear kernel's single-row path over tensors: every element is one linear's arguments
// (x, w[, bias]) -> out, all with the same one-row x; any float dtypes (computed in f32). Strict
// eager calls it with one linear, a grouped launch with all of them.
void grouped_linear_rows(const std::vector<KernelArgs>& linears);

}  // namespace kiln::cpu
