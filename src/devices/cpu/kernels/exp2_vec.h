// 2^t on a vector of f32 lanes, for kernels whose results are rounded to bf16 (the bf16
// attention's probabilities, GroupNorm's narrow SiLU): a degree-5 polynomial and one exponent
// scaling, without the general exp's range reduction and special cases. Relative error 2.1e-7,
// that of an f32 rounding or two: far below bf16's 2^-9. For files built on Highway's static
// target, as every CPU kernel is.
#pragma once
#include <hwy/highway.h>

#include "devices/cpu/kernels/level.h"

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#include <immintrin.h>
#define KILN_EXP2_AVX512 1
#else
#define KILN_EXP2_AVX512 0
#endif

namespace kiln::cpu::inline KILN_CPU_LEVEL::narrow {

namespace hn = hwy::HWY_NAMESPACE;

// e^x = 2^(x log2(e)): callers scale their exponents by this.
inline constexpr float kLog2e = 1.44269504088896340736f;

// 2^t for t ≤ 127. Exponents below −126 (−inf included) give 0, so every nonzero result is a
// normal number; NaN gives NaN. 2^t = 2^f · 2^n with n = round(t) and f = t − n in [−1/2, 1/2];
// 2^f is the minimax polynomial of degree 5 for relative error there (Remez: 7.5e-8 before its
// coefficients' and evaluation's f32 roundings).
inline hn::Vec<hn::ScalableTag<float>> exp2_vec(hn::Vec<hn::ScalableTag<float>> t) {
  using VF = hn::Vec<hn::ScalableTag<float>>;
  const hn::ScalableTag<float> d;
  constexpr float kMinExponent = -126.0f;
  const VF n = hn::Round(t);
  const VF f = hn::Sub(t, n);
  VF p = hn::Set(d, 1.327647245e-03f);
  p = hn::MulAdd(p, f, hn::Set(d, 9.675540961e-03f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.550713092e-02f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.402212024e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.931469440e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.000000119e+00f));
#if KILN_EXP2_AVX512
  // vscalefps multiplies by 2^n in one instruction and keeps NaN; the lanes under the smallest
  // exponent (−inf included, whose f is NaN) are zeroed by the same instruction.
  const __mmask16 keep = _mm512_cmp_ps_mask(t.raw, _mm512_set1_ps(kMinExponent), _CMP_NLT_UQ);
  return VF{_mm512_maskz_scalef_ps(keep, p.raw, n.raw)};
#else
  // 2^n built in the exponent field: exact for n in [−126, 127]. A NaN t makes p NaN, and so the
  // product, whatever n's conversion gave.
  const hn::RebindToSigned<decltype(d)> di;
  const auto pow2n = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127))));
  return hn::IfThenZeroElse(hn::Lt(t, hn::Set(d, kMinExponent)), hn::Mul(p, pow2n));
#endif
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL::narrow
