// The CPU device's kernel families, each adding its entries to the table (devices/kernel_table.h).
#pragma once
#include "devices/kernel_table.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

void add_elementwise_kernels(KernelTable& table);
void add_reduction_kernels(KernelTable& table);
void add_movement_kernels(KernelTable& table);
void add_contraction_kernels(KernelTable& table);
void add_collective_kernels(KernelTable& table);

}  // namespace kiln::cpu::KILN_CPU_LEVEL
