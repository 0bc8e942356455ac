// CPU conv2d (oneDNN) and row-wise norm / softmax kernels against naive double-precision
// references written here.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "devices/cpu/kernels/conv2d.h"
#include "devices/cpu/kernels/norms.h"

namespace kiln::cpu {
namespace {

using Vec = std::vector<float>;
constexpr float kInf = std::numeric_limits<float>::infinity();

Vec random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Elementwise |got - want| <= atol + rtol * |want|, reporting the first few misses.
void expect_close(const Vec& got, const std::vector<double>& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size() && misses < 5; ++i) {
    const double tol = atol + rtol * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": index " << i << " got " << got[i] << " want " << want[i];
      ++misses;
    }
  }
}

// ---------------------------------------------------------------- conv2d

struct ConvCase {
  const char* name;
  int64_t N, C, H, W, O, KH, KW, sh, sw, ph, pw;
  bool bias;
  int64_t OH() const { return (H + 2 * ph - KH) / sh + 1; }
  int64_t OW() const { return (W + 2 * pw - KW) / sw + 1; }
};

struct ConvRef {
  std::vector<double> y;
  std::vector<double> abs_sum;  // sum of |x * w| per output: scale for the f32 error bound
};

ConvRef conv_reference(const ConvCase& c, const Vec& x, const Vec& w, const float* bias) {
  const int64_t OH = c.OH(), OW = c.OW();
  ConvRef r{std::vector<double>(c.N * c.O * OH * OW), std::vector<double>(c.N * c.O * OH * OW)};
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t o = 0; o < c.O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = bias ? bias[o] : 0.0, mag = bias ? std::fabs(bias[o]) : 0.0;
          for (int64_t ci = 0; ci < c.C; ++ci)
            for (int64_t kh = 0; kh < c.KH; ++kh)
              for (int64_t kw = 0; kw < c.KW; ++kw) {
                const int64_t ih = oh * c.sh - c.ph + kh, iw = ow * c.sw - c.pw + kw;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                const double p = double(x[((n * c.C + ci) * c.H + ih) * c.W + iw]) *
                                 w[((o * c.C + ci) * c.KH + kh) * c.KW + kw];
                acc += p;
                mag += std::fabs(p);
              }
          const size_t i = ((n * c.O + o) * OH + oh) * OW + ow;
          r.y[i] = acc;
          r.abs_sum[i] = mag;
        }
  return r;
}

void check_conv(const ConvCase& c, detail::ConvLayout layout, uint32_t seed) {
  const Vec x = random_vec(c.N * c.C * c.H * c.W, seed);
  const Vec w = random_vec(c.O * c.C * c.KH * c.KW, seed + 1);
  const Vec b = random_vec(c.O, seed + 2);
  const float* bias = c.bias ? b.data() : nullptr;
  Vec y(c.N * c.O * c.OH() * c.OW(), std::nanf(""));
  detail::conv2d_f32_layout(layout, x.data(), w.data(), bias, y.data(), c.N, c.C, c.H, c.W, c.O,
                            c.KH, c.KW, c.sh, c.sw, c.ph, c.pw);
  const ConvRef ref = conv_reference(c, x, w, bias);
  int misses = 0;
  for (size_t i = 0; i < y.size() && misses < 5; ++i) {
    // ~1e-4 relative to the magnitude of the summed terms (f32 accumulation).
    if (!(std::fabs(y[i] - ref.y[i]) <= 1e-4 * ref.abs_sum[i] + 1e-6)) {
      ADD_FAILURE() << c.name << ": index " << i << " got " << y[i] << " want " << ref.y[i];
      ++misses;
    }
  }
}

// clang-format off
const ConvCase kConvCases[] = {
    // name            N   C   H   W    O  KH KW sh sw ph pw bias
    {"1x1",            1,  8,  5,  7,  16, 1, 1, 1, 1, 0, 0, true},
    {"3x3_pad1",       1, 16, 12, 12, 16, 3, 3, 1, 1, 1, 1, true},
    {"3x3_pad1_c128",  1, 128, 8,  8, 128, 3, 3, 1, 1, 1, 1, true},
    {"stride2_pad0",   1,  8,  9,  9,   8, 3, 3, 2, 2, 0, 0, true},
    {"stride2_pad1",   1,  8,  8,  8,  12, 3, 3, 2, 2, 1, 1, false},
    {"non_square",     1,  6, 10,  7,   5, 3, 5, 1, 2, 1, 2, true},
    {"c3_to_o32",      1,  3, 16, 16,  32, 3, 3, 1, 1, 1, 1, true},
    {"o3_from_c32",    1, 32, 11, 13,   3, 3, 3, 1, 1, 1, 1, false},
    {"batch2",         2,  4,  6,  6,   5, 3, 3, 1, 1, 1, 1, false},
    {"batch2_bias",    2, 20,  7,  9,  24, 3, 3, 1, 1, 1, 1, true},
};
// clang-format on

TEST(CpuConv2d, MatchesReferenceAcrossShapes) {
  uint32_t seed = 10;
  for (const ConvCase& c : kConvCases) {
    SCOPED_TRACE(c.name);
    check_conv(c, detail::ConvLayout::kBlocked, seed += 3);
  }
}

TEST(CpuConv2d, PlainLayoutMatchesReference) {
  uint32_t seed = 100;
  for (const ConvCase& c : kConvCases) {
    SCOPED_TRACE(c.name);
    check_conv(c, detail::ConvLayout::kPlain, seed += 3);
  }
}

TEST(CpuConv2d, PublicEntryPointMatchesReference) {
  const ConvCase c{"public", 1, 16, 9, 9, 16, 3, 3, 1, 1, 1, 1, true};
  const Vec x = random_vec(c.N * c.C * c.H * c.W, 7), w = random_vec(c.O * c.C * 9, 8),
            b = random_vec(c.O, 9);
  Vec y(c.N * c.O * c.OH() * c.OW());
  conv2d_f32(x.data(), w.data(), b.data(), y.data(), c.N, c.C, c.H, c.W, c.O, c.KH, c.KW, c.sh,
             c.sw, c.ph, c.pw);
  const ConvRef ref = conv_reference(c, x, w, b.data());
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_NEAR(y[i], ref.y[i], 1e-4 * ref.abs_sum[i] + 1e-6) << i;
}

// The cached primitive is reused for a second layer of the same shape: the new weights
// (and bias) must be used, not stale reordered ones.
TEST(CpuConv2d, SameShapeNewWeightsUsesNewWeights) {
  const ConvCase c{"reuse", 1, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, true};
  check_conv(c, detail::ConvLayout::kBlocked, 200);
  check_conv(c, detail::ConvLayout::kBlocked, 300);
}

// The engine calls kernels from queue worker threads, possibly several at once.
TEST(CpuConv2d, ConcurrentCallsFromWorkerThreads) {
  const ConvCase c{"threads", 1, 16, 10, 10, 16, 3, 3, 1, 1, 1, 1, true};
  std::vector<std::thread> workers;
  for (uint32_t t = 0; t < 3; ++t)
    workers.emplace_back([&c, t] { check_conv(c, detail::ConvLayout::kBlocked, 400 + 10 * t); });
  for (auto& th : workers) th.join();
}

TEST(CpuConv2d, RejectsBadArguments) {
  Vec x(64), w(64), y(64);
  try {
    conv2d_f32(x.data(), w.data(), nullptr, y.data(), 1, 1, 2, 2, 1, 3, 3, 1, 1, 0, 0);
    FAIL() << "kernel larger than input accepted";
  } catch (const kiln::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[conv2d]", 0), 0u) << e.what();
  }
  EXPECT_THROW(conv2d_f32(x.data(), w.data(), nullptr, y.data(), 1, 1, 4, 4, 1, 1, 1, 0, 1, 0, 0),
               kiln::Error);
  EXPECT_THROW(conv2d_f32(nullptr, w.data(), nullptr, y.data(), 1, 1, 4, 4, 1, 1, 1, 1, 1, 0, 0),
               kiln::Error);
}

// ---------------------------------------------------------------- norms references

std::vector<double> layer_norm_ref(const Vec& x, const float* w, const float* b, int64_t rows,
                                   int64_t cols, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * cols;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < cols; ++i) mean += xr[i];
    mean /= cols;
    for (int64_t i = 0; i < cols; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= cols;
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < cols; ++i)
      y[r * cols + i] = (xr[i] - mean) * rstd * (w ? w[i] : 1.0) + (b ? b[i] : 0.0);
  }
  return y;
}

std::vector<double> rms_norm_ref(const Vec& x, const float* w, int64_t rows, int64_t cols,
                                 double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * cols;
    double ms = 0;
    for (int64_t i = 0; i < cols; ++i) ms += double(xr[i]) * xr[i];
    const double scale = 1.0 / std::sqrt(ms / cols + eps);
    for (int64_t i = 0; i < cols; ++i) y[r * cols + i] = xr[i] * scale * (w ? w[i] : 1.0);
  }
  return y;
}

std::vector<double> group_norm_ref(const Vec& x, const float* w, const float* b, int64_t N,
                                   int64_t C, int64_t HW, int64_t groups, double eps) {
  std::vector<double> y(x.size());
  const int64_t cpg = C / groups, len = cpg * HW;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t base = (n * C + g * cpg) * HW;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < len; ++i) mean += x[base + i];
      mean /= len;
      for (int64_t i = 0; i < len; ++i) var += (x[base + i] - mean) * (x[base + i] - mean);
      const double rstd = 1.0 / std::sqrt(var / len + eps);
      for (int64_t i = 0; i < len; ++i) {
        const int64_t c = g * cpg + i / HW;
        y[base + i] = (x[base + i] - mean) * rstd * (w ? w[c] : 1.0) + (b ? b[c] : 0.0);
      }
    }
  return y;
}

std::vector<double> softmax_ref(const Vec& x, int64_t rows, int64_t cols) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * cols;
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < cols; ++i) mx = std::max(mx, double(xr[i]));
    for (int64_t i = 0; i < cols; ++i) sum += std::exp(xr[i] - mx);
    for (int64_t i = 0; i < cols; ++i) y[r * cols + i] = std::exp(xr[i] - mx) / sum;
  }
  return y;
}

// Odd widths exercise the partial-vector tails; 3072 is a FLUX hidden size.
const int64_t kWidths[] = {1, 3, 77, 3072};

// ---------------------------------------------------------------- layer_norm / rms_norm

TEST(CpuLayerNorm, AffineMatchesReference) {
  for (int64_t cols : kWidths) {
    SCOPED_TRACE(cols);
    const int64_t rows = 5;
    // Offset data checks that the variance does not cancel (two-pass algorithm).
    const Vec x = random_vec(rows * cols, 1, 9.0f, 11.0f);
    const Vec w = random_vec(cols, 2, 0.5f, 1.5f), b = random_vec(cols, 3);
    Vec y(x.size());
    layer_norm_rows(x.data(), DType::f32, w.data(), b.data(), y.data(), DType::f32, rows, cols, 1e-6f);
    expect_close(y, layer_norm_ref(x, w.data(), b.data(), rows, cols, 1e-6), 1e-5, 1e-5,
                 "layer_norm affine");
  }
}

TEST(CpuLayerNorm, WithoutAffineMatchesReference) {
  for (int64_t cols : kWidths) {
    SCOPED_TRACE(cols);
    const int64_t rows = 4;
    const Vec x = random_vec(rows * cols, 4, -3.0f, 2.0f);
    Vec y(x.size());
    layer_norm_rows(x.data(), DType::f32, nullptr, nullptr, y.data(), DType::f32, rows, cols, 1e-5f);
    expect_close(y, layer_norm_ref(x, nullptr, nullptr, rows, cols, 1e-5), 1e-5, 1e-5,
                 "layer_norm plain");
  }
}

// Enough rows to take the OpenMP path; also in place (y == x).
TEST(CpuLayerNorm, ManyRowsInPlace) {
  const int64_t rows = 64, cols = 3072;
  const Vec x = random_vec(rows * cols, 5);
  const Vec w = random_vec(cols, 6), b = random_vec(cols, 7);
  Vec y = x;
  layer_norm_rows(y.data(), DType::f32, w.data(), b.data(), y.data(), DType::f32, rows, cols, 1e-6f);
  expect_close(y, layer_norm_ref(x, w.data(), b.data(), rows, cols, 1e-6), 1e-5, 1e-5,
               "layer_norm in place");
}

// bf16 rows are widened, normalised by the f32 kernel and rounded once: the bits of the f32 kernel
// on the widened values, rounded; on one row and on many (the threaded path), also in place.
TEST(CpuNormRows, Bf16RowsAreTheF32KernelOnWidenedValuesRounded) {
  for (const int64_t rows : {int64_t(1), int64_t(64)})
    for (int64_t cols : kWidths) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
      const Vec x = random_vec(rows * cols, 20, -2.0f, 3.0f), w = random_vec(cols, 21), b = random_vec(cols, 22);
      std::vector<uint16_t> x16(x.size());
      convert_from_f32(x.data(), x16.data(), DType::bf16, int64_t(x.size()));
      Vec wide(x.size()), ln(x.size()), rms(x.size());
      convert_to_f32(x16.data(), DType::bf16, wide.data(), int64_t(x.size()));
      layer_norm_rows(wide.data(), DType::f32, w.data(), b.data(), ln.data(), DType::f32, rows, cols, 1e-6f);
      rms_norm_rows(wide.data(), DType::f32, w.data(), rms.data(), DType::f32, rows, cols, 1e-6f);
      std::vector<uint16_t> ln16(x.size()), rms16 = x16;
      layer_norm_rows(x16.data(), DType::bf16, w.data(), b.data(), ln16.data(), DType::bf16, rows, cols, 1e-6f);
      rms_norm_rows(rms16.data(), DType::bf16, w.data(), rms16.data(), DType::bf16, rows, cols, 1e-6f);  // in place
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(ln16[i], f32_to_bf16(ln[i])) << "layer_norm element " << i;
        ASSERT_EQ(rms16[i], f32_to_bf16(rms[i])) << "rms_norm element " << i;
      }
    }
}

TEST(CpuRmsNorm, MatchesReferenceWithAndWithoutWeight) {
  for (int64_t cols : kWidths) {
    SCOPED_TRACE(cols);
    const int64_t rows = 6;
    const Vec x = random_vec(rows * cols, 8, -2.0f, 3.0f);
    const Vec w = random_vec(cols, 9, 0.5f, 1.5f);
    Vec y(x.size());
    rms_norm_rows(x.data(), DType::f32, w.data(), y.data(), DType::f32, rows, cols, 1e-6f);
    expect_close(y, rms_norm_ref(x, w.data(), rows, cols, 1e-6), 1e-5, 1e-5, "rms weighted");
    rms_norm_rows(x.data(), DType::f32, nullptr, y.data(), DType::f32, rows, cols, 1e-6f);
    expect_close(y, rms_norm_ref(x, nullptr, rows, cols, 1e-6), 1e-5, 1e-5, "rms plain");
  }
}

TEST(CpuRmsNorm, ManyRows) {
  const int64_t rows = 128, cols = 640;
  const Vec x = random_vec(rows * cols, 10);
  const Vec w = random_vec(cols, 11);
  Vec y(x.size());
  rms_norm_rows(x.data(), DType::f32, w.data(), y.data(), DType::f32, rows, cols, 1e-6f);
  expect_close(y, rms_norm_ref(x, w.data(), rows, cols, 1e-6), 1e-5, 1e-5, "rms many rows");
}

// ---------------------------------------------------------------- group_norm

TEST(CpuGroupNorm, ThirtyTwoGroupsOf128Channels) {
  const int64_t N = 2, C = 128, groups = 32;
  for (int64_t HW : {int64_t{64}, int64_t{77}}) {
    SCOPED_TRACE(HW);
    const Vec x = random_vec(N * C * HW, 12, -1.0f, 3.0f);
    const Vec w = random_vec(C, 13, 0.5f, 1.5f), b = random_vec(C, 14);
    Vec y(x.size());
    group_norm_nchw(x.data(), w.data(), b.data(), y.data(), N, C, HW, groups, 1e-6f);
    expect_close(y, group_norm_ref(x, w.data(), b.data(), N, C, HW, groups, 1e-6), 1e-5, 1e-5,
                 "group_norm affine");
    group_norm_nchw(x.data(), nullptr, nullptr, y.data(), N, C, HW, groups, 1e-6f);
    expect_close(y, group_norm_ref(x, nullptr, nullptr, N, C, HW, groups, 1e-6), 1e-5, 1e-5,
                 "group_norm plain");
  }
}

// A single group spans many reduction chunks; large enough for the OpenMP path too.
TEST(CpuGroupNorm, SingleGroupAndLargeSpatial) {
  const int64_t N = 1, C = 128, HW = 32 * 32;
  const Vec x = random_vec(N * C * HW, 15, 4.0f, 6.0f);
  const Vec w = random_vec(C, 16), b = random_vec(C, 17);
  for (int64_t groups : {int64_t{1}, int64_t{32}}) {
    SCOPED_TRACE(groups);
    Vec y(x.size());
    group_norm_nchw(x.data(), w.data(), b.data(), y.data(), N, C, HW, groups, 1e-6f);
    expect_close(y, group_norm_ref(x, w.data(), b.data(), N, C, HW, groups, 1e-6), 1e-5, 1e-5,
                 "group_norm large");
  }
}

// GroupNormMath::narrow (bf16 activations) joins each chunk's mean and squared deviations
// instead of summing squares: as accurate as two passes when the values sit far from zero (here
// 1000 + [0, 1), where E[x^2] - mean^2 in f32 would lose every digit), for groups of whole chunks
// and for chunks that run across channels (HW = 77) or end short.
TEST(CpuGroupNorm, ChunkMomentsMatchTheReferenceFarFromZero) {
  const int64_t N = 1, C = 64;
  for (int64_t HW : {int64_t{4096}, int64_t{77}}) {
    for (int64_t groups : {int64_t{4}, int64_t{64}}) {
      SCOPED_TRACE(std::to_string(HW) + " pixels, " + std::to_string(groups) + " groups");
      const Vec x = random_vec(N * C * HW, 18, 1000.0f, 1001.0f);
      const Vec w = random_vec(C, 19, 0.5f, 1.5f), b = random_vec(C, 20);
      const auto ref = group_norm_ref(x, w.data(), b.data(), N, C, HW, groups, 1e-6);
      Vec y(x.size());
      group_norm_nchw(x.data(), w.data(), b.data(), y.data(), N, C, HW, groups, 1e-6f, false,
                      GroupNormMath::narrow);
      expect_close(y, ref, 1e-3, 1e-3, "chunk moments");
      group_norm_nchw(x.data(), w.data(), b.data(), y.data(), N, C, HW, groups, 1e-6f, false, GroupNormMath::f32);
      expect_close(y, ref, 1e-3, 1e-3, "two passes");
    }
  }
}

// GroupNormMath::narrow's SiLU (2^t polynomial, refined reciprocal) against x / (1 + e^-x) in
// double on the same normalized values, shifted from -120 to 120: x itself where e^-x vanishes,
// 0 (to within 1e-30) where it overflows, and in between within the rounding of the exponent
// t = -x log2(e) (2^-24 |t|, |t| <= 126: 5.2e-6 of the result) and a few f32 roundings.
TEST(CpuGroupNorm, NarrowSiluMatchesTheReferenceAcrossItsRange) {
  const int64_t N = 1, C = 240, HW = 256, groups = 240;
  const Vec x = random_vec(N * C * HW, 21, -1.0f, 1.0f);
  Vec b(C);
  for (int64_t c = 0; c < C; ++c) b[size_t(c)] = -120.0f + float(c);
  Vec normalized(x.size()), y(x.size());
  group_norm_nchw(x.data(), nullptr, b.data(), normalized.data(), N, C, HW, groups, 1e-6f, false,
                  GroupNormMath::narrow);
  group_norm_nchw(x.data(), nullptr, b.data(), y.data(), N, C, HW, groups, 1e-6f, true, GroupNormMath::narrow);
  std::vector<double> ref(x.size());
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = normalized[i] / (1.0 + std::exp(-double(normalized[i])));
  expect_close(y, ref, 6e-6, 1e-30, "narrow silu");
}

TEST(CpuGroupNorm, RejectsIndivisibleGroups) {
  Vec x(30), y(30);
  EXPECT_THROW(group_norm_nchw(x.data(), nullptr, nullptr, y.data(), 1, 10, 3, 4, 1e-6f),
               kiln::Error);
}

// ---------------------------------------------------------------- softmax

TEST(CpuSoftmax, RandomRowsMatchReference) {
  for (int64_t cols : kWidths) {
    SCOPED_TRACE(cols);
    const int64_t rows = 7;
    const Vec x = random_vec(rows * cols, 18, -8.0f, 8.0f);
    Vec y(x.size());
    softmax_rows(x.data(), y.data(), rows, cols);
    expect_close(y, softmax_ref(x, rows, cols), 1e-5, 1e-7, "softmax");
  }
}

TEST(CpuSoftmax, LargeValuesAreStable) {
  const int64_t rows = 3, cols = 77;
  Vec x = random_vec(rows * cols, 19, 990.0f, 1000.0f);
  x[5] = 1000.0f;
  for (int64_t i = 0; i < cols; ++i) x[2 * cols + i] = 1000.0f;  // uniform row
  Vec y(x.size());
  softmax_rows(x.data(), y.data(), rows, cols);
  expect_close(y, softmax_ref(x, rows, cols), 1e-5, 1e-7, "softmax large");
  for (int64_t i = 0; i < cols; ++i) EXPECT_NEAR(y[2 * cols + i], 1.0 / cols, 1e-7);
}

TEST(CpuSoftmax, MinusInfinityExceptOne) {
  for (int64_t cols : kWidths) {
    SCOPED_TRACE(cols);
    Vec x(cols, -kInf);
    const int64_t hot = cols / 2;
    x[hot] = 3.5f;
    Vec y(cols, -1.0f);
    softmax_rows(x.data(), y.data(), 1, cols);
    for (int64_t i = 0; i < cols; ++i) EXPECT_EQ(y[i], i == hot ? 1.0f : 0.0f) << i;
  }
}

// PyTorch semantics: a fully masked row (all -inf), a NaN or a +inf input gives NaN.
TEST(CpuSoftmax, DegenerateRowsGiveNaN) {
  const int64_t cols = 19;
  Vec x(3 * cols, 0.5f);
  for (int64_t i = 0; i < cols; ++i) x[i] = -kInf;
  x[cols + 4] = std::nanf("");
  x[2 * cols + 17] = kInf;
  Vec y(x.size());
  softmax_rows(x.data(), y.data(), 3, cols);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_TRUE(std::isnan(y[i])) << i;
}

TEST(CpuSoftmax, ManyRowsInPlace) {
  const int64_t rows = 256, cols = 333;
  const Vec x = random_vec(rows * cols, 20, -20.0f, 20.0f);
  Vec y = x;
  softmax_rows(y.data(), y.data(), rows, cols);
  expect_close(y, softmax_ref(x, rows, cols), 1e-5, 1e-7, "softmax in place");
}

// ---------------------------------------------------------------- determinism / threads

// Each row's reduction order is fixed, so results are bit-identical for any team size.
TEST(CpuNorms, BitIdenticalAcrossThreadCounts) {
  const int64_t rows = 96, cols = 1000, C = 128, HW = 400;
  const Vec x = random_vec(rows * cols, 21, -5.0f, 5.0f);
  const Vec w = random_vec(cols, 22), b = random_vec(cols, 23);
  const auto run_all = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<Vec> out(4, Vec(x.size()));
    layer_norm_rows(x.data(), DType::f32, w.data(), b.data(), out[0].data(), DType::f32, rows, cols, 1e-6f);
    rms_norm_rows(x.data(), DType::f32, w.data(), out[1].data(), DType::f32, rows, cols, 1e-6f);
    softmax_rows(x.data(), out[2].data(), rows, cols);
    group_norm_nchw(x.data(), w.data(), b.data(), out[3].data(), 1, C, HW, 32, 1e-6f);
    omp_set_num_threads(saved);
    return out;
  };
  const std::vector<Vec> one = run_all(1), four = run_all(4);
  for (size_t k = 0; k < one.size(); ++k)
    EXPECT_EQ(std::memcmp(one[k].data(), four[k].data(), one[k].size() * sizeof(float)), 0)
        << "kernel " << k;
}

TEST(CpuNorms, RunFromWorkerThread) {
  const int64_t rows = 32, cols = 2048;
  const Vec x = random_vec(rows * cols, 24);
  Vec y(x.size());
  std::thread worker(
      [&] { layer_norm_rows(x.data(), DType::f32, nullptr, nullptr, y.data(), DType::f32, rows, cols, 1e-6f); });
  worker.join();
  expect_close(y, layer_norm_ref(x, nullptr, nullptr, rows, cols, 1e-6), 1e-5, 1e-5,
               "layer_norm on worker");
}

}  // namespace
}  // namespace kiln::cpu
