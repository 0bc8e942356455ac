// fp8 conversions, decoding of every block type, the q8_0 / q4_0 quantizers and the public entry
// points (the k-quant quantizers are in quant_k_blocks.cc).
#include "core/quant_blocks.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>

#include <hwy/highway.h>

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
// block helpers

// f16 bits to f32 (as kiln::f16_to_f32), inline and branch-light: one call per 32 elements.
// Subnormals are renormalised by subtracting two normal floats, so flush-to-zero modes do not
// matter.
inline float half_value(const uint8_t* p) {
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

// Decoding kernels: Highway vectors of at most 16 f32 lanes (a q4_0 half-block), so every target
// (SSE2's 4 lanes to AVX-512's 16) steps through a block in whole vectors. Each lane computes
// what ggml's scalar loop computes for its element, so every target gives the same bits.
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DU8 = hn::Rebind<uint8_t, DF>;
using DI8 = hn::Rebind<int8_t, DF>;
using DU16 = hn::Rebind<uint16_t, DF>;

HWY_INLINE void store(VF v, float* p) { hn::StoreU(v, DF(), p); }

// kiln::f32_to_bf16 on each lane: round to nearest even; NaN kept quiet.
HWY_INLINE void store(VF v, uint16_t* p) {
  const DU du;
  const auto bits = hn::BitCast(du, v);
  const auto is_nan = hn::Gt(hn::And(bits, hn::Set(du, 0x7fffffffu)), hn::Set(du, 0x7f800000u));
  const auto rounding = hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u)));
  const auto rounded = hn::ShiftRight<16>(hn::Add(bits, rounding));
  const auto quiet_nan = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x40u));
  const auto r = hn::IfThenElse(is_nan, quiet_nan, rounded);  // each lane <= 0xffff
  hn::StoreU(hn::DemoteTo(DU16(), hn::BitCast(DI(), r)), DU16(), p);
}

// q8_0: [f16 d][int8 q x 32]; x = q * d (one rounding, as ggml's `qs[j]*d`).
template <class Out>
void dequantize_q8_0(const uint8_t* HWY_RESTRICT src, Out* HWY_RESTRICT dst, int64_t blocks) {
  const size_t lanes = hn::Lanes(DF());
  for (int64_t b = 0; b < blocks; ++b, src += 34, dst += 32) {
    const VF d = hn::Set(DF(), half_value(src));
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    for (size_t i = 0; i < 32; i += lanes)
      store(hn::Mul(hn::ConvertTo(DF(), hn::PromoteTo(DI(), hn::LoadU(DI8(), q + i))), d), dst + i);
  }
}

// q4_0: [f16 d][16 bytes]; element j < 16 is byte j's low nibble, element j + 16 its high one;
// x = (q - 8) * d.
template <class Out>
void dequantize_q4_0(const uint8_t* HWY_RESTRICT src, Out* HWY_RESTRICT dst, int64_t blocks) {
  const size_t lanes = hn::Lanes(DF());
  const auto eight = hn::Set(DI(), 8);
  for (int64_t b = 0; b < blocks; ++b, src += 18, dst += 32) {
    const VF d = hn::Set(DF(), half_value(src));
    for (size_t i = 0; i < 16; i += lanes) {
      const auto q = hn::LoadU(DU8(), src + 2 + i);
      const auto lo = hn::Sub(hn::PromoteTo(DI(), hn::And(q, hn::Set(DU8(), 0xf))), eight);
      const auto hi = hn::Sub(hn::PromoteTo(DI(), hn::ShiftRight<4>(q)), eight);
      store(hn::Mul(hn::ConvertTo(DF(), lo), d), dst + i);
      store(hn::Mul(hn::ConvertTo(DF(), hi), d), dst + 16 + i);
    }
  }
}

// q4_k and q5_k (ggml's block_q4_K / block_q5_K): 256-element super-blocks of eight 32-element
// sub-blocks, each with a 6-bit scale and min under the f16 super-scales d and dmin:
//   q4_k (144 B): f16 d, f16 dmin, 12 bytes of packed scales/mins, 128 bytes of nibbles
//   q5_k (176 B): the same header, 32 bytes qh, 128 bytes of nibbles
// Elements come in four groups of 64: group g's elements 0..31 (sub-block 2g) are the low nibbles
// of qs[32g..32g+31], elements 32..63 (sub-block 2g+1) the high nibbles; q5_k's fifth bit of
// element l of sub-block s is bit s of qh[l]. x = (d * scale) * q - dmin * min, in f32 as ggml
// computes it. d * scale (11 x 6 significant bits) and its product with q (at most 5 bits) are
// exact, so a fused multiply-add (which C++ lets GCC form) gives the same bits.
template <bool kFifthBit, class Out>
void dequantize_k(const uint8_t* HWY_RESTRICT src, Out* HWY_RESTRICT dst, int64_t blocks) {
  constexpr size_t bytes = kFifthBit ? 176 : 144;
  const size_t lanes = hn::Lanes(DF());
  const auto low4 = hn::Set(DU8(), 0xf);
  const auto one = hn::Set(DI(), 1);
  for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += 256) {
    const float d = half_value(src), dmin = half_value(src + 2);
    const uint8_t* packed = src + 4;
    const uint8_t* qh = src + 16;  // q5_k only
    const uint8_t* qs = src + (kFifthBit ? 48 : 16);
    for (int g = 0; g < 4; ++g) {
      int sc0, m0, sc1, m1;
      quant_detail::k_scale_min(packed, 2 * g, sc0, m0);
      quant_detail::k_scale_min(packed, 2 * g + 1, sc1, m1);
      const VF d0 = hn::Set(DF(), d * float(sc0)), min0 = hn::Set(DF(), dmin * float(m0));
      const VF d1 = hn::Set(DF(), d * float(sc1)), min1 = hn::Set(DF(), dmin * float(m1));
      const uint8_t* q = qs + 32 * g;
      Out* y = dst + 64 * g;
      for (size_t i = 0; i < 32; i += lanes) {
        const auto bytes_i = hn::LoadU(DU8(), q + i);
        auto lo = hn::PromoteTo(DI(), hn::And(bytes_i, low4));
        auto hi = hn::PromoteTo(DI(), hn::ShiftRight<4>(bytes_i));
        if constexpr (kFifthBit) {
          const auto h = hn::PromoteTo(DI(), hn::LoadU(DU8(), qh + i));
          lo = hn::Or(lo, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * g), one)));
          hi = hn::Or(hi, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * g + 1), one)));
        }
        store(hn::Sub(hn::Mul(d0, hn::ConvertTo(DF(), lo)), min0), y + i);
        store(hn::Sub(hn::Mul(d1, hn::ConvertTo(DF(), hi)), min1), y + 32 + i);
      }
    }
  }
}

// fp8 bytes as f32 lanes, computed as the tables above are (torch's values and NaN bits): a
// normal value's exponent and mantissa move into place and are rebiased, a subnormal one is its
// integer mantissa times the smallest subnormal.
HWY_INLINE VF e4m3_lanes(hn::Vec<DU8> v) {
  const DU du;
  const auto u = hn::PromoteTo(du, v);
  const auto magnitude = hn::And(u, hn::Set(du, 0x7fu));
  const auto normal = hn::Add(hn::ShiftLeft<20>(magnitude), hn::Set(du, uint32_t(127 - 7) << 23));
  const auto subnormal =
      hn::BitCast(du, hn::Mul(hn::ConvertTo(DF(), hn::BitCast(DI(), magnitude)), hn::Set(DF(), 1.0f / 512.0f)));
  auto r = hn::IfThenElse(hn::Lt(magnitude, hn::Set(du, 8u)), subnormal, normal);
  r = hn::IfThenElse(hn::Eq(magnitude, hn::Set(du, 0x7fu)), hn::Set(du, 0x7ff00000u), r);  // NaN
  return hn::BitCast(DF(), hn::Or(r, hn::ShiftLeft<24>(hn::And(u, hn::Set(du, 0x80u)))));
}

HWY_INLINE VF e5m2_lanes(hn::Vec<DU8> v) {
  const DU du;
  const auto u = hn::PromoteTo(du, v);
  const auto magnitude = hn::And(u, hn::Set(du, 0x7fu));
  const auto normal = hn::Add(hn::ShiftLeft<21>(magnitude), hn::Set(du, uint32_t(127 - 15) << 23));
  const auto subnormal =
      hn::BitCast(du, hn::Mul(hn::ConvertTo(DF(), hn::BitCast(DI(), magnitude)), hn::Set(DF(), 1.0f / 65536.0f)));
  const auto mant = hn::And(u, hn::Set(du, 3u));
  const auto quiet = hn::IfThenElseZero(hn::Ne(mant, hn::Zero(du)), hn::Set(du, 0x00400000u));
  const auto inf_nan = hn::Or(hn::Set(du, 0x7f800000u), hn::Or(hn::ShiftLeft<21>(mant), quiet));
  auto r = hn::IfThenElse(hn::Lt(magnitude, hn::Set(du, 4u)), subnormal, normal);
  r = hn::IfThenElse(hn::Gt(magnitude, hn::Set(du, 0x7bu)), inf_nan, r);
  return hn::BitCast(DF(), hn::Or(r, hn::ShiftLeft<24>(hn::And(u, hn::Set(du, 0x80u)))));
}

inline void put(float* dst, float v) { *dst = v; }
inline void put(uint16_t* dst, float v) { *dst = f32_to_bf16(v); }

template <bool kIsE5m2, class Out>
void dequantize_fp8(const uint8_t* HWY_RESTRICT src, Out* HWY_RESTRICT dst, int64_t n) {
  const int64_t lanes = int64_t(hn::Lanes(DF()));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(DU8(), src + i);
    store(kIsE5m2 ? e5m2_lanes(v) : e4m3_lanes(v), dst + i);
  }
  for (; i < n; ++i) put(dst + i, kIsE5m2 ? kE5m2Values[src[i]] : kE4m3Values[src[i]]);
}

void check_count(const char* where, DType t, int64_t n) {
  KILN_CHECK(is_storage_only(t), where, dtype_name(t),
             " is not a quantized storage type (f8_e4m3, f8_e5m2, q8_0, q4_0, q4_k, q5_k)");
  const int64_t block = dtype_block_elems(t);
  KILN_CHECK(n >= 0 && n % block == 0, where, dtype_name(t), ": ", n, " elements are not a whole number of its ",
             block, "-element blocks");
}

template <class Out>
void dequantize_any(const char* where, DType t, const void* src, Out* dst, int64_t n) {
  check_count(where, t, n);
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

float f8_e4m3_to_f32(uint8_t v) { return kE4m3Values[v]; }
float f8_e5m2_to_f32(uint8_t v) { return kE5m2Values[v]; }
uint8_t f32_to_f8_e4m3(float f) { return encode_fp8(f, kE4m3Format); }
uint8_t f32_to_f8_e5m2(float f) { return encode_fp8(f, kE5m2Format); }

void dequantize_to_f32(DType t, const void* src, float* dst, int64_t n) { dequantize_any("dequantize", t, src, dst, n); }

void dequantize_to_bf16(DType t, const void* src, uint16_t* dst, int64_t n) {
  dequantize_any("dequantize", t, src, dst, n);
}

void quantize_from_f32(DType t, const float* src, void* dst, int64_t n) {
  check_count("quantize", t, n);
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
