// The exponentials of the bf16 attention softmax (exp2_to_bf16.h) against exp2 in double: their
// f32 values within a few f32 roundings, their bf16 values those of the exact exponential but for
// rare rounding ties, and the edges a softmax reaches (masked keys, NaN scores, row tails).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "devices/cpu/kernels/exp2_to_bf16.h"

namespace kiln::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Exponents from −126 to 0 (a softmax's: at most 0 after the max is taken off), 2^20 steps.
std::vector<float> exponent_sweep() {
  std::vector<float> t;
  constexpr int kSteps = 1 << 20;
  for (int i = 0; i <= kSteps; ++i) t.push_back(-126.0f * float(i) / float(kSteps));
  return t;
}

TEST(Exp2ToBf16, ValuesAreWithinAFewF32RoundingsOfTheExactOnes) {
  double worst = 0;
  for (const float t : exponent_sweep()) {
    const double exact = std::exp2(double(t));
    worst = std::max(worst, std::abs(double(exp2_narrow(t)) - exact) / exact);
  }
  // The polynomial's own error is 7.5e-8; its f32 coefficients and evaluation bring it to 2.1e-7.
  EXPECT_LE(worst, 3e-7);
}

// Stored bf16 values are the f32 values rounded as f32_to_bf16 rounds, and those of the exact
// exponential but where the two f32 values straddle a bf16 rounding boundary.
TEST(Exp2ToBf16, Bf16ValuesAreTheExactExponentialsRoundedButForRareTies) {
  const std::vector<float> t = exponent_sweep();
  std::vector<uint16_t> out(t.size());
  const float sum = exp2_sum_to_bf16(t.data(), int64_t(t.size()), 1.0f, 0.0f, out.data());
  size_t ties = 0;
  double exact_sum = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    ASSERT_EQ(out[i], f32_to_bf16(exp2_narrow(t[i]))) << "t = " << t[i];
    const uint16_t exact = f32_to_bf16(float(std::exp2(double(t[i]))));
    ASSERT_LE(std::abs(int(out[i]) - int(exact)), 1) << "t = " << t[i];
    ties += out[i] != exact;
    exact_sum += std::exp2(double(t[i]));
  }
  EXPECT_LE(double(ties), 1e-3 * double(t.size()));
  // An f32 sum of 2^20 values, ~2^15 to a lane: its own rounding is what this bound allows.
  EXPECT_NEAR(sum, exact_sum, 1e-4 * exact_sum);
}

// out = bf16(2^(a·s − b)) with the scale a and shift b of a softmax; lengths that are not whole
// vectors store exactly n values and sum only those.
TEST(Exp2ToBf16, ScalesShiftsAndStoresOnlyTheRowsValues) {
  const float a = 0.125f * 1.44269504f, b = 3.0f * a;
  for (const int64_t n : {0, 1, 5, 16, 17, 31, 32, 33, 100}) {
    std::vector<float> s(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) s[size_t(j)] = 3.0f - 0.37f * float(j);
    std::vector<uint16_t> out(size_t(n) + 8, 0xabcd);
    const float sum = exp2_sum_to_bf16(s.data(), n, a, b, out.data());
    double expected = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float p = exp2_narrow(std::fma(s[size_t(j)], a, -b));
      EXPECT_EQ(out[size_t(j)], f32_to_bf16(p)) << "n " << n << ", j " << j;
      expected += p;
    }
    for (size_t j = size_t(n); j < out.size(); ++j) EXPECT_EQ(out[j], 0xabcd) << "written past n = " << n;
    EXPECT_NEAR(sum, expected, 1e-6 * std::max(1.0, expected)) << "n " << n;
    if (n > 0) {
      EXPECT_EQ(out[0], f32_to_bf16(1.0f)) << "the max's probability";
    }
  }
}

// A masked key (−inf) and exponents under bf16's smallest normal give exactly 0; a NaN score gives
// a NaN probability and a NaN sum, so that the row's output is NaN (as in PyTorch).
TEST(Exp2ToBf16, MaskedUnderflowingAndNaNScores) {
  const std::vector<float> s{-kInf, -126.5f, -127.0f, -200.0f, -126.0f, -125.7f, 0.0f};
  std::vector<uint16_t> out(s.size());
  const float sum = exp2_sum_to_bf16(s.data(), int64_t(s.size()), 1.0f, 0.0f, out.data());
  for (size_t j = 0; j < 4; ++j) EXPECT_EQ(out[j], 0) << "t = " << s[j];
  EXPECT_EQ(bf16_to_f32(out[4]), std::ldexp(1.0f, -126));
  EXPECT_GT(bf16_to_f32(out[5]), bf16_to_f32(out[4]));
  EXPECT_EQ(out[6], f32_to_bf16(1.0f));
  EXPECT_FLOAT_EQ(sum, 1.0f + exp2_narrow(-126.0f) + exp2_narrow(-125.7f));

  const std::vector<float> with_nan{0.0f, std::numeric_limits<float>::quiet_NaN(), -1.0f};
  std::vector<uint16_t> nan_out(with_nan.size());
  EXPECT_TRUE(std::isnan(exp2_sum_to_bf16(with_nan.data(), 3, 1.0f, 0.0f, nan_out.data())));
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan_out[1])));
  EXPECT_EQ(nan_out[2], f32_to_bf16(0.5f));
}

}  // namespace
}  // namespace kiln::cpu
