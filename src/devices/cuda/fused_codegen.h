// CUDA C source for the fused elementwise programs of graph/fused_program.h, compiled at run time
// with NVRTC (devices/cuda/nvrtc.h). Pure text generation: it needs no GPU, so its output is
// compiled in the CPU test suite.
//
// A generated kernel is a grid-stride loop over the output's elements. Each element's index is
// split by the output shape; every input is read at its strides (0 where it broadcasts), loaded
// into f32, the program's instructions run on f32 registers with the formulas of the CPU kernels
// (devices/cpu/kernels/elementwise_math.cc), and the result is stored in the output's dtype.
// Its parameters, in order: long long n; KilnDims shape; int rank; void* out; then per input
// (const void* data, KilnDims strides).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "graph/fused_program.h"

namespace kiln::cuda {

inline constexpr int kMaxRank = 8;  // KilnDims holds this many dims

// Device functions every generated source starts with: KilnDims, bf16/f16 conversions as the
// CPU's (core/dtype.h), kiln_ld/kiln_st (an element of a runtime dtype, int(DType), as f32).
extern const char* const kKernelPrelude;

// The dtypes a generated kernel loads and stores.
bool codegen_supports(DType t);

// A 64-bit FNV-1a hash of `text` in hexadecimal: names kernels by their source, and cached code
// by source, compiler and architecture.
std::string text_hash(const std::string& text);

struct KernelSource {
  std::string name;    // the kernel's extern "C" name, unique to its source ("kiln_fused_<hash>")
  std::string source;  // the whole translation unit
};

// The kernel computing `program` over inputs of `inputs` dtypes into an output of dtype `out`.
// Throws "[fused] ..." for an invalid program or a dtype codegen_supports() refuses.
KernelSource fused_kernel_source(const FusedProgram& program, const std::vector<DType>& inputs, DType out);

// A strided copy of elements of `element_bytes` (1, 2, 4 or 8) into a dense output, bit for bit;
// the parameters of a one-input fused kernel.
KernelSource strided_copy_source(size_t element_bytes);

// A cast between integer (or bool) dtypes, exact (through long long, not f32): the parameters of a
// one-input fused kernel.
KernelSource integer_cast_source(DType from, DType to);

}  // namespace kiln::cuda
