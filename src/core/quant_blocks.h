// Quantized storage types (core/dtype.h): fp8 (torch's float8_e4m3fn and float8_e5m2) and the
// ggml block types q8_0, q4_0, q4_k, q5_k, with the block layouts of the GGUF specification
// (ggml's block_q8_0, block_q4_0, block_q4_K, block_q5_K; little-endian f16 scales).
//
// This is the scalar reference implementation (plain C++): the conversions core needs
// (convert_to_f32, load_as_double) and quantization at load. Linears hold weights in these types
// as stored and dequantize a panel of rows at a time into the GEMM's operand type
// (`linear_quantized`, devices/cpu/kernels/linear_gemm.h), never the whole weight, with the SIMD
// row decoders of devices/cpu/kernels/dequantize.h, which give exactly these functions' bits.
// Dequantization is exact arithmetic on the stored values (f16 scales times small integers, in
// f32, as ggml computes them), so it gives the same f32 values as ggml's and gguf-py's.
// Quantization (--quantize, kiln convert) follows ggml's reference quantizers.
#pragma once
#include <bit>
#include <cstdint>

#include "core/dtype.h"

namespace kiln {

float f8_e4m3_to_f32(uint8_t v);
float f8_e5m2_to_f32(uint8_t v);
// Round to nearest, ties to even, as torch's .to(torch.float8_e4m3fn / float8_e5m2) does:
// e4m3fn has no inf, so magnitudes beyond its largest finite value (inf included) saturate to
// +-448; e5m2 rounds them to +-inf as IEEE formats do; every NaN becomes 0x7f (0xff if negative).
uint8_t f32_to_f8_e4m3(float f);
uint8_t f32_to_f8_e5m2(float f);

// `n` elements of storage type `t` (fp8 or a block type; for a block type n is a whole number
// of blocks and `src` points at a block boundary) as f32 / as bf16 (each value rounded to
// nearest even from its f32 value).
void dequantize_to_f32(DType t, const void* src, float* dst, int64_t n);
void dequantize_to_bf16(DType t, const void* src, uint16_t* dst, int64_t n);
// Quantizes `n` f32 values (a whole number of blocks) into type `t`, as ggml's reference
// quantizers (quantize_row_*_ref) do; for a block type every value must be finite.
void quantize_from_f32(DType t, const float* src, void* dst, int64_t n);

// Throws kiln::Error (op `where`) unless `t` is a storage type and `n` a whole number of its
// blocks: the check every entry point above makes, and the cpu row decoders make too.
void check_storage_count(const char* where, DType t, int64_t n);

}  // namespace kiln

// Shared by core/quant_blocks.cc, core/quant_k_blocks.cc and the cpu row decoders
// (devices/cpu/kernels/dequantize.cc).
namespace kiln::quant_detail {
// ggml's q4_K / q5_K quantizers for `blocks` whole 256-element blocks (not checked).
void quantize_q4_k(const float* src, uint8_t* dst, int64_t blocks);
void quantize_q5_k(const float* src, uint8_t* dst, int64_t blocks);

// A block's little-endian f16 scale at p as f32 (as kiln::f16_to_f32, NaN payloads included),
// inline and branch-light: one call per 32 elements. Subnormals are renormalised by subtracting
// two normal floats, so flush-to-zero modes do not matter.
inline float f16_scale(const uint8_t* p) {
  const uint32_t h = uint32_t(p[0]) | uint32_t(p[1]) << 8;
  uint32_t o = (h & 0x7fffu) << 13;
  const uint32_t exp = o & 0x0f800000u;
  o += uint32_t(127 - 15) << 23;
  float f;
  if (exp == 0x0f800000u) {  // inf / NaN
    o += uint32_t(128 - 16) << 23;
    f = std::bit_cast<float>(o);
  } else if (exp == 0) {  // zero / subnormal: (1 + m * 2^-10) * 2^-14 - 2^-14
    f = std::bit_cast<float>(o + (1u << 23)) - std::bit_cast<float>(uint32_t(113) << 23);
  } else {
    f = std::bit_cast<float>(o);
  }
  return (h & 0x8000u) ? -f : f;
}

// Sub-block j's 6-bit scale and min from a k-quant block's 12 packed bytes: sub-blocks 0..3 keep
// theirs in the low 6 bits of bytes j (scale) and j+4 (min); sub-blocks 4..7 keep their low 4 bits
// in byte j+4 (scale low, min high) and their top 2 bits in the top bits of bytes j-4 (scale) and
// j (min).
inline void k_scale_min(const uint8_t* packed, int j, int& scale, int& min) {
  if (j < 4) {
    scale = packed[j] & 63;
    min = packed[j + 4] & 63;
  } else {
    scale = (packed[j + 4] & 0xf) | (packed[j - 4] >> 6) << 4;
    min = (packed[j + 4] >> 4) | (packed[j] >> 6) << 4;
  }
}
}  // namespace kiln::quant_detail

// Quantizers must round every product and sum separately, as ggml's C reference does: C++ lets
// GCC fuse a*b+c into one FMA (even across statements), which changes the rounding. The decoders
// use it too: their products are exact, but which NaN an FMA returns (for a NaN or infinite
// scale) depends on the instruction form the compiler picks, and the SIMD decoders must give
// the reference's bits.
#if defined(__clang__)
#define KILN_QUANT_NO_FP_CONTRACT_BEGIN _Pragma("clang fp contract(off)")
#define KILN_QUANT_NO_FP_CONTRACT_END _Pragma("clang fp contract(on)")
#elif defined(__GNUC__)
#define KILN_QUANT_NO_FP_CONTRACT_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"fp-contract=off\")")
#define KILN_QUANT_NO_FP_CONTRACT_END _Pragma("GCC pop_options")
#else
#define KILN_QUANT_NO_FP_CONTRACT_BEGIN
#define KILN_QUANT_NO_FP_CONTRACT_END
#endif
