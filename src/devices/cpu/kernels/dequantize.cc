// Highway row decoders: vectors of at most 16 f32 lanes (a q4_0 half-block), so every target
// (SSE2's 4 lanes to AVX-512's 16) steps through a block in whole vectors. Each lane computes what
// the scalar reference (core/quant_blocks.cc) computes for its element, with the same operations
// in the same order and no fused multiply-adds, so every target gives the reference's bits.
#include "devices/cpu/kernels/dequantize.h"

#include <hwy/highway.h>

#include "core/quant_blocks.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DU8 = hn::Rebind<uint8_t, DF>;
using DI8 = hn::Rebind<int8_t, DF>;
using DU16 = hn::Rebind<uint16_t, DF>;

using quant_detail::f16_scale;

// GCC would otherwise contract Mul + Sub (Highway's x86 ops are plain vector arithmetic) into an
// FMA, whose NaN result for a NaN or infinite scale differs from the reference's.
KILN_QUANT_NO_FP_CONTRACT_BEGIN

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

inline void put(float* dst, float v) { *dst = v; }
inline void put(uint16_t* dst, float v) { *dst = f32_to_bf16(v); }

// q8_0: x = q * d.
template <class Out>
void dequantize_q8_0(const uint8_t* HWY_RESTRICT src, Out* HWY_RESTRICT dst, int64_t blocks) {
  const size_t lanes = hn::Lanes(DF());
  for (int64_t b = 0; b < blocks; ++b, src += 34, dst += 32) {
    const VF d = hn::Set(DF(), f16_scale(src));
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    for (size_t i = 0; i < 32; i += lanes)
      store(hn::Mul(hn::ConvertTo(DF(), hn::PromoteTo(DI(), hn::LoadU(DI8(), q + i))), d), dst + i);
  }
}

// q4_0: element j < 16 is byte j's low nibble, element j + 16 its high one; x = (q - 8) * d.
template <class Out>
void dequantize_q4_0(const uint8_t* HWY_RESTRICT src, Out* HWY_RESTRICT dst, int64_t blocks) {
  const size_t lanes = hn::Lanes(DF());
  const auto eight = hn::Set(DI(), 8);
  for (int64_t b = 0; b < blocks; ++b, src += 18, dst += 32) {
    const VF d = hn::Set(DF(), f16_scale(src));
    for (size_t i = 0; i < 16; i += lanes) {
      const auto q = hn::LoadU(DU8(), src + 2 + i);
      const auto lo = hn::Sub(hn::PromoteTo(DI(), hn::And(q, hn::Set(DU8(), 0xf))), eight);
      const auto hi = hn::Sub(hn::PromoteTo(DI(), hn::ShiftRight<4>(q)), eight);
      store(hn::Mul(hn::ConvertTo(DF(), lo), d), dst + i);
      store(hn::Mul(hn::ConvertTo(DF(), hi), d), dst + 16 + i);
    }
  }
}

// q4_k / q5_k (layout at the reference): x = (d * scale) * q - dmin * min.
template <bool kFifthBit, class Out>
void dequantize_k(const uint8_t* HWY_RESTRICT src, Out* HWY_RESTRICT dst, int64_t blocks) {
  constexpr size_t bytes = kFifthBit ? 176 : 144;
  const size_t lanes = hn::Lanes(DF());
  const auto low4 = hn::Set(DU8(), 0xf);
  const auto one = hn::Set(DI(), 1);
  for (int64_t b = 0; b < blocks; ++b, src += bytes, dst += 256) {
    const float d = f16_scale(src), dmin = f16_scale(src + 2);
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

// fp8 bytes as f32 lanes, computed as the reference's tables are (torch's values and NaN bits): a
// normal value's exponent and mantissa move into place and are rebiased, a subnormal one is its
// integer mantissa times the smallest subnormal. The two formats differ in their field widths and
// in which codes are NaN or infinite.
template <int kMantissaBits, int kBias>
HWY_INLINE hn::Vec<DU> fp8_finite_bits(hn::Vec<DU> magnitude) {
  const DU du;
  const auto normal =
      hn::Add(hn::ShiftLeft<23 - kMantissaBits>(magnitude), hn::Set(du, uint32_t(127 - kBias) << 23));
  const float smallest_subnormal = 1.0f / float(1 << (kBias + kMantissaBits - 1));  // 2^-9, 2^-16
  const auto subnormal =
      hn::BitCast(du, hn::Mul(hn::ConvertTo(DF(), hn::BitCast(DI(), magnitude)), hn::Set(DF(), smallest_subnormal)));
  return hn::IfThenElse(hn::Lt(magnitude, hn::Set(du, 1u << kMantissaBits)), subnormal, normal);
}

// `bits` (an f32 magnitude) with the sign of fp8 byte u.
HWY_INLINE VF with_fp8_sign(hn::Vec<DU> u, hn::Vec<DU> bits) {
  return hn::BitCast(DF(), hn::Or(bits, hn::ShiftLeft<24>(hn::And(u, hn::Set(DU(), 0x80u)))));
}

HWY_INLINE VF e4m3_lanes(hn::Vec<DU8> v) {
  const DU du;
  const auto u = hn::PromoteTo(du, v);
  const auto magnitude = hn::And(u, hn::Set(du, 0x7fu));
  const auto is_nan = hn::Eq(magnitude, hn::Set(du, 0x7fu));
  return with_fp8_sign(u, hn::IfThenElse(is_nan, hn::Set(du, 0x7ff00000u), fp8_finite_bits<3, 7>(magnitude)));
}

HWY_INLINE VF e5m2_lanes(hn::Vec<DU8> v) {
  const DU du;
  const auto u = hn::PromoteTo(du, v);
  const auto magnitude = hn::And(u, hn::Set(du, 0x7fu));
  const auto mant = hn::And(u, hn::Set(du, 3u));
  const auto quiet = hn::IfThenElseZero(hn::Ne(mant, hn::Zero(du)), hn::Set(du, 0x00400000u));
  const auto inf_nan = hn::Or(hn::Set(du, 0x7f800000u), hn::Or(hn::ShiftLeft<21>(mant), quiet));
  return with_fp8_sign(
      u, hn::IfThenElse(hn::Gt(magnitude, hn::Set(du, 0x7bu)), inf_nan, fp8_finite_bits<2, 15>(magnitude)));
}

template <bool kIsE5m2, class Out>
void dequantize_fp8(const uint8_t* HWY_RESTRICT src, Out* HWY_RESTRICT dst, int64_t n) {
  const int64_t lanes = int64_t(hn::Lanes(DF()));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(DU8(), src + i);
    store(kIsE5m2 ? e5m2_lanes(v) : e4m3_lanes(v), dst + i);
  }
  for (; i < n; ++i) put(dst + i, kIsE5m2 ? f8_e5m2_to_f32(src[i]) : f8_e4m3_to_f32(src[i]));
}

KILN_QUANT_NO_FP_CONTRACT_END

template <class Out>
void dequantize_any(DType t, const void* src, Out* dst, int64_t n) {
  check_storage_count("dequantize", t, n);
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

}  // namespace

void dequantize_row_f32(DType t, const void* src, float* dst, int64_t n) { dequantize_any(t, src, dst, n); }
void dequantize_row_bf16(DType t, const void* src, uint16_t* dst, int64_t n) { dequantize_any(t, src, dst, n); }

}  // namespace kiln::cpu::KILN_CPU_LEVEL
