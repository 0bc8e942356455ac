#include "devices/cpu/kernels/exp2_to_bf16.h"

#include <algorithm>
#include <bit>
#include <limits>

#include <hwy/highway.h>

#include "core/dtype.h"
#include "devices/cpu/kernels/exp2_vec.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Stores the first `count` lanes of x rounded to bf16 (to nearest, ties to even; NaN quieted, as
// f32_to_bf16 rounds).
void store_bf16(VF x, uint16_t* out, size_t count) {
  const DF d;
#if KILN_EXP2_AVX512 && defined(__AVX512BF16__)
  // vcvtneps2bf16 rounds the same way in one instruction. It would treat subnormal inputs as
  // zero; x has none.
  const auto h = std::bit_cast<__m256i>(_mm512_cvtneps_pbh(x.raw));
  if (count == hn::Lanes(d)) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), h);
    return;
  }
  HWY_ALIGN uint16_t lanes[hn::MaxLanes(d)];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), h);
  std::copy_n(lanes, count, out);
#else
  HWY_ALIGN float wide[hn::MaxLanes(d)];
  hn::Store(x, d, wide);
  convert_from_f32(wide, out, DType::bf16, int64_t(count));
#endif
}

}  // namespace

float exp2_sum_to_bf16(const float* s, int64_t n, float a, float b, uint16_t* out) {
  const DF d;
  const size_t lanes = hn::Lanes(d), count = size_t(std::max<int64_t>(n, 0));
  const VF va = hn::Set(d, a), vb = hn::Set(d, b);
  // Two running sums, so that consecutive vectors do not wait on one addition's latency.
  VF sum = hn::Zero(d), sum1 = hn::Zero(d);
  size_t j = 0;
  for (; j + 2 * lanes <= count; j += 2 * lanes) {
    const VF p0 = narrow::exp2_vec(hn::MulSub(hn::LoadU(d, s + j), va, vb));
    const VF p1 = narrow::exp2_vec(hn::MulSub(hn::LoadU(d, s + j + lanes), va, vb));
    sum = hn::Add(sum, p0);
    sum1 = hn::Add(sum1, p1);
    store_bf16(p0, out + j, lanes);
    store_bf16(p1, out + j + lanes, lanes);
  }
  sum = hn::Add(sum, sum1);
  for (; j + lanes <= count; j += lanes) {
    const VF p = narrow::exp2_vec(hn::MulSub(hn::LoadU(d, s + j), va, vb));
    sum = hn::Add(sum, p);
    store_bf16(p, out + j, lanes);
  }
  if (j < count) {  // the tail through the same vector code; the lanes past it give 0
    HWY_ALIGN float tail[hn::MaxLanes(d)] = {};
    std::copy_n(s + j, count - j, tail);
    const auto live = hn::FirstN(d, count - j);
    const VF t = hn::IfThenElse(live, hn::MulSub(hn::Load(d, tail), va, vb),
                                hn::Set(d, -std::numeric_limits<float>::infinity()));
    const VF p = narrow::exp2_vec(t);
    sum = hn::Add(sum, p);
    store_bf16(p, out + j, count - j);
  }
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

float exp2_narrow(float t) { return hn::GetLane(narrow::exp2_vec(hn::Set(DF(), t))); }

}  // namespace kiln::cpu::KILN_CPU_LEVEL
