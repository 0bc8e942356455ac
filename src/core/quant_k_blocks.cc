// ggml's reference quantizers for the k-quants q4_k and q5_k (quantize_row_q4_K_ref /
// quantize_row_q5_K_ref): the same f32 operations in the same order, no fused multiply-adds, so
// that kiln's blocks equal ggml's. The block layouts are described at the reference decoders
// (core/quant_blocks.cc).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/quant_blocks.h"

namespace kiln::quant_detail {
namespace {

constexpr int kBlock = 256;
constexpr size_t kQ4kBytes = 144, kQ5kBytes = 176;

KILN_QUANT_NO_FP_CONTRACT_BEGIN

// Round to nearest, ties to even, by adding 1.5 * 2^23 (ggml's nearest_int; |v| < 2^22).
inline int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &shifted, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// Weighted least squares fit of x ~ scale * l + min (l integer in [0, nmax], min <= 0) for one
// sub-block of n values: starts from the range's scale, then tries nstep + 1 candidate inverse
// scales (nmax + rmin + rdelta*i) / range, refitting scale and min to each candidate's levels
// and keeping the fit of least weighted squared error. Returns the scale; *neg_min = -min.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, float rmin,
                    float rdelta, int nstep) {
  uint8_t trial[32];
  float min = x[0], max = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(L, L + n, uint8_t(0));
    *neg_min = -min;
    return 0.0f;
  }
  float iscale = float(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
    L[i] = uint8_t(l);
    const float diff = scale * float(l) + min - x[i];
    best_error += w[i] * (diff * diff);
  }
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * float(step) + float(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      trial[i] = uint8_t(l);
      const float wl = w[i] * float(l);
      sum_l += wl;
      sum_l2 += wl * float(l);
      sum_xl += wl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0) {  // the min must not be positive: fit the scale alone
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float error = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * float(trial[i]) + this_min - x[i];
      error += w[i] * (diff * diff);
    }
    if (error < best_error) {
      std::copy(trial, trial + n, L);
      best_error = error;
      scale = this_scale;
      min = this_min;
    }
  }
  *neg_min = -min;
  return scale;
}

// Quantizes one super-block: per sub-block levels L[256] in [0, nmax], and the header (d, dmin,
// packed 6-bit scales and mins) written to `head` (16 bytes).
void quantize_k_levels(const float* x, int nmax, float rmin, float rdelta, int nstep, uint8_t* head, uint8_t* L) {
  float scales[8], mins[8], weights[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    // Weights favour large magnitudes: the sub-block's RMS plus |x|.
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float rms = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = rms + std::fabs(xs[l]);
    scales[j] = fit_scale_min(32, nmax, xs, weights, L + 32 * j, &mins[j], rmin, rdelta, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  // 6-bit scales and mins relative to the largest of each.
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t* packed = head + 4;
  for (int j = 0; j < 8; ++j) {
    // ggml stores nearest_int's result in a uint8_t before clamping to 63: keep that wrap.
    const int ls = std::min(63, int(uint8_t(nearest_int(inv_scale * scales[j]))));
    const int lm = std::min(63, int(uint8_t(nearest_int(inv_min * mins[j]))));
    if (j < 4) {
      packed[j] = uint8_t(ls);
      packed[j + 4] = uint8_t(lm);
    } else {
      packed[j + 4] = uint8_t((ls & 0xf) | (lm & 0xf) << 4);
      packed[j - 4] = uint8_t(packed[j - 4] | (ls >> 4) << 6);
      packed[j] = uint8_t(packed[j] | (lm >> 4) << 6);
    }
  }
  const uint16_t d16 = f32_to_f16(max_scale / 63.0f), dmin16 = f32_to_f16(max_min / 63.0f);
  head[0] = uint8_t(d16 & 0xff);
  head[1] = uint8_t(d16 >> 8);
  head[2] = uint8_t(dmin16 & 0xff);
  head[3] = uint8_t(dmin16 >> 8);
  // Requantize each sub-block against the scale and min as stored (a zero scale keeps the fit's
  // levels, as ggml does).
  const float d = f16_to_f32(d16), dmin = f16_to_f32(dmin16);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    k_scale_min(packed, j, sc, m);
    const float ds = d * float(sc);
    if (ds == 0.0f) continue;
    const float dm = dmin * float(m);
    for (int l = 0; l < 32; ++l) L[32 * j + l] = uint8_t(std::clamp(nearest_int((x[32 * j + l] + dm) / ds), 0, nmax));
  }
}

KILN_QUANT_NO_FP_CONTRACT_END

}  // namespace

void quantize_q4_k(const float* src, uint8_t* dst, int64_t blocks) {
  uint8_t L[kBlock];
  for (int64_t b = 0; b < blocks; ++b, src += kBlock, dst += kQ4kBytes) {
    quantize_k_levels(src, 15, -1.0f, 0.1f, 20, dst, L);
    uint8_t* qs = dst + 16;
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l) qs[32 * g + l] = uint8_t(L[64 * g + l] | L[64 * g + 32 + l] << 4);
  }
}

void quantize_q5_k(const float* src, uint8_t* dst, int64_t blocks) {
  uint8_t L[kBlock];
  for (int64_t b = 0; b < blocks; ++b, src += kBlock, dst += kQ5kBytes) {
    quantize_k_levels(src, 31, -0.5f, 0.1f, 15, dst, L);
    uint8_t* qh = dst + 16;
    uint8_t* qs = dst + 48;
    std::memset(qh, 0, 32);
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * g + l], hi = L[64 * g + 32 + l];
        qs[32 * g + l] = uint8_t((lo & 0xf) | (hi & 0xf) << 4);
        qh[l] = uint8_t(qh[l] | (lo >> 4) << (2 * g) | (hi >> 4) << (2 * g + 1));
      }
    }
  }
}

}  // namespace kiln::quant_detail
