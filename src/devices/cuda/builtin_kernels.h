// The CUDA kernels of the ops that are not elementwise (norms, softmax, reductions, movement,
// factories, attention, convolution): one CUDA C translation unit compiled with NVRTC once per
// device (and cached on disk), each op an extern "C" entry taking runtime dtype codes
// (int(DType)), so one kernel serves f32, bf16 and f16. They read and write through kiln_ld /
// kiln_st and accumulate in f32, as the CPU kernels do. Straightforward first versions: one
// block per row, group, output element or query row; attention and convolution without tiling.
#pragma once
#include "devices/cuda/fused_codegen.h"

namespace kiln::cuda {

// The translation unit; its name is a hash of the source.
const KernelSource& builtin_kernels();

// Its entries, for tests that check the compiled code holds each.
const char* const* builtin_kernel_entries();  // null-terminated

}  // namespace kiln::cuda
