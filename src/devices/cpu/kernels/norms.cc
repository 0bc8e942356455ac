// Row-wise LayerNorm, RMSNorm, GroupNorm and softmax with Highway vectors.
//
// Every row (or group) is handled by exactly one thread with a fixed reduction order
// (fixed accumulator count, fixed chunking, fixed lane combine), so results are
// bit-identical whatever the OpenMP thread count.
#include "devices/cpu/kernels/norms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "core/error.h"
#include "devices/cpu/kernels/elementwise_math.h"
#include "devices/cpu/kernels/exp2_vec.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

// Below this many elements the whole op takes microseconds, less than waking a team.
constexpr int64_t kParallelMinElems = int64_t{1} << 15;
// Long spans are reduced chunk by chunk and the chunk results added in order; this
// keeps each lane accumulator short (better f32 accuracy for large GroupNorm groups).
constexpr size_t kReduceChunk = 4096;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

size_t lanes() { return hn::Lanes(D()); }

// Loads `count` (<= lanes) floats from p + i; lanes past `count` get `fill`. Partial
// vectors go through a stack buffer so nothing past the end of the array is read.
V load_part(const float* p, size_t i, size_t count, float fill) {
  const D d;
  if (count == lanes()) return hn::LoadU(d, p + i);
  HWY_ALIGN float buf[hn::MaxLanes(D())];
  for (size_t k = 0; k < lanes(); ++k) buf[k] = k < count ? p[i + k] : fill;
  return hn::Load(d, buf);
}

// Stores the first `count` (<= lanes) lanes of v to p + i.
void store_part(V v, float* p, size_t i, size_t count) {
  const D d;
  if (count == lanes()) {
    hn::StoreU(v, d, p + i);
    return;
  }
  HWY_ALIGN float buf[hn::MaxLanes(D())];
  hn::Store(v, d, buf);
  std::memcpy(p + i, buf, count * sizeof(float));
}

// Calls body(i, count) for consecutive vectors covering [0, n); only the last may have
// count < lanes.
template <class Body>
void for_each_vec(size_t n, Body body) {
  const size_t N = lanes();
  size_t i = 0;
  for (; i + N <= n; i += N) body(i, N);
  if (i < n) body(i, n - i);
}

// The accumulation steps of the sums: acc + v, and acc + v * v as one fused multiply-add. Function
// objects, so the loops they are passed to inline them.
struct AddStep {
  V operator()(V acc, V v) const { return hn::Add(acc, v); }
};
struct SquareStep {
  V operator()(V acc, V v) const { return hn::MulAdd(v, v, acc); }
};
constexpr AddStep add_step;
constexpr SquareStep square_step;

// Reduces x[0, n) (n <= kReduceChunk) to one vector with four independent accumulators (hides
// add latency): acc = step(acc, x vector), then the four joined by `combine`. A step that
// multiplies and adds does so as one fused multiply-add, written out (MulAdd), never left to the
// compiler (this file builds with -ffp-contract=off). Lanes past n load `fill`, for which step
// must leave acc as it is.
template <class Step, class Combine>
V reduce_chunk(const float* x, size_t n, float fill, V identity, Step step, Combine combine) {
  const D d;
  const size_t N = lanes();
  V a0 = identity, a1 = identity, a2 = identity, a3 = identity;
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    a0 = step(a0, hn::LoadU(d, x + i));
    a1 = step(a1, hn::LoadU(d, x + i + N));
    a2 = step(a2, hn::LoadU(d, x + i + 2 * N));
    a3 = step(a3, hn::LoadU(d, x + i + 3 * N));
  }
  for (; i < n; i += N) a0 = step(a0, load_part(x, i, std::min(N, n - i), fill));
  return combine(combine(a0, a1), combine(a2, a3));
}

// The sum that step(acc, v) accumulates over x[0, n) (step(acc, fill) == acc).
template <class Step>
float sum_span(const float* x, size_t n, float fill, Step step) {
  const D d;
  const auto add = [](V a, V b) { return hn::Add(a, b); };
  float total = 0.0f;
  for (size_t start = 0; start < n; start += kReduceChunk) {
    const size_t len = std::min(kReduceChunk, n - start);
    const V v = reduce_chunk(x + start, len, fill, hn::Zero(d), step, add);
    total += hn::GetLane(hn::SumOfLanes(d, v));
  }
  return total;
}

float max_span(const float* x, size_t n) {
  const D d;
  const auto mx = [](V a, V b) { return hn::Max(a, b); };
  float best = kNegInf;
  for (size_t start = 0; start < n; start += kReduceChunk) {
    const size_t len = std::min(kReduceChunk, n - start);
    const V v = reduce_chunk(x + start, len, kNegInf, hn::Set(d, kNegInf), mx, mx);
    best = std::max(best, hn::GetLane(hn::MaxOfLanes(d, v)));
  }
  return best;
}

float mean_span(const float* x, size_t n) {
  return sum_span(x, n, 0.0f, add_step) / static_cast<float>(n);
}

// The sum of squared deviations from a known mean (the second pass of the two-pass algorithm,
// which avoids the cancellation of E[x^2] - mean^2).
float deviation_sum(const float* x, size_t n, float mean) {
  const V m = hn::Set(D(), mean);
  return sum_span(x, n, mean, [m](V acc, V v) { return square_step(acc, hn::Sub(v, m)); });
}

// Biased variance around a known mean.
float variance_span(const float* x, size_t n, float mean) {
  return deviation_sum(x, n, mean) / static_cast<float>(n);
}

// Count, mean and sum of squared deviations of a run of values (GroupNormMath::narrow).
struct Moments {
  double count = 0, mean = 0, m2 = 0;
  // This run followed by one of n values with mean `mean_b` and squared deviations `m2_b`
  // (Chan, Golub and LeVeque's update).
  void join(double n, double mean_b, double m2_b) {
    const double total = count + n, delta = mean_b - mean;
    mean += delta * n / total;
    m2 += m2_b + delta * delta * count * n / total;
    count = total;
  }
  float variance() const { return static_cast<float>(m2 / count); }
};

// x[0, n) chunk by chunk (kReduceChunk values): each chunk's mean, then its squared deviations
// from that mean while the chunk is in cache, joined in order.
Moments span_moments(const float* x, size_t n) {
  Moments m;
  for (size_t start = 0; start < n; start += kReduceChunk) {
    const size_t len = std::min(kReduceChunk, n - start);
    const float mean = mean_span(x + start, len);
    m.join(double(len), mean, deviation_sum(x + start, len, mean));
  }
  return m;
}

float mean_square_span(const float* x, size_t n) {
  return sum_span(x, n, 0.0f, square_step) / static_cast<float>(n);
}

// y = (x - mean) * scale * w + b elementwise, w / b nullable (treated as 1 / 0).
void normalize_span(const float* x, const float* w, const float* b, float* y, size_t n, float mean,
                    float scale) {
  const D d;
  const V m = hn::Set(d, mean), s = hn::Set(d, scale);
  for_each_vec(n, [&](size_t i, size_t count) {
    V v = hn::Mul(hn::Sub(load_part(x, i, count, 0.0f), m), s);
    if (w) v = hn::Mul(v, load_part(w, i, count, 0.0f));
    if (b) v = hn::Add(v, load_part(b, i, count, 0.0f));
    store_part(v, y, i, count);
  });
}

float inv_sqrt(float v) { return 1.0f / std::sqrt(v); }

// SiLU of GroupNormMath::narrow: x / (1 + exp(-x)), exp(-x) as 2^(-x log2(e)) through
// narrow::exp2_vec, the reciprocal estimated and refined once (r' = r (2 - d r)). The exponent is
// clamped to at most 126, where 1 + 2^t is finite and its reciprocal a normal number; NaN stays
// NaN (x multiplies the quotient).
V silu_narrow(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  const V t = hn::Min(hn::Mul(x, hn::Set(d, -narrow::kLog2e)), hn::Set(d, 126.0f));
  const V den = hn::Add(one, narrow::exp2_vec(t));
  const V r = hn::ApproximateReciprocal(den);
  return hn::Mul(x, hn::Mul(r, hn::NegMulAdd(den, r, hn::Set(d, 2.0f))));
}

// SiLU of y[0, n) in place, as `math` computes it.
void silu_span(float* y, int64_t n, GroupNormMath math) {
  if (math == GroupNormMath::f32) return unary_f32(UnaryOp::silu, y, y, n, 0, 0);
  const D d;
  for_each_vec(size_t(n), [&](size_t i, size_t count) { store_part(silu_narrow(d, load_part(y, i, count, 0.0f)), y, i, count); });
}

void layer_norm_row(const float* x, const float* w, const float* b, float* y, size_t n, float eps) {
  const float mean = mean_span(x, n);
  const float rstd = inv_sqrt(variance_span(x, n, mean) + eps);
  normalize_span(x, w, b, y, n, mean, rstd);
}

void rms_norm_row(const float* x, const float* w, float* y, size_t n, float eps) {
  const float r = inv_sqrt(mean_square_span(x, n) + eps);
  normalize_span(x, w, nullptr, y, n, 0.0f, r);
}

// One group of `channels` contiguous channels of `hw` values each; w, b point at the
// group's first channel (or are null).
void group_norm_group(const float* x, const float* w, const float* b, float* y, size_t channels,
                      size_t hw, float eps, GroupNormMath math) {
  const size_t n = channels * hw;
  float mean, variance;
  if (math == GroupNormMath::f32) {
    mean = mean_span(x, n);
    variance = variance_span(x, n, mean);
  } else {
    const Moments m = span_moments(x, n);
    mean = static_cast<float>(m.mean);
    variance = m.variance();
  }
  const float rstd = inv_sqrt(variance + eps);
  const D d;
  const V m = hn::Set(d, mean);
  for (size_t c = 0; c < channels; ++c) {
    const V s = hn::Set(d, w ? rstd * w[c] : rstd);
    const V sh = hn::Set(d, b ? b[c] : 0.0f);
    const float* xc = x + c * hw;
    float* yc = y + c * hw;
    for_each_vec(hw, [&](size_t i, size_t count) {
      const V v = hn::MulAdd(hn::Sub(load_part(xc, i, count, 0.0f), m), s, sh);
      store_part(v, yc, i, count);
    });
  }
}

void softmax_row(const float* x, float* y, size_t n) {
  const D d;
  const V mx = hn::Set(d, max_span(x, n));
  // Pass 2 writes e = exp(x - max) and sums it. Highway's Exp maps NaN to 0, so NaN
  // is put back explicitly: a NaN input, an all -inf row (-inf - -inf) or a +inf max
  // then poisons the sum and the whole row becomes NaN, as in PyTorch. Tail lanes load
  // -inf, whose exp is 0.
  V acc = hn::Zero(d);
  for_each_vec(n, [&](size_t i, size_t count) {
    const V z = hn::Sub(load_part(x, i, count, kNegInf), mx);
    const V e = hn::IfThenElse(hn::IsNaN(z), z, hn::Exp(d, z));
    acc = hn::Add(acc, e);
    store_part(e, y, i, count);
  });
  const V inv = hn::Set(d, 1.0f / hn::GetLane(hn::SumOfLanes(d, acc)));
  for_each_vec(n, [&](size_t i, size_t count) {
    store_part(hn::Mul(load_part(y, i, count, 0.0f), inv), y, i, count);
  });
}

// Runs fn(r) for r in [0, rows), in parallel only when total work is worth a team.
template <class Fn>
void for_rows(int64_t rows, int64_t elems_per_row, Fn fn) {
  if (rows < 2 || rows * elems_per_row < kParallelMinElems) {
    for (int64_t r = 0; r < rows; ++r) fn(r);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) fn(r);
}

// Runs row(x_row, y_row) on f32 rows: x's and y's own where they are f32; else a per-thread f32
// copy of x's row (widened exactly), and an f32 row then rounded into y's row.
template <class RowFn>
void rows_in_f32(const void* x, DType x_type, void* y, DType y_type, int64_t rows, int64_t cols, RowFn row) {
  const size_t xs = dtype_size(x_type), ys = dtype_size(y_type);
  for_rows(rows, cols, [&](int64_t r) {
    thread_local std::vector<float> in, out;
    const char* xr = static_cast<const char*>(x) + size_t(r * cols) * xs;
    char* yr = static_cast<char*>(y) + size_t(r * cols) * ys;
    const float* xf = reinterpret_cast<const float*>(xr);
    if (x_type != DType::f32) {
      in.resize(size_t(cols));
      convert_to_f32(xr, x_type, in.data(), cols);
      xf = in.data();
    }
    float* yf = y_type == DType::f32 ? reinterpret_cast<float*>(yr) : (out.resize(size_t(cols)), out.data());
    row(xf, yf);
    if (y_type != DType::f32) convert_from_f32(yf, yr, y_type, cols);
  });
}

void check_rows(const char* op, const void* x, const void* y, int64_t rows, int64_t cols) {
  KILN_CHECK(rows >= 0 && cols >= 0, op, "negative shape: rows=", rows, " cols=", cols);
  KILN_CHECK(rows * cols == 0 || (x && y), op, "null input or output pointer");
}

}  // namespace

void layer_norm_rows(const void* x, DType x_type, const float* w, const float* b, void* y, DType y_type,
                     int64_t rows, int64_t cols, float eps) {
  check_rows("layer_norm", x, y, rows, cols);
  if (cols == 0) return;
  const size_t n = static_cast<size_t>(cols);
  rows_in_f32(x, x_type, y, y_type, rows, cols,
              [&](const float* xr, float* yr) { layer_norm_row(xr, w, b, yr, n, eps); });
}

void rms_norm_rows(const void* x, DType x_type, const float* w, void* y, DType y_type, int64_t rows, int64_t cols,
                   float eps) {
  check_rows("rms_norm", x, y, rows, cols);
  if (cols == 0) return;
  const size_t n = static_cast<size_t>(cols);
  rows_in_f32(x, x_type, y, y_type, rows, cols, [&](const float* xr, float* yr) { rms_norm_row(xr, w, yr, n, eps); });
}

void group_norm_nchw(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t C,
                     int64_t HW, int64_t groups, float eps, bool silu, GroupNormMath math) {
  KILN_CHECK(N >= 0 && C >= 0 && HW >= 0, "group_norm", "negative shape: N=", N, " C=", C,
             " HW=", HW);
  KILN_CHECK(groups > 0 && C % groups == 0, "group_norm", "channels ", C, " not divisible into ",
             groups, " groups");
  KILN_CHECK(N * C * HW == 0 || (x && y), "group_norm", "null input or output pointer");
  if (N * C * HW == 0) return;
  const int64_t cpg = C / groups;
  const int64_t group_elems = cpg * HW;
  // Groups are contiguous spans in NCHW; unit u = n * groups + g starts at u * group_elems.
  for_rows(N * groups, group_elems, [&](int64_t u) {
    const int64_t c0 = (u % groups) * cpg;
    const int64_t off = u * group_elems;
    group_norm_group(x + off, w ? w + c0 : nullptr, b ? b + c0 : nullptr, y + off,
                     static_cast<size_t>(cpg), static_cast<size_t>(HW), eps, math);
    if (silu) silu_span(y + off, group_elems, math);
  });
}

namespace {

// ---- channels-last GroupNorm, summed in the NCHW kernel's order ----
//
// group_norm_nchw sums each group's values channel after channel with sum_span: chunks of
// kReduceChunk values, inside a chunk value j goes to accumulator (j / lanes) % 4, lane j % lanes
// (a partial last vector, to accumulator 0), then the four are added pairwise, summed across lanes,
// and the chunk results added in order in f32. The channels-last kernel adds the same values in the
// same order, so a channels-last decode has the bits of the NCHW one.
//
// When every channel's pixels are whole chunks (HW a multiple of kReduceChunk), each chunk is a run
// of pixels of one channel and pixel p always lands in slot p % (4 * lanes): the slots then fill
// across channels in vectors, reading the memory in order (the fast path). When HW is only a
// multiple of the slot count (and at least one chunk), pixel p still lands in slot p % slots, but
// chunks end at other pixels in each channel and one can run on into the next channel's first
// pixels (group_sums_spanning). Otherwise each group is copied channel-major and normalized by the
// NCHW code itself.

// Pixels per block of the statistics and the normalization (an image of a type other than f32 and
// bf16 is widened a block at a time, never whole).
constexpr int64_t kPixelBlock = 256;
// Channels per task of the fast path's statistics: its slots (4 * lanes * 64 floats) stay in L1.
constexpr int64_t kChannelBlock = 64;

int64_t slot_count() { return int64_t(4 * lanes()); }

bool chunks_are_pixel_runs(int64_t HW) {
  return HW % int64_t(kReduceChunk) == 0 && int64_t(kReduceChunk) % slot_count() == 0;
}

bool chunks_span_channels(int64_t HW) {
  return HW >= int64_t(kReduceChunk) && HW % slot_count() == 0 && int64_t(kReduceChunk) % slot_count() == 0;
}

// One channel's chunk sum from its slots acc[s * stride], s < slot_count(): reduce_chunk's combine
// of the four accumulators, then sum_span's sum across lanes.
float slots_sum(const float* acc, int64_t stride) {
  const D d;
  const size_t N = lanes();
  HWY_ALIGN float lane[4][hn::MaxLanes(D())];
  for (size_t k = 0; k < 4; ++k)
    for (size_t l = 0; l < N; ++l) lane[k][l] = acc[int64_t(k * N + l) * stride];
  const V v = hn::Add(hn::Add(hn::LoadU(d, lane[0]), hn::LoadU(d, lane[1])),
                      hn::Add(hn::LoadU(d, lane[2]), hn::LoadU(d, lane[3])));
  return hn::GetLane(hn::SumOfLanes(d, v));
}

// Pixels [p0, p1), channels [c0, c0 + nc) of one image [HW, C], read as f32 vectors: f32 and bf16
// where they lie (bf16 widened in registers: its bits are f32's top half), other types widened
// into `scratch` first.
struct PixelRows {
  const void* data;  // pixel p0's channel c0
  DType type;        // f32 or bf16
  int64_t ld;        // elements from one pixel to the next

  // Channels [i, i + count) (count <= lanes) of the p-th pixel; lanes past count are 0.
  V load(int64_t p, size_t i, size_t count) const {
    if (type == DType::f32) return load_part(static_cast<const float*>(data) + p * ld, i, count, 0.0f);
    const uint16_t* h = static_cast<const uint16_t*>(data) + p * ld + int64_t(i);
    const D d;
    if (count == lanes()) {
      const hn::Rebind<uint16_t, D> d16;
      const hn::RebindToUnsigned<D> du;
      return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, h))));
    }
    HWY_ALIGN float buf[hn::MaxLanes(D())];
    for (size_t k = 0; k < lanes(); ++k) buf[k] = k < count ? bf16_to_f32(h[k]) : 0.0f;
    return hn::Load(d, buf);
  }
};
PixelRows pixel_rows(const void* x, DType type, int64_t p0, int64_t p1, int64_t C, int64_t c0, int64_t nc,
                     std::vector<float>& scratch) {
  const size_t es = dtype_size(type);
  if (type == DType::f32 || type == DType::bf16) return {static_cast<const char*>(x) + size_t(p0 * C + c0) * es, type, C};
  scratch.resize(size_t((p1 - p0) * nc));
  for (int64_t p = p0; p < p1; ++p)
    convert_to_f32(static_cast<const char*>(x) + size_t(p * C + c0) * es, type, scratch.data() + (p - p0) * nc, nc);
  return {scratch.data(), DType::f32, nc};
}

// sum_span's result for chunk q of each channel [c0, c0 + nc) of step over x - center[c] (fast path):
// written to sums[c].
template <class Step>
void chunk_sums(const void* x, DType type, int64_t C, int64_t q, int64_t c0, int64_t nc, const float* center,
                float* sums, Step step) {
  const int64_t slots = slot_count();
  thread_local std::vector<float> acc, scratch;
  acc.assign(size_t(slots * nc), 0.0f);
  const int64_t first = q * int64_t(kReduceChunk), last = first + int64_t(kReduceChunk);
  for (int64_t p0 = first; p0 < last; p0 += kPixelBlock) {
    const PixelRows rows = pixel_rows(x, type, p0, p0 + kPixelBlock, C, c0, nc, scratch);
    for (int64_t p = 0; p < kPixelBlock; ++p) {
      float* a = acc.data() + ((p0 + p) % slots) * nc;
      for_each_vec(size_t(nc), [&](size_t i, size_t n) {
        const V v = hn::Sub(rows.load(p, i, n), load_part(center + c0, i, n, 0.0f));
        store_part(step(load_part(a, i, n, 0.0f), v), a, i, n);
      });
    }
  }
  for (int64_t c = 0; c < nc; ++c) sums[c0 + c] = slots_sum(acc.data() + c, nc);
}

// Per-group sum_span of step over x - center[c], one image [HW, C] (fast path): the chunk sums of
// every channel in parallel, then each group's added channel after channel, chunk after chunk.
template <class Step>
std::vector<float> group_sums(const void* x, DType type, int64_t HW, int64_t C, int64_t groups, const float* center,
                              Step step) {
  const int64_t chunks = HW / int64_t(kReduceChunk), blocks = (C + kChannelBlock - 1) / kChannelBlock;
  std::vector<float> sums(size_t(chunks * C));
  const bool parallel = HW * C >= kParallelMinElems;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t task = 0; task < chunks * blocks; ++task) {
    const int64_t q = task / blocks, c0 = (task % blocks) * kChannelBlock;
    chunk_sums(x, type, C, q, c0, std::min(kChannelBlock, C - c0), center, sums.data() + q * C, step);
  }
  std::vector<float> totals(size_t(groups), 0.0f);
  const int64_t cpg = C / groups;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t q = 0; q < chunks; ++q) totals[size_t(c / cpg)] += sums[size_t(q * C + c)];
  return totals;
}

// Per-group sum_span of step over x - center[c], one image [HW, C], when chunks_span_channels(HW):
// each task takes one vector of channels through every pixel in order, closing a channel's chunk
// where its flat index in the group's span (local channel * HW + pixel) reaches a multiple of
// kReduceChunk. A channel's pixels before its first such boundary (its head) end the previous
// channel's last chunk, so the pass adds them as zeros (which change no sum) and afterwards adds them
// to the previous channel's slots, after that channel's own pixels, as the span orders them.
template <class Step>
std::vector<float> group_sums_spanning(const void* x, DType type, int64_t HW, int64_t C, int64_t groups,
                                       const float* center, Step step) {
  const D d;
  const int64_t N = int64_t(lanes()), slots = slot_count(), chunk = int64_t(kReduceChunk), cpg = C / groups;
  const int64_t chunks_per_group = (cpg * HW + chunk - 1) / chunk;
  std::vector<int64_t> head(static_cast<size_t>(cpg));
  for (int64_t cl = 0; cl < cpg; ++cl) head[size_t(cl)] = (chunk - cl * HW % chunk) % chunk;
  // Per channel: its head, and the head of the next channel of its group (0 after the last).
  std::vector<float> own_head(static_cast<size_t>(C)), next_head(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    own_head[size_t(c)] = float(head[size_t(c % cpg)]);
    next_head[size_t(c)] = c % cpg + 1 < cpg ? float(head[size_t(c % cpg + 1)]) : 0.0f;
  }
  std::vector<float> sums(size_t(groups * chunks_per_group), 0.0f);
  const int64_t blocks = (C + N - 1) / N;
  const bool parallel = HW * C >= kParallelMinElems;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    thread_local std::vector<float> acc, scratch;
    const int64_t c0 = blk * N, nc = std::min(N, C - c0);
    acc.assign(size_t(slots * N), 0.0f);  // acc[s * N + i]: slot s of channel c0 + i
    std::vector<int64_t> filling(static_cast<size_t>(nc)), next_boundary(static_cast<size_t>(nc));
    for (int64_t i = 0; i < nc; ++i) {
      const int64_t cl = (c0 + i) % cpg;
      filling[size_t(i)] = (cl * HW + head[size_t(cl)]) / chunk;  // the chunk its own pixels start
      next_boundary[size_t(i)] = head[size_t(cl)] + chunk;
    }
    const auto close = [&](int64_t i) {
      sums[size_t(((c0 + i) / cpg) * chunks_per_group + filling[size_t(i)]++)] = slots_sum(acc.data() + i, N);
      for (int64_t s = 0; s < slots; ++s) acc[size_t(s * N + i)] = 0.0f;
    };
    const auto close_chunks_ending_at = [&](int64_t p) {
      for (int64_t i = 0; i < nc; ++i)
        if (next_boundary[size_t(i)] == p) close(i), next_boundary[size_t(i)] += chunk;
    };
    int64_t soonest = *std::min_element(next_boundary.begin(), next_boundary.end());
    const V heads = load_part(own_head.data(), size_t(c0), size_t(nc), 0.0f);
    const V centers = load_part(center, size_t(c0), size_t(nc), 0.0f);
    for (int64_t p0 = 0; p0 < HW; p0 += kPixelBlock) {
      const int64_t p1 = std::min(HW, p0 + kPixelBlock);
      const PixelRows rows = pixel_rows(x, type, p0, p1, C, c0, nc, scratch);
      for (int64_t p = p0; p < p1; ++p) {
        if (p == soonest) {
          close_chunks_ending_at(p);
          soonest = *std::min_element(next_boundary.begin(), next_boundary.end());
        }
        const V v = hn::Sub(rows.load(p - p0, 0, size_t(nc)), centers);
        float* a = acc.data() + (p % slots) * N;
        hn::StoreU(step(hn::LoadU(d, a), hn::IfThenElseZero(hn::Ge(hn::Set(d, float(p)), heads), v)), d, a);
      }
    }
    if (soonest == HW) close_chunks_ending_at(HW);
    // The next channel's head, into the slots of the chunk still open (none after a group's last
    // channel: its next_head is 0).
    const int64_t na = std::min(nc, C - 1 - c0);  // channels whose next channel exists
    if (na > 0) {
      const V limits = load_part(next_head.data(), size_t(c0), size_t(na), 0.0f);
      const V next_centers = load_part(center, size_t(c0 + 1), size_t(na), 0.0f);
      const int64_t longest = int64_t(hn::GetLane(hn::MaxOfLanes(d, limits)));
      for (int64_t p0 = 0; p0 < longest; p0 += kPixelBlock) {
        const int64_t p1 = std::min(longest, p0 + kPixelBlock);
        const PixelRows rows = pixel_rows(x, type, p0, p1, C, c0 + 1, na, scratch);
        for (int64_t p = p0; p < p1; ++p) {
          const V v = hn::Sub(rows.load(p - p0, 0, size_t(na)), next_centers);
          float* a = acc.data() + (p % slots) * N;
          hn::StoreU(step(hn::LoadU(d, a), hn::IfThenElseZero(hn::Lt(hn::Set(d, float(p)), limits), v)), d, a);
        }
      }
    }
    for (int64_t i = 0; i < nc; ++i)  // the chunk each channel still has open: its group's last, or one just ended
      if (((c0 + i) % cpg * HW + HW) % chunk != 0) close(i);
  }
  std::vector<float> totals(size_t(groups), 0.0f);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t k = 0; k < chunks_per_group; ++k) totals[size_t(g)] += sums[size_t(g * chunks_per_group + k)];
  return totals;
}

// span_moments of each group of one image [HW, C] (fast path, GroupNormMath::narrow): each task
// takes one chunk of pixels of a block of channels, sums it, then sums its squared deviations
// from each channel's chunk mean while the block is in cache; the chunks' moments are then joined
// channel after channel, chunk after chunk, as the group's NCHW span orders them.
std::vector<Moments> group_moments(const void* x, DType type, int64_t HW, int64_t C, int64_t groups,
                                  const float* zero) {
  const int64_t chunks = HW / int64_t(kReduceChunk), blocks = (C + kChannelBlock - 1) / kChannelBlock;
  std::vector<float> means(size_t(chunks * C)), m2(size_t(chunks * C));
  const bool parallel = HW * C >= kParallelMinElems;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t task = 0; task < chunks * blocks; ++task) {
    const int64_t q = task / blocks, c0 = (task % blocks) * kChannelBlock, nc = std::min(kChannelBlock, C - c0);
    float* mean = means.data() + q * C;
    chunk_sums(x, type, C, q, c0, nc, zero, mean, add_step);
    for (int64_t c = c0; c < c0 + nc; ++c) mean[c] /= static_cast<float>(kReduceChunk);  // as mean_span
    chunk_sums(x, type, C, q, c0, nc, mean, m2.data() + q * C, square_step);
  }
  std::vector<Moments> moments(static_cast<size_t>(groups));
  const int64_t cpg = C / groups;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t q = 0; q < chunks; ++q)
      moments[size_t(c / cpg)].join(double(kReduceChunk), means[size_t(q * C + c)], m2[size_t(q * C + c)]);
  return moments;
}

// One image [HW, C] normalized with per-channel mean, scale and shift (fast path).
void normalize_pixels(const void* x, DType x_type, void* y, DType y_type, int64_t HW, int64_t C, const float* mean,
                      const float* scale, const float* shift, bool silu, GroupNormMath math) {
  const size_t ys = dtype_size(y_type);
  const int64_t blocks = (HW + kPixelBlock - 1) / kPixelBlock;
  const bool parallel = HW * C >= kParallelMinElems;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t k = 0; k < blocks; ++k) {
    thread_local std::vector<float> in_scratch, out_scratch;
    const int64_t p0 = k * kPixelBlock, p1 = std::min(HW, p0 + kPixelBlock);
    const PixelRows rows = pixel_rows(x, x_type, p0, p1, C, 0, C, in_scratch);
    if (y_type != DType::f32) out_scratch.resize(size_t((p1 - p0) * C));
    float* yb = y_type == DType::f32 ? static_cast<float*>(y) + p0 * C : out_scratch.data();
    for (int64_t p = 0; p < p1 - p0; ++p) {
      float* yp = yb + p * C;
      for_each_vec(size_t(C), [&](size_t i, size_t cnt) {  // as group_norm_group
        const V v = hn::MulAdd(hn::Sub(rows.load(p, i, cnt), load_part(mean, i, cnt, 0.0f)),
                               load_part(scale, i, cnt, 0.0f), load_part(shift, i, cnt, 0.0f));
        store_part(v, yp, i, cnt);
      });
    }
    if (silu) silu_span(yb, (p1 - p0) * C, math);
    if (y_type != DType::f32) convert_from_f32(yb, static_cast<char*>(y) + size_t(p0 * C) * ys, y_type, (p1 - p0) * C);
  }
}

// Copies channels [c0, c0 + n) of every pixel of one image [HW, C] into span [n, HW] as f32
// (read_group), or back from it, rounded to `type` (write_group). f32 and bf16 inline; others
// through the converters.
void read_group(const void* x, DType type, int64_t HW, int64_t C, int64_t c0, int64_t n, float* span) {
  if (type == DType::f32) {
    const float* xf = static_cast<const float*>(x) + c0;
    for (int64_t p = 0; p < HW; ++p)
      for (int64_t c = 0; c < n; ++c) span[c * HW + p] = xf[p * C + c];
  } else if (type == DType::bf16) {
    const uint16_t* xb = static_cast<const uint16_t*>(x) + c0;
    for (int64_t p = 0; p < HW; ++p)
      for (int64_t c = 0; c < n; ++c) span[c * HW + p] = bf16_to_f32(xb[p * C + c]);
  } else {
    std::vector<float> pixel(static_cast<size_t>(n));
    const size_t es = dtype_size(type);
    for (int64_t p = 0; p < HW; ++p) {
      convert_to_f32(static_cast<const char*>(x) + size_t(p * C + c0) * es, type, pixel.data(), n);
      for (int64_t c = 0; c < n; ++c) span[c * HW + p] = pixel[size_t(c)];
    }
  }
}

void write_group(const float* span, int64_t HW, int64_t C, int64_t c0, int64_t n, void* y, DType type) {
  if (type == DType::f32) {
    float* yf = static_cast<float*>(y) + c0;
    for (int64_t p = 0; p < HW; ++p)
      for (int64_t c = 0; c < n; ++c) yf[p * C + c] = span[c * HW + p];
    return;
  }
  std::vector<float> pixel(static_cast<size_t>(n));
  const size_t es = dtype_size(type);
  for (int64_t p = 0; p < HW; ++p) {
    for (int64_t c = 0; c < n; ++c) pixel[size_t(c)] = span[c * HW + p];
    convert_from_f32(pixel.data(), static_cast<char*>(y) + size_t(p * C + c0) * es, type, n);
  }
}

// One image, any HW: each group copied channel-major (its NCHW span), normalized by the NCHW code,
// and copied back.
void group_norm_image_by_groups(const void* x, DType x_type, const float* w, const float* b, void* y, DType y_type,
                                int64_t HW, int64_t C, int64_t groups, float eps, bool silu, GroupNormMath math) {
  const int64_t cpg = C / groups;
  const bool parallel = groups > 1 && HW * C >= kParallelMinElems;
#pragma omp parallel if (parallel)
  {
    std::vector<float> span(size_t(cpg * HW)), out(span.size());
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * cpg;
      read_group(x, x_type, HW, C, c0, cpg, span.data());
      group_norm_group(span.data(), w ? w + c0 : nullptr, b ? b + c0 : nullptr, out.data(), size_t(cpg), size_t(HW),
                       eps, math);
      if (silu) silu_span(out.data(), cpg * HW, math);
      write_group(out.data(), HW, C, c0, cpg, y, y_type);
    }
  }
}

}  // namespace

void group_norm_nhwc(const void* x, DType x_type, const float* w, const float* b, void* y, DType y_type, int64_t N,
                     int64_t HW, int64_t C, int64_t groups, float eps, bool silu) {
  KILN_CHECK(N >= 0 && C >= 0 && HW >= 0, "group_norm", "negative shape: N=", N, " HW=", HW, " C=", C);
  KILN_CHECK(groups > 0 && C % groups == 0, "group_norm", "channels ", C, " not divisible into ", groups, " groups");
  KILN_CHECK(N * C * HW == 0 || (x && y), "group_norm", "null input or output pointer");
  if (N * C * HW == 0) return;
  const int64_t cpg = C / groups;
  const float count = static_cast<float>(size_t(cpg * HW));
  const size_t xs = dtype_size(x_type), ys = dtype_size(y_type);
  const GroupNormMath math = group_norm_math_for(x_type);
  std::vector<float> zero(size_t(C), 0.0f), mean(size_t(C), 0.0f), scale(size_t(C), 0.0f), shift(size_t(C), 0.0f);
  const auto set_scale = [&](int64_t c, float variance) {
    const float rstd = inv_sqrt(variance + eps);
    scale[size_t(c)] = w ? rstd * w[c] : rstd;
    shift[size_t(c)] = b ? b[c] : 0.0f;
  };
  for (int64_t n = 0; n < N; ++n) {
    const void* xn = static_cast<const char*>(x) + size_t(n * HW * C) * xs;
    void* yn = static_cast<char*>(y) + size_t(n * HW * C) * ys;
    const bool runs = chunks_are_pixel_runs(HW);
    if (!runs && (math == GroupNormMath::narrow || !chunks_span_channels(HW))) {
      group_norm_image_by_groups(xn, x_type, w, b, yn, y_type, HW, C, groups, eps, silu, math);
      continue;
    }
    if (math == GroupNormMath::narrow) {
      const std::vector<Moments> m = group_moments(xn, x_type, HW, C, groups, zero.data());
      for (int64_t c = 0; c < C; ++c) {
        mean[size_t(c)] = static_cast<float>(m[size_t(c / cpg)].mean);
        set_scale(c, m[size_t(c / cpg)].variance());
      }
    } else {
      const auto sums = [&](const float* center, auto step) {
        return runs ? group_sums(xn, x_type, HW, C, groups, center, step)
                    : group_sums_spanning(xn, x_type, HW, C, groups, center, step);
      };
      // Two passes, as group_norm_group: the mean, then the variance around it.
      const std::vector<float> sum = sums(zero.data(), add_step);
      for (int64_t c = 0; c < C; ++c) mean[size_t(c)] = sum[size_t(c / cpg)] / count;
      const std::vector<float> sq = sums(mean.data(), square_step);
      for (int64_t c = 0; c < C; ++c) set_scale(c, sq[size_t(c / cpg)] / count);
    }
    normalize_pixels(xn, x_type, yn, y_type, HW, C, mean.data(), scale.data(), shift.data(), silu, math);
  }
}

void softmax_rows(const float* x, float* y, int64_t rows, int64_t cols) {
  check_rows("softmax", x, y, rows, cols);
  if (cols == 0) return;
  const size_t n = static_cast<size_t>(cols);
  for_rows(rows, cols, [&](int64_t r) { softmax_row(x + r * cols, y + r * cols, n); });
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL

namespace kiln::cpu::inline KILN_CPU_LEVEL {

float row_sum(const float* x, int64_t n) { return sum_span(x, size_t(n), 0.0f, add_step); }
float row_max(const float* x, int64_t n) { return max_span(x, size_t(n)); }
float row_squared_deviation_sum(const float* x, int64_t n, float mean) {
  return variance_span(x, size_t(n), mean) * static_cast<float>(n);
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
