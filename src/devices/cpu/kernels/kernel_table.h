// The CPU device's op -> kernel table; each kernel family file adds its entries.
#pragma once
#include <string>
#include <unordered_map>

#include "devices/runtime.h"

namespace kiln::cpu {

using KernelTable = std::unordered_map<std::string, KernelFn>;

void add_elementwise_kernels(KernelTable& table);
void add_reduction_kernels(KernelTable& table);
void add_movement_kernels(KernelTable& table);
void add_contraction_kernels(KernelTable& table);
void add_collective_kernels(KernelTable& table);

}  // namespace kiln::cpu
