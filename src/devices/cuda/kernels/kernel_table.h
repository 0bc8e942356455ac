// The CUDA device's kernels by op name (devices/kernel_table.h); a kernel without `takes` takes
// any input whose dtype generated code loads.
#pragma once
#include "devices/kernel_table.h"

namespace kiln::cuda {

// Every CUDA kernel (built once; needs no GPU).
const KernelTable& cuda_kernels();

void add_elementwise_kernels(KernelTable& table);
void add_contraction_kernels(KernelTable& table);
void add_builtin_kernels(KernelTable& table);  // norms, softmax, reductions, movement, factories, sdpa, conv2d

}  // namespace kiln::cuda
