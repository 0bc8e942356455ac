// bf16 attention and conv2d on the CPU device against the f32 kernels on the same bf16-rounded
// values: strided q/k/v and output views, masks, rounding points, and results that do not
// depend on the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <vector>

#include "core/attrs.h"
#include "core/dtype.h"
#include "core/tensor_view.h"
#include "devices/cpu/kernels/attention.h"
#include "devices/cpu/kernels/conv2d.h"
#include "devices/cpu/kernels/linear_gemm.h"
#include "devices/cpu/kernels/onednn.h"
#include "devices/cpu/kernels/kernel_table.h"

namespace kiln::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// bf16 keeps 8 significant bits: rounding to nearest is off by at most 2^-8 of the value.
constexpr double kBf16Eps = 1.0 / 256;

using Bits = std::vector<uint16_t>;

// Random values already on the bf16 grid, as bf16 bits and as the same values in f32.
struct Bf16Data {
  Bits bits;
  std::vector<float> f32;
};

Bf16Data random_bf16(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Bf16Data d{Bits(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    d.bits[i] = f32_to_bf16(dist(rng));
    d.f32[i] = bf16_to_f32(d.bits[i]);
  }
  return d;
}

std::vector<float> widen(const Bits& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
  return f;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs `fn` with OpenMP limited to `threads`, restoring the previous limit.
template <typename Fn>
void with_threads(int threads, Fn&& fn) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  fn();
  omp_set_num_threads(before);
}

// ---------------------------------------------------------------------------------------
// attention

struct AttnShape {
  int64_t B, H, Lq, Lk, D, Dv;
  size_t q_size() const { return size_t(B * H * Lq * D); }
  size_t k_size() const { return size_t(B * H * Lk * D); }
  size_t v_size() const { return size_t(B * H * Lk * Dv); }
  size_t o_size() const { return size_t(B * H * Lq * Dv); }
  float scale() const { return 1.0f / std::sqrt(float(D)); }
};

struct AttnData {
  AttnShape s;
  Bf16Data q, k, v;
};

// `spread` widens q so the scores span a larger range (a peakier softmax).
AttnData make_data(const AttnShape& s, float spread = 2.0f) {
  return {s, random_bf16(s.q_size(), 31, -spread, spread), random_bf16(s.k_size(), 32), random_bf16(s.v_size(), 33)};
}

AttentionOperand dense_bf16(const Bits& b, int64_t H, int64_t L, int64_t D) {
  return {b.data(), DType::bf16, RowLayout::dense(H, L, D)};
}

// The bf16 kernel on dense q/k/v; out is f32 (out_bf16 false) or bf16, returned widened. With
// `products` given, the kernel multiplies that way (else as this process does).
std::vector<float> run_bf16(const AttnData& a, const float* mask, const int64_t* ms, bool out_bf16,
                            std::optional<AttentionProducts> products = std::nullopt) {
  const AttnShape& s = a.s;
  std::vector<float> out_f(s.o_size(), -7.0f);
  Bits out_b(s.o_size(), 0x7fc0);
  const AttentionOperand out = out_bf16 ? AttentionOperand{out_b.data(), DType::bf16, RowLayout::dense(s.H, s.Lq, s.Dv)}
                                        : AttentionOperand{out_f.data(), DType::f32, RowLayout::dense(s.H, s.Lq, s.Dv)};
  const AttentionOperand q = dense_bf16(a.q.bits, s.H, s.Lq, s.D), k = dense_bf16(a.k.bits, s.H, s.Lk, s.D),
                         v = dense_bf16(a.v.bits, s.H, s.Lk, s.Dv);
  if (products) {
    detail::attention_with(*products, q, k, v, mask, ms, out, s.B, s.H, s.Lq, s.Lk, s.D, s.Dv, s.scale());
  } else {
    attention(q, k, v, mask, ms, out, s.B, s.H, s.Lq, s.Lk, s.D, s.Dv, s.scale());
  }
  return out_bf16 ? widen(out_b) : out_f;
}

std::vector<float> run_f32(const AttnData& a, const float* mask, const int64_t* ms) {
  const AttnShape& s = a.s;
  std::vector<float> out(s.o_size(), -7.0f);
  attention_f32(a.q.f32.data(), a.k.f32.data(), a.v.f32.data(), mask, ms, out.data(), s.B, s.H, s.Lq, s.Lk, s.D,
                s.Dv, s.scale());
  return out;
}

// The bf16 kernel differs from the f32 one on the same values only where it rounds:
//  - each probability multiplying v is rounded to bf16 (relative error <= 2^-8) while the row
//    sum is not, so an output moves by at most 2^-8 * sum_j p_j |v_j| / sum_j p_j <= 2^-8 max|v|;
//  - a bf16 output is rounded once more: 2^-8 of its value;
// plus f32 rounding noise of the two kernels, 1e-5 of the output's scale (as the f32 tests).
void expect_close_to_f32(const std::vector<float>& got, const std::vector<float>& f32, float max_abs_v,
                         bool out_bf16) {
  ASSERT_EQ(got.size(), f32.size());
  double sq = 0;
  size_t n = 0;
  for (float r : f32) {
    if (std::isnan(r)) continue;
    sq += double(r) * r;
    ++n;
  }
  const double rms = std::sqrt(sq / double(std::max<size_t>(1, n)));
  for (size_t i = 0; i < f32.size(); ++i) {
    ASSERT_EQ(std::isnan(got[i]), std::isnan(f32[i])) << "at " << i;
    if (std::isnan(f32[i])) continue;
    const double tol = kBf16Eps * max_abs_v + (out_bf16 ? kBf16Eps * std::abs(f32[i]) : 0.0) +
                       1e-5 * (std::abs(f32[i]) + rms);
    ASSERT_NEAR(got[i], f32[i], tol) << "at " << i;
  }
}

class Bf16AttentionShapes : public ::testing::TestWithParam<AttnShape> {};

// Both ways of multiplying bf16 tiles (widened to f32, or oneDNN's bf16 matmul) run on any CPU
// with AVX-512 (emulated without AVX512-BF16), whichever this process would pick. On an AVX2-only
// CPU oneDNN has no bf16 matmul: only the widened products run there (and are what the process
// picks, Bf16Attention.ProcessMultipliesInBf16WhereBf16MultipliesFast).
std::vector<AttentionProducts> bf16_products() {
  std::vector<AttentionProducts> products = {AttentionProducts::kWidened};
  if (onednn::bf16_primitives_available()) products.push_back(AttentionProducts::kBf16Dot);
  return products;
}

// The conv maths this CPU runs: oneDNN's bf16 kernels only where it has them.
std::vector<detail::ConvMath> conv_maths() {
  std::vector<detail::ConvMath> maths = {detail::ConvMath::kF32};
  if (onednn::bf16_primitives_available()) maths.push_back(detail::ConvMath::kBf16);
  return maths;
}

TEST_P(Bf16AttentionShapes, MatchesF32KernelOnTheSameValues) {
  const AttnData a = make_data(GetParam());
  const auto ref = run_f32(a, nullptr, nullptr);
  for (const AttentionProducts p : bf16_products()) {
    SCOPED_TRACE(p == AttentionProducts::kBf16Dot ? "bf16 dot products" : "widened products");
    expect_close_to_f32(run_bf16(a, nullptr, nullptr, false, p), ref, 1.0f, false);
    expect_close_to_f32(run_bf16(a, nullptr, nullptr, true, p), ref, 1.0f, true);
  }
}

// A bf16 output is the f32 accumulator rounded once: exactly the f32 output's rounding.
TEST_P(Bf16AttentionShapes, Bf16OutputIsTheF32OutputRoundedOnce) {
  const AttnData a = make_data(GetParam());
  for (const AttentionProducts p : bf16_products()) {
    const auto wide = run_bf16(a, nullptr, nullptr, false, p);
    const auto narrow = run_bf16(a, nullptr, nullptr, true, p);
    for (size_t i = 0; i < wide.size(); ++i)
      ASSERT_EQ(narrow[i], bf16_to_f32(f32_to_bf16(wide[i]))) << "at " << i << ", products " << int(p);
  }
}

// Without a mask, the bf16 dot products' softmax takes each row in two passes (max of the raw
// scores; then 2^(scale·log2(e)·(score − max)), summed and rounded to bf16: exp2_to_bf16.h); with
// a mask it takes each step in turn with the general exp. A mask of zeros changes no score, so the
// two differ only by their exponentials' last bits (~1e-7): the row sums' last bits, f32 noise in
// every output, and, where that moves a probability across a bf16 rounding boundary, one bf16
// step of that probability (2^-8 of p_j / sum p, so at most 2^-8 max|v| for the row, whatever
// the number of such). A wrong scale, max or row tail would be far off both bounds.
TEST_P(Bf16AttentionShapes, OnePassSoftmaxAgreesWithTheStepwiseOne) {
  const AttnData a = make_data(GetParam());
  const AttnShape& s = GetParam();
  const std::vector<float> zeros(size_t(s.B * s.Lk), 0.0f);
  const int64_t ms[4] = {s.Lk, 0, 0, 1};
  for (const AttentionProducts p : bf16_products()) {
    SCOPED_TRACE(p == AttentionProducts::kBf16Dot ? "bf16 dot products" : "widened products");
    const auto one_pass = run_bf16(a, nullptr, nullptr, false, p);
    const auto stepwise = run_bf16(a, zeros.data(), ms, false, p);
    ASSERT_EQ(one_pass.size(), stepwise.size());
    std::vector<double> diff(one_pass.size());
    for (size_t i = 0; i < one_pass.size(); ++i) {
      diff[i] = std::abs(double(one_pass[i]) - double(stepwise[i]));
      ASSERT_LE(diff[i], kBf16Eps) << "at " << i << ": " << one_pass[i] << " against " << stepwise[i];  // |v| <= 1
    }
    std::nth_element(diff.begin(), diff.begin() + diff.size() / 2, diff.end());
    EXPECT_LE(diff[diff.size() / 2], 1e-6) << "median difference";
  }
}

INSTANTIATE_TEST_SUITE_P(Bf16Attention, Bf16AttentionShapes,
                         ::testing::Values(AttnShape{2, 3, 77, 333, 40, 24},    // Lq != Lk, D != Dv
                                           AttnShape{1, 2, 300, 1100, 64, 64},  // several query and key blocks
                                           AttnShape{2, 1, 5, 3, 7, 9},         // tiny, odd
                                           AttnShape{1, 1, 259, 17, 33, 65}),   // Lk < lanes
                         [](const ::testing::TestParamInfo<AttnShape>& i) {
                           const AttnShape& a = i.param;
                           std::ostringstream name;
                           name << "B" << a.B << "H" << a.H << "Lq" << a.Lq << "Lk" << a.Lk << "D" << a.D << "Dv" << a.Dv;
                           return name.str();
                         });

// The probabilities that multiply a bf16 v are bf16 (as in bf16 flash attention); the row sum
// that divides them is not. Two keys with scores 0 and s1: out = bf16(p1) * v1 / (1 + p1).
TEST(Bf16Attention, ProbabilitiesMultiplyingVAreRoundedToBf16) {
  const uint16_t q = f32_to_bf16(1.0f), one = f32_to_bf16(1.0f), zero = 0;
  const Bits k{zero, f32_to_bf16(-1.2f)}, v{zero, one};
  float out = 0;
  attention({&q, DType::bf16, RowLayout::dense(1, 1, 1)}, {k.data(), DType::bf16, RowLayout::dense(1, 2, 1)},
            {v.data(), DType::bf16, RowLayout::dense(1, 2, 1)}, nullptr, nullptr,
            {&out, DType::f32, RowLayout::dense(1, 1, 1)}, 1, 1, 1, 2, 1, 1, 1.0f);
  const float p1 = std::exp(bf16_to_f32(k[1]));
  const double expected = double(bf16_to_f32(f32_to_bf16(p1))) / (1.0 + p1);
  const double unrounded = double(p1) / (1.0 + p1);
  ASSERT_GT(std::abs(expected - unrounded), 1e-4);  // the case tells the two apart
  EXPECT_NEAR(out, expected, 1e-6);
}

// Key-padding mask [B,1,1,Lk] with -inf, a per-head mask, a fully masked row (zeros, as in
// the f32 kernel) and a NaN query (a NaN row).
TEST(Bf16Attention, MasksFullyMaskedRowsAndNaNBehaveAsF32) {
  const AttnShape s{2, 3, 70, 600, 16, 8};
  AttnData a = make_data(s);
  std::vector<float> mask(size_t(s.B * s.Lk), 0.0f);
  for (int64_t j = 200; j < s.Lk; ++j) mask[size_t(j)] = -kInf;
  for (int64_t j = 0; j < s.Lk; j += 3) mask[size_t(s.Lk + j)] = -kInf;
  const int64_t pad_ms[4] = {s.Lk, 0, 0, 1};
  expect_close_to_f32(run_bf16(a, mask.data(), pad_ms, true), run_f32(a, mask.data(), pad_ms), 1.0f, true);

  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> full(size_t(s.B * s.H * s.Lq * s.Lk));
  for (float& m : full) m = dist(rng);
  for (int64_t j = 0; j < s.Lk; ++j) full[size_t(5 * s.Lk + j)] = -kInf;  // b0 h0 row 5: all masked
  const int64_t full_ms[4] = {s.H * s.Lq * s.Lk, s.Lq * s.Lk, s.Lk, 1};
  a.q.bits[size_t((s.Lq + 3) * s.D + 2)] = 0x7fc0;  // b0 h1 query 3: NaN
  a.q.f32 = widen(a.q.bits);
  const auto got = run_bf16(a, full.data(), full_ms, false);
  expect_close_to_f32(got, run_f32(a, full.data(), full_ms), 1.0f, false);
  for (int64_t e = 0; e < s.Dv; ++e) EXPECT_EQ(got[size_t(5 * s.Dv + e)], 0.0f);
  for (int64_t row = 0; row < s.B * s.H * s.Lq; ++row)
    EXPECT_EQ(std::isnan(got[size_t(row * s.Dv)]), row == s.Lq + 3) << "row " << row;
}

// Through the sdpa kernel: q/k/v as [B,L,H,D] buffers viewed as [B,H,L,D] (a transposed
// projection, read in place) and the output written through a [B,L,H,Dv] view give exactly the
// bits of dense tensors; the rows' placement changes nothing else.
TEST(Bf16Attention, StridedViewsGiveTheBitsOfDenseTensors) {
  const AttnShape s{2, 3, 150, 150, 32, 32};
  const AttnData a = make_data(s);
  KernelTable table;
  add_contraction_kernels(table);
  const Attrs attrs;
  // [B,H,L,D] values -> a [B,L,H,D] buffer and the [B,H,L,D] view of it.
  const auto to_blhd = [&](const Bits& x, int64_t L, int64_t D) {
    Bits t(x.size());
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t l = 0; l < L; ++l)
          for (int64_t d = 0; d < D; ++d)
            t[size_t(((b * L + l) * s.H + h) * D + d)] = x[size_t(((b * s.H + h) * L + l) * D + d)];
    return t;
  };
  const auto view = [&](void* p, DType dt, int64_t L, int64_t D) {
    return TensorView{p, {s.B, s.H, L, D}, {L * s.H * D, D, s.H * D, 1}, dt};
  };
  const auto dense = [&](void* p, DType dt, int64_t L, int64_t D) {
    return TensorView{p, {s.B, s.H, L, D}, {s.H * L * D, L * D, D, 1}, dt};
  };
  Bits q = a.q.bits, k = a.k.bits, v = a.v.bits;
  Bits qt = to_blhd(q, s.Lq, s.D), kt = to_blhd(k, s.Lk, s.D), vt = to_blhd(v, s.Lk, s.Dv);
  for (DType out_dtype : {DType::bf16, DType::f32}) {
    const size_t es = dtype_size(out_dtype);
    std::vector<char> out_dense(s.o_size() * es), out_strided(s.o_size() * es);
    table.at("sdpa").run({{dense(q.data(), DType::bf16, s.Lq, s.D), dense(k.data(), DType::bf16, s.Lk, s.D),
                       dense(v.data(), DType::bf16, s.Lk, s.Dv)},
                      dense(out_dense.data(), out_dtype, s.Lq, s.Dv),
                      &attrs});
    table.at("sdpa").run({{view(qt.data(), DType::bf16, s.Lq, s.D), view(kt.data(), DType::bf16, s.Lk, s.D),
                       view(vt.data(), DType::bf16, s.Lk, s.Dv)},
                      view(out_strided.data(), out_dtype, s.Lq, s.Dv),
                      &attrs});
    // The strided output holds [B,L,H,Dv]: compare row by row.
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t l = 0; l < s.Lq; ++l) {
          const size_t d_off = size_t(((b * s.H + h) * s.Lq + l) * s.Dv) * es;
          const size_t s_off = size_t(((b * s.Lq + l) * s.H + h) * s.Dv) * es;
          ASSERT_EQ(std::memcmp(out_dense.data() + d_off, out_strided.data() + s_off, size_t(s.Dv) * es), 0)
              << dtype_name(out_dtype) << " b" << b << " h" << h << " row " << l;
        }
  }
}

// Every output row is computed by one thread in a fixed order, so 1 and 2 threads agree bitwise.
TEST(Bf16Attention, ThreadCountDoesNotChangeTheBits) {
  const AttnShape s{1, 3, 300, 700, 64, 64};
  const AttnData a = make_data(s);
  for (const AttentionProducts p : bf16_products())
    for (bool out_bf16 : {false, true}) {
      std::vector<float> one, two;
      with_threads(1, [&] { one = run_bf16(a, nullptr, nullptr, out_bf16, p); });
      with_threads(2, [&] { two = run_bf16(a, nullptr, nullptr, out_bf16, p); });
      EXPECT_TRUE(same_bits(one, two)) << "out bf16: " << out_bf16 << ", products " << int(p);
    }
}

// bf16 q/k/v multiply in bf16 exactly where linears and convolutions do (AMX, AMD's AVX512-BF16);
// all-f32 operands never widen, and mixed ones widen.
TEST(Bf16Attention, ProcessMultipliesInBf16WhereBf16MultipliesFast) {
  const DType b = DType::bf16, f = DType::f32;
  EXPECT_EQ(attention_products(b, b, b, b) == AttentionProducts::kBf16Dot, onednn::bf16_dot_products_fast());
  EXPECT_EQ(attention_products(b, b, b, b) == AttentionProducts::kBf16Dot,
            bf16_linear_path() != Bf16LinearPath::widened);
  EXPECT_EQ(attention_products(f, f, f, f), AttentionProducts::kF32);
  EXPECT_EQ(attention_products(b, b, f, f), AttentionProducts::kWidened);
  EXPECT_EQ(detail::conv2d_bf16_math() == detail::ConvMath::kBf16, onednn::bf16_dot_products_fast());
}

TEST(Bf16Attention, WorkspaceStaysFarBelowTheScoreMatrix) {
  const int64_t L = 4608;
  const size_t ws = attention_workspace_bytes(L, L, 128, 128, true);
  EXPECT_GT(ws, attention_workspace_bytes(L, L, 128, 128, false));  // the widened tiles
  EXPECT_LT(ws, size_t(L * L * 4) / 8);                              // < 1/8 of ONE head's scores
}

// ---------------------------------------------------------------------------------------
// conv2d

struct ConvShape {
  int64_t N, C, H, W, O, K, stride, pad;
  int64_t OH() const { return (H + 2 * pad - K) / stride + 1; }
  int64_t OW() const { return (W + 2 * pad - K) / stride + 1; }
  size_t x_size() const { return size_t(N * C * H * W); }
  size_t w_size() const { return size_t(O * C * K * K); }
  size_t y_size() const { return size_t(N * O * OH() * OW()); }
};

struct ConvData {
  ConvShape s;
  Bf16Data x, w, b;
};

ConvData make_conv(const ConvShape& s) {
  return {s, random_bf16(s.x_size(), 41), random_bf16(s.w_size(), 42, -0.2f, 0.2f), random_bf16(size_t(s.O), 43)};
}

std::vector<float> conv_f32(const ConvData& c) {
  const ConvShape& s = c.s;
  std::vector<float> y(s.y_size());
  conv2d_f32(c.x.f32.data(), c.w.f32.data(), c.b.f32.data(), y.data(), s.N, s.C, s.H, s.W, s.O, s.K, s.K, s.stride,
             s.stride, s.pad, s.pad);
  return y;
}

// bf16 x and w through conv2d_with_math; bias in `bias_dtype`; y f32 or bf16 (returned widened).
std::vector<float> conv_bf16(detail::ConvMath math, const ConvData& c, DType bias_dtype, bool y_bf16) {
  const ConvShape& s = c.s;
  std::vector<float> yf(s.y_size());
  Bits yb(s.y_size());
  const ConvOperand bias = bias_dtype == DType::bf16 ? ConvOperand{c.b.bits.data(), DType::bf16}
                                                     : ConvOperand{c.b.f32.data(), DType::f32};
  detail::conv2d_with_math(math, {c.x.bits.data(), DType::bf16}, {c.w.bits.data(), DType::bf16}, bias,
                           y_bf16 ? static_cast<void*>(yb.data()) : yf.data(), y_bf16 ? DType::bf16 : DType::f32, s.N,
                           s.C, s.H, s.W, s.O, s.K, s.K, s.stride, s.stride, s.pad, s.pad);
  return y_bf16 ? widen(yb) : yf;
}

// Sum over each output's window of |x| |w| (+ |bias|): the scale of its accumulation error.
std::vector<double> abs_sums(const ConvData& c) {
  const ConvShape& s = c.s;
  std::vector<double> r(s.y_size());
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t o = 0; o < s.O; ++o)
      for (int64_t oh = 0; oh < s.OH(); ++oh)
        for (int64_t ow = 0; ow < s.OW(); ++ow) {
          double a = std::abs(c.b.f32[size_t(o)]);
          for (int64_t ch = 0; ch < s.C; ++ch)
            for (int64_t kh = 0; kh < s.K; ++kh)
              for (int64_t kw = 0; kw < s.K; ++kw) {
                const int64_t ih = oh * s.stride - s.pad + kh, iw = ow * s.stride - s.pad + kw;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                a += std::abs(c.x.f32[size_t(((n * s.C + ch) * s.H + ih) * s.W + iw)]) *
                     std::abs(c.w.f32[size_t(((o * s.C + ch) * s.K + kh) * s.K + kw)]);
              }
          r[size_t(((n * s.O + o) * s.OH() + oh) * s.OW() + ow)] = a;
        }
  return r;
}

class Bf16ConvShapes : public ::testing::TestWithParam<ConvShape> {};

// f32 math: the reorders widen bf16 exactly and the f32 primitive runs, so an f32 y has the f32
// kernel's bits and a bf16 y is that rounded once (oneDNN rounds to nearest even, as kiln does).
TEST_P(Bf16ConvShapes, F32MathGivesTheF32KernelsBits) {
  const ConvData c = make_conv(GetParam());
  const auto ref = conv_f32(c);
  for (DType bias_dtype : {DType::f32, DType::bf16}) {
    EXPECT_TRUE(same_bits(conv_bf16(detail::ConvMath::kF32, c, bias_dtype, false), ref));
    const auto y = conv_bf16(detail::ConvMath::kF32, c, bias_dtype, true);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(y[i], bf16_to_f32(f32_to_bf16(ref[i]))) << "at " << i;
  }
}

// bf16 math (oneDNN's bf16 kernels) sums the same exact products in another order: within f32
// accumulation error, 1e-5 of the sum of |terms| (K <= 1152 terms, each rounding 2^-24), plus
// 2^-8 of the value for a bf16 y.
TEST_P(Bf16ConvShapes, Bf16MathMatchesTheF32Kernel) {
  if (!onednn::bf16_primitives_available()) {  // no bf16 kernels: the process never picks them
    EXPECT_EQ(detail::conv2d_bf16_math(), detail::ConvMath::kF32);
    return;
  }
  const ConvData c = make_conv(GetParam());
  const auto ref = conv_f32(c);
  const auto scale = abs_sums(c);
  for (bool y_bf16 : {false, true}) {
    const auto y = conv_bf16(detail::ConvMath::kBf16, c, DType::bf16, y_bf16);
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_NEAR(y[i], ref[i], 1e-5 * scale[i] + (y_bf16 ? kBf16Eps * std::abs(ref[i]) : 0.0))
          << "at " << i << " y bf16 " << y_bf16;
  }
}

INSTANTIATE_TEST_SUITE_P(Bf16Conv, Bf16ConvShapes,
                         ::testing::Values(ConvShape{1, 32, 20, 20, 48, 3, 1, 1},   // 3x3, pad 1
                                           ConvShape{2, 40, 9, 13, 24, 1, 1, 0},    // 1x1, odd sizes
                                           ConvShape{1, 16, 17, 17, 32, 3, 2, 0},   // 3x3, stride 2
                                           ConvShape{1, 128, 16, 16, 128, 3, 1, 1}  // VAE channels
                                           ),
                         [](const ::testing::TestParamInfo<ConvShape>& i) {
                           const ConvShape& c = i.param;
                           std::ostringstream name;
                           name << "C" << c.C << "x" << c.H << "x" << c.W << "O" << c.O << "K" << c.K << "s" << c.stride
                                << "p" << c.pad << "N" << c.N;
                           return name.str();
                         });

TEST(Bf16Conv, ThreadCountDoesNotChangeTheBits) {
  const ConvData c = make_conv({1, 64, 32, 32, 64, 3, 1, 1});
  for (auto math : conv_maths()) {
    std::vector<float> one, two;
    with_threads(2, [&] { two = conv_bf16(math, c, DType::bf16, true); });
    with_threads(1, [&] { one = conv_bf16(math, c, DType::bf16, true); });
    EXPECT_TRUE(same_bits(one, two)) << "math " << int(math);
  }
}

// The conv2d kernel hands bf16 tensors to conv2d() as they are, with this CPU's math.
TEST(Bf16Conv, KernelTakesBf16TensorsDirectly) {
  const ConvData c = make_conv({1, 24, 12, 12, 16, 3, 1, 1});
  const ConvShape& s = c.s;
  KernelTable table;
  add_contraction_kernels(table);
  const Attrs attrs{{"stride", std::vector<int64_t>{1, 1}}, {"padding", std::vector<int64_t>{1, 1}}};
  Bits x = c.x.bits, w = c.w.bits, b = c.b.bits, y(s.y_size());
  table.at("conv2d").run({{TensorView{x.data(), {s.N, s.C, s.H, s.W}, contiguous_strides({s.N, s.C, s.H, s.W}), DType::bf16},
                       TensorView{w.data(), {s.O, s.C, s.K, s.K}, contiguous_strides({s.O, s.C, s.K, s.K}), DType::bf16},
                       TensorView{b.data(), {s.O}, {1}, DType::bf16}},
                      TensorView{y.data(), {s.N, s.O, s.OH(), s.OW()}, contiguous_strides({s.N, s.O, s.OH(), s.OW()}),
                                 DType::bf16},
                      &attrs});
  EXPECT_EQ(widen(y), conv_bf16(detail::conv2d_bf16_math(), c, DType::bf16, true));
}

}  // namespace
}  // namespace kiln::cpu
