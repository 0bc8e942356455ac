// The scalar reference: fp8 conversions, decoding of every block type, the q8_0 / q4_0 quantizers
// and the public entry points (the k-quant quantizers are in quant_k_blocks.cc; the SIMD row
// decoders the kernels use are devices/cpu/kernels/dequantize.cc).
#include "core/quant_blocks.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>

#include "core/error.h"

namespace kiln {
namespace {

// ---------------------------------------------------------------------------------------------
// fp8

// torch's decodings, NaN bits included: e4m3fn's NaN (0x7f, 0xff) widens to sign|0x7ff00000;
// e5m2's NaNs widen as f16 NaNs do in hardware: the payload kept, the quiet bit set.
constexpr float e4m3_value(uint8_t v) {
  const uint32_t sign = uint32_t(v & 0x80) << 24;
  const uint32_t exp = (v >> 3) & 0xf, mant = v & 7;
  if (exp == 15 && mant == 7) return std::bit_cast<float>(sign | 0x7ff00000u);
  if (exp == 0) {  // subnormal: mant * 2^-9
    const float f = float(mant) * (1.0f / 512.0f);
    return sign ? -f : f;
  }
  return std::bit_cast<float>(sign | (exp + 127 - 7) << 23 | mant << 20);
}

constexpr float e5m2_value(uint8_t v) {
  const uint32_t sign = uint32_t(v & 0x80) << 24;
  const uint32_t exp = (v >> 2) & 0x1f, mant = v & 3;
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | mant << 21 | (mant ? 0x00400000u : 0u));
  if (exp == 0) {  // subnormal: mant * 2^-16
    const float f = float(mant) * (1.0f / 65536.0f);
    return sign ? -f : f;
  }
  return std::bit_cast<float>(sign | (exp + 127 - 15) << 23 | mant << 21);
}

// 256-entry tables: single fp8 values decode by lookup.
template <class F>
constexpr std::array<float, 256> fp8_table(F value) {
  std::array<float, 256> t{};
  for (int v = 0; v < 256; ++v) t[size_t(v)] = value(uint8_t(v));
  return t;
}

constexpr auto kE4m3Values = fp8_table(e4m3_value);
constexpr auto kE5m2Values = fp8_table(e5m2_value);

// The same values in integer arithmetic without branches, for bulk decoding: GCC vectorises a
// loop of these (a table lookup per element would be a gather; a float operation under a
// condition stays a branch, as it might trap).
//
// The f32 bits of the magnitude code `magnitude` (sign bit clear; not inf/NaN) of an fp8 format
// with kMbits mantissa bits and exponent bias kBias: a normal value's exponent and mantissa move
// into place and are rebiased; a subnormal one, m * 2^(1 - bias - mbits), is normalised by its
// bit width.
template <int kMbits, int kBias>
constexpr uint32_t fp8_magnitude_bits(uint32_t magnitude) {
  const uint32_t normal = (magnitude << (23 - kMbits)) + (uint32_t(127 - kBias) << 23);
  const uint32_t width = uint32_t(std::bit_width(magnitude));  // a subnormal's: 1..kMbits
  const uint32_t subnormal =
      (width + uint32_t(127 - kBias - kMbits)) << 23 | ((magnitude << (24 - width)) & 0x7fffffu);
  const uint32_t r = magnitude < (1u << kMbits) ? subnormal : normal;
  return magnitude ? r : 0u;
}

constexpr float e4m3_value_branch_free(uint8_t v) {
  const uint32_t magnitude = v & 0x7fu;
  const uint32_t r = magnitude == 0x7f ? 0x7ff00000u : fp8_magnitude_bits<3, 7>(magnitude);
  return std::bit_cast<float>(r | uint32_t(v & 0x80) << 24);
}

constexpr float e5m2_value_branch_free(uint8_t v) {
  const uint32_t magnitude = v & 0x7fu, mant = v & 3u;
  const uint32_t inf_nan = 0x7f800000u | mant << 21 | (mant ? 0x00400000u : 0u);
  const uint32_t r = magnitude > 0x7b ? inf_nan : fp8_magnitude_bits<2, 15>(magnitude);
  return std::bit_cast<float>(r | uint32_t(v & 0x80) << 24);
}

template <class F>
constexpr bool same_bits_as(F value, const std::array<float, 256>& table) {
  for (int v = 0; v < 256; ++v)
    if (std::bit_cast<uint32_t>(value(uint8_t(v))) != std::bit_cast<uint32_t>(table[size_t(v)])) return false;
  return true;
}
static_assert(same_bits_as(e4m3_value_branch_free, kE4m3Values));
static_assert(same_bits_as(e5m2_value_branch_free, kE5m2Values));

// An fp8 format with `mbits` mantissa bits and exponent bias `bias`. Encoding uses integer
// arithmetic only, so the floating-point environment (flush-to-zero, denormals-are-zero) cannot
// change a result.
struct Fp8Format {
  int mbits;
  int bias;
  uint32_t max_code;  // the largest finite magnitude's code
  bool saturate;      // e4m3fn: no inf; magnitudes above the largest finite one become it
};

constexpr Fp8Format kE4m3Format{3, 7, 0x7e, true};
constexpr Fp8Format kE5m2Format{2, 15, 0x7b, false};

// m >> s, rounded to nearest, ties to even.
constexpr uint32_t shift_right_round_even(uint32_t m, uint32_t s) {
  if (s > 25) return 0;  // m < 2^24: below half of one unit
  const uint32_t q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
  return q + uint32_t(rem > half || (rem == half && (q & 1u)));
}

constexpr uint8_t encode_fp8(float f, Fp8Format fmt) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint8_t sign = uint8_t((bits >> 24) & 0x80);
  uint32_t a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;  // torch: every NaN becomes the NaN of f's sign
  const uint32_t drop = uint32_t(23 - fmt.mbits);  // f32 mantissa bits that do not fit
  // f32 bits of the largest finite value: the max code's exponent and mantissa, rebiased.
  const uint32_t max_bits = (fmt.max_code + (uint32_t(127 - fmt.bias) << fmt.mbits)) << drop;
  if (fmt.saturate && a > max_bits) a = max_bits;  // torch saturates e4m3fn (inf included)
  const uint32_t min_normal_bits = uint32_t(127 - fmt.bias + 1) << 23;
  uint32_t code;
  if (a >= min_normal_bits) {
    // Rebias the exponent and drop the low mantissa bits, rounding to nearest even (a carry
    // moves into the exponent).
    const uint32_t r = a - (uint32_t(127 - fmt.bias) << 23);
    code = (r + ((1u << (drop - 1)) - 1) + ((r >> drop) & 1u)) >> drop;
  } else {
    // Subnormal result: the value in units of the smallest subnormal, 2^(1 - bias - mbits);
    // rounding up to 2^mbits units gives the smallest normal's code, as it should.
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7fffffu) | (e ? 0x800000u : 0u);
    const uint32_t e_eff = e ? e : 1;
    code = shift_right_round_even(m, uint32_t(151 - fmt.bias - fmt.mbits) - e_eff);
  }
  if (code > fmt.max_code) code = fmt.max_code + 1;  // e5m2: overflow is inf (0x7c)
  return sign | uint8_t(code);
}

// ---------------------------------------------------------------------------------------------
// decoding (scalar; GCC vectorises the fixed-trip per-block loops)

KILN_QUANT_NO_FP_CONTRACT_BEGIN

// A block's f32 values y[0..N) into dst: as they are, or each rounded to bf16 as kiln::f32_to_bf16.
template <int N>
inline void put_block(const float* y, float* dst) {
  std::copy(y, y + N, dst);
}
template <int N>
inline void put_block(const float* y, uint16_t* dst) {
  for (int j = 0; j < N; ++j) dst[j] = f32_to_bf16(y[j]);
}

using quant_detail::f16_scale;

// q8_0: [f16 d][int8 q x 32]; x = q * d (one rounding, as ggml's `qs[j]*d`).
template <class Out>
void dequantize_q8_0(const uint8_t* src, Out* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += 34, dst += 32) {
    const float d = f16_scale(src);
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    float y[32];
    for (int j = 0; j < 32; ++j) y[j] = float(q[j]) * d;
    put_block<32>(y, dst);
  }
}

// q4_0: [f16 d][16 bytes]; element j < 16 is byte j's low nibble, element j + 16 its high one;
// x = (q - 8) * d.
template <class Out>
void dequantize_q4_0(const uint8_t* src, Out* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += 18, dst += 32) {
    const float d = f16_scale(src);
    const uint8_t* q = src + 2;
    float y[32];
    // Not unrolled: fully unrolled, GCC vectorises only parts of it (about 2x slower).
#pragma GCC unroll 1
    for (int j = 0; j < 16; ++j) {
      y[j] = float(int(q[j] & 0xf) - 8) * d;
      y[j + 16] = float(int(q[j] >> 4) - 8) * d;
    }
    put_block<32>(y, dst);
  }
}

// q4_k and q5_k (ggml's block_q4_K / block_q5_K): 256-element super-blocks of eight 32-element
// sub-blocks, each with a 6-bit scale and min under the f16 super-scales d and dmin:
//   q4_k (144 B): f16 d, f16 dmin, 12 bytes of packed scales/mins, 128 bytes of nibbles
//   q5_k (176 B): the same header, 32 bytes qh, 128 bytes of nibbles
// Elements come in four groups of 64: group g's elements 0..31 (sub-block 2g) are the low nibbles
// of qs[32g..32g+31], elements 32..63 (sub-block 2g+1) the high nibbles; q5_k's fifth bit of
// element l of sub-block s is bit s of qh[l]. x = (d * scale) * q - dmin * min, each product and
// the difference rounded separately, as ggml's dequantize_row_q4_K / _q5_K compute it.
template <bool kFifthBit, class Out>
void dequantize_k(const uint8_t* src, Out* dst, int64_t blocks) {
  constexpr size_t bytes = kFifthBit ? 176 : 144;
  for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += 256) {
    const float d = f16_scale(src), dmin = f16_scale(src + 2);
    const uint8_t* packed = src + 4;
    const uint8_t* qh = src + 16;  // q5_k only
    const uint8_t* qs = src + (kFifthBit ? 48 : 16);
    float y[256];
    for (int g = 0; g < 4; ++g) {
      int sc0, m0, sc1, m1;
      quant_detail::k_scale_min(packed, 2 * g, sc0, m0);
      quant_detail::k_scale_min(packed, 2 * g + 1, sc1, m1);
      const float d0 = d * float(sc0), min0 = dmin * float(m0);
      const float d1 = d * float(sc1), min1 = dmin * float(m1);
      const uint8_t* q = qs + 32 * g;
      float* yg = y + 64 * g;
      for (int l = 0; l < 32; ++l) {
        int lo = q[l] & 0xf, hi = q[l] >> 4;
        if constexpr (kFifthBit) {
          lo |= (qh[l] >> (2 * g) & 1) << 4;
          hi |= (qh[l] >> (2 * g + 1) & 1) << 4;
        }
        yg[l] = d0 * float(lo) - min0;
        yg[32 + l] = d1 * float(hi) - min1;
      }
    }
    put_block<256>(y, dst);
  }
}

KILN_QUANT_NO_FP_CONTRACT_END

// fp8: in runs of 32, the tail by lookup.
template <bool kIsE5m2, class Out>
void dequantize_fp8(const uint8_t* src, Out* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    float y[32];
    for (int j = 0; j < 32; ++j) {
      const uint8_t v = src[i + j];
      y[j] = kIsE5m2 ? e5m2_value_branch_free(v) : e4m3_value_branch_free(v);
    }
    put_block<32>(y, dst + i);
  }
  for (; i < n; ++i) put_block<1>(&(kIsE5m2 ? kE5m2Values : kE4m3Values)[src[i]], dst + i);
}

template <class Out>
void dequantize_any(const char* where, DType t, const void* src, Out* dst, int64_t n) {
  check_storage_count(where, t, n);
  const auto* s = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::f8_e4m3: dequantize_fp8<false>(s, dst, n); return;
    case DType::f8_e5m2: dequantize_fp8<true>(s, dst, n); return;
    case DType::q8_0: dequantize_q8_0(s, dst, n / 32); return;
    case DType::q4_0: dequantize_q4_0(s, dst, n / 32); return;
    case DType::q4_k: dequantize_k<false>(s, dst, n / 256); return;
    case DType::q5_k: dequantize_k<true>(s, dst, n / 256); return;
    default: break;
  }
}

// ---------------------------------------------------------------------------------------------
// q8_0 / q4_0 quantizers (ggml's quantize_row_q8_0_ref / quantize_row_q4_0_ref)

KILN_QUANT_NO_FP_CONTRACT_BEGIN

void store_half(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  p[0] = uint8_t(h & 0xff);
  p[1] = uint8_t(h >> 8);
}

// roundf(v) as an int8 (v is within [-127.5, 127.5] for finite blocks; the clamp only makes the
// degenerate cases defined, e.g. a scale that underflowed to zero with an infinite inverse).
int8_t round_to_int8(float v) {
  if (!(v > -128.0f)) return v != v ? 0 : -128;
  if (v >= 127.0f) return 127;
  return int8_t(std::lround(v));
}

void quantize_q8_0(const float* x, uint8_t* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += 32, y += 34) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(y, d);
    for (int j = 0; j < 32; ++j) y[2 + j] = uint8_t(round_to_int8(x[j] * id));
  }
}

// The nibble of v = x * id + 8.5 truncated (v is within [0.5, 16.5] for finite blocks), at most 15.
uint8_t q4_0_nibble(float v) {
  if (!(v > 0.0f)) return 0;
  if (v >= 15.0f) return 15;
  return uint8_t(int(v));
}

void quantize_q4_0(const float* x, uint8_t* y, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, x += 32, y += 18) {
    // The value of largest magnitude (the first of equals) maps to -8.
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(y, d);
    for (int j = 0; j < 16; ++j) {
      const float lo = x[j] * id, hi = x[j + 16] * id;
      y[2 + j] = uint8_t(q4_0_nibble(lo + 8.5f) | q4_0_nibble(hi + 8.5f) << 4);
    }
  }
}

KILN_QUANT_NO_FP_CONTRACT_END

void check_finite(DType t, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    KILN_CHECK(std::isfinite(src[i]), "quantize", dtype_name(t), ": element ", i, " is ", src[i],
               "; only finite values can be quantized to a block type");
}

}  // namespace

void check_storage_count(const char* where, DType t, int64_t n) {
  KILN_CHECK(is_storage_only(t), where, dtype_name(t),
             " is not a quantized storage type (f8_e4m3, f8_e5m2, q8_0, q4_0, q4_k, q5_k)");
  const int64_t block = dtype_block_elems(t);
  KILN_CHECK(n >= 0 && n % block == 0, where, dtype_name(t), ": ", n, " elements are not a whole number of its ",
             block, "-element blocks");
}

float f8_e4m3_to_f32(uint8_t v) { return kE4m3Values[v]; }
float f8_e5m2_to_f32(uint8_t v) { return kE5m2Values[v]; }
uint8_t f32_to_f8_e4m3(float f) { return encode_fp8(f, kE4m3Format); }
uint8_t f32_to_f8_e5m2(float f) { return encode_fp8(f, kE5m2Format); }

void dequantize_to_f32(DType t, const void* src, float* dst, int64_t n) { dequantize_any("dequantize", t, src, dst, n); }

void dequantize_to_bf16(DType t, const void* src, uint16_t* dst, int64_t n) {
  dequantize_any("dequantize", t, src, dst, n);
}

void quantize_from_f32(DType t, const float* src, void* dst, int64_t n) {
  check_storage_count("quantize", t, n);
  auto* d = static_cast<uint8_t*>(dst);
  if (is_block_quantized(t)) check_finite(t, src, n);
  switch (t) {
    case DType::f8_e4m3:
      for (int64_t i = 0; i < n; ++i) d[i] = encode_fp8(src[i], kE4m3Format);
      return;
    case DType::f8_e5m2:
      for (int64_t i = 0; i < n; ++i) d[i] = encode_fp8(src[i], kE5m2Format);
      return;
    case DType::q8_0: quantize_q8_0(src, d, n / 32); return;
    case DType::q4_0: quantize_q4_0(src, d, n / 32); return;
    case DType::q4_k: quant_detail::quantize_q4_k(src, d, n / 256); return;
    case DType::q5_k: quant_detail::quantize_q5_k(src, d, n / 256); return;
    default: break;
  }
}

}  // namespace kiln
