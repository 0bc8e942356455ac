// The CUDA device's kernels by op name, and what each takes (DeviceRuntime::supports).
#pragma once
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "devices/runtime.h"

namespace kiln::cuda {

struct CudaKernel {
  KernelFn run = nullptr;
  // Whether it takes inputs like these; null: any input whose dtype generated code loads.
  std::function<bool(const std::vector<OperandMeta>&)> takes;
};
using KernelTable = std::unordered_map<std::string, CudaKernel>;

// Every CUDA kernel (built once; needs no GPU).
const KernelTable& cuda_kernels();

void add_elementwise_kernels(KernelTable& table);
void add_contraction_kernels(KernelTable& table);
void add_builtin_kernels(KernelTable& table);  // norms, softmax, reductions, movement, factories, sdpa, conv2d

}  // namespace kiln::cuda
