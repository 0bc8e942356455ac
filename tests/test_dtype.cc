// Exact dtype conversions: round-to-nearest-even for bf16/f16, subnormals, overflow, NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"

namespace kiln {
namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), h) << "f16 bits " << h;
  }
}

TEST(DType, BF16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_bf16(f), h) << "bf16 bits " << h;
  }
}

TEST(DType, BF16RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between bf16 1.0 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000)), 0x3f80);
  // 1 + 3*2^-8 lies between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to even.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000)), 0x3f82);
  // Just above the tie rounds up.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, F16RoundsToNearestEvenIncludingSubnormals) {
  // 1 + 2^-11 is a tie between 1.0 and 1 + 2^-10: goes to 1.0 (even).
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds past the largest finite value: inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie with zero: to even (zero)
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: to even (2)
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
}

TEST(DType, PromotionFollowsTorch) {
  EXPECT_EQ(promote(DType::bf16, DType::bf16), DType::bf16);
  EXPECT_EQ(promote(DType::bf16, DType::f16), DType::f32);
  EXPECT_EQ(promote(DType::i64, DType::bf16), DType::bf16);
  EXPECT_EQ(promote(DType::i32, DType::i64), DType::i64);
  EXPECT_EQ(promote(DType::boolean, DType::i32), DType::i32);
}

}  // namespace
}  // namespace kiln
