// Which build of the CPU kernels a file belongs to. A portable build (-DKILN_NATIVE=OFF) compiles
// this folder once per instruction-set level (x86-64-v2, -v3, -v4, AVX-512 with BF16),
// each copy in its own inline namespace kiln::cpu::<level> so the copies link side by side, and
// the CPU device runs the most capable copy the processor allows (devices/cpu/kernel_set.h). A
// native build compiles one copy, kiln::cpu::native, for the building machine.
//
// Code outside this folder reaches the kernels through the device's CpuKernelSet; a file that
// calls a kernel directly (a test, a benchmark) calls the copy KILN_CPU_LEVEL names for it.
#pragma once

#ifndef KILN_CPU_LEVEL
#define KILN_CPU_LEVEL native
#define KILN_CPU_LEVEL_NAME "native"
#endif
