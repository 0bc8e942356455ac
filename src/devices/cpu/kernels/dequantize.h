// SIMD row decoders for the quantized storage types (fp8, ggml q8_0 / q4_0 / q4_k / q5_k; layouts
// and reference in core/quant_blocks.h): what the quantized linears (linear_gemm.h's
// `linear_quantized`, gemv.h) decode weight rows with. Each gives exactly the bits of the scalar
// reference kiln::dequantize_to_f32 / dequantize_to_bf16 on any bytes, NaN and infinite scales
// included (tests/test_dequantize_kernels.cc).
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

// `n` elements of storage type `t` (for a block type a whole number of blocks, `src` at a block
// boundary) as f32 / as bf16 (each value's f32 rounded to nearest even). Throws kiln::Error, as
// the reference does, for another type or a partial block. One thread; callers parallelise rows.
void dequantize_row_f32(DType t, const void* src, float* dst, int64_t n);
void dequantize_row_bf16(DType t, const void* src, uint16_t* dst, int64_t n);

}  // namespace kiln::cpu::KILN_CPU_LEVEL
