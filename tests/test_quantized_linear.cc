// Linears on quantized weights (fp8, ggml blocks): every storage type against the linear on the
// dequantized weight, on the GEMM path (many rows, panel by panel) and the GEMV path (one row),
// with no whole-weight f32 copy; quantization at load through nn::Weights.
#include <cmath>
#include <limits>
#include <memory>

#include "core/quant_blocks.h"
#include "devices/cpu/kernels/f32_io.h"
#include "devices/cpu/kernels/linear_gemm.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "nn/layers.h"
#include "nn/weight_quantization.h"
#include "test_util.h"

namespace kiln {
namespace {

struct Case {
  DType w;
  DType x;
  int64_t rows;
};

std::string name_of(const testing::TestParamInfo<Case>& info) {
  return std::string(dtype_name(info.param.w)) + "_x" + dtype_name(info.param.x) + "_rows" +
         std::to_string(info.param.rows);
}

class QuantizedLinear : public testing::TestWithParam<Case> {};

constexpr int64_t kN = 96, kK = 512;  // K: two q4_k/q5_k blocks per row

// The dequantized-weight reference: the same linear with the weight's f32 values (exact
// dequantization) in an f32 tensor. Bound per output element, scaled by sum_k |x_k w_k|:
// f32 x: both sum the same f32 products in different blockings: 1e-5.
// bf16 x with bf16 dot products: each weight is rounded once to bf16 (2^-9 relative): 2^-8.
TEST_P(QuantizedLinear, MatchesTheLinearOnTheDequantizedWeight) {
  const Case c = GetParam();
  const Tensor wq = from_vector(test::random_values(kN * kK, 11, -1, 1), {kN, kK}, c.w);
  ASSERT_EQ(wq.dtype(), c.w);
  ASSERT_EQ(wq.nbytes(), storage_bytes(c.w, kN * kK));
  const std::vector<float> wd = to_vector(wq);  // dequantized
  const Tensor w32 = from_vector(wd, {kN, kK}, DType::f32);
  const Tensor x = test::random_tensor({c.rows, kK}, 12, c.x, -1, 1);
  const Tensor bias = test::random_tensor({kN}, 13, c.x);
  const int64_t conversions = cpu::f32_conversion_bytes();
  const int64_t panels = cpu::linear_gemm_counts().dequantized;
  const Tensor y = linear(x, wq, bias);
  const std::vector<float> got = to_vector(cast(y, DType::f32));
  EXPECT_EQ(y.dtype(), c.x);
  // No f32 copy of the weight was made, and many rows went panel by panel.
  EXPECT_EQ(cpu::f32_conversion_bytes(), conversions);
  EXPECT_EQ(cpu::linear_gemm_counts().dequantized - panels, c.rows > 1 ? 1 : 0);

  const std::vector<float> xs = to_vector(cast(x, DType::f32)), bs = to_vector(cast(bias, DType::f32));
  const double rel = c.x == DType::f32 ? 1e-5 : std::ldexp(1.0, -8);
  double worst = 0;
  for (int64_t i = 0; i < c.rows; ++i)
    for (int64_t j = 0; j < kN; ++j) {
      double want = bs[size_t(j)], scale = std::fabs(bs[size_t(j)]);
      for (int64_t k = 0; k < kK; ++k) {
        want += double(xs[size_t(i * kK + k)]) * wd[size_t(j * kK + k)];
        scale += std::fabs(double(xs[size_t(i * kK + k)]) * wd[size_t(j * kK + k)]);
      }
      const double err = std::fabs(got[size_t(i * kN + j)] - want) / scale;
      worst = std::max(worst, err);
    }
  EXPECT_LE(worst, rel) << dtype_name(c.w);
  std::printf("%s x %s, %lld rows: worst error %.2e of sum|x w|\n", dtype_name(c.w), dtype_name(c.x),
              static_cast<long long>(c.rows), worst);
  // One row runs on the GEMV, which sums each column in the f32 kernel's order on the
  // dequantized row: the linear on the f32 weight's bits exactly (rounded once into x's dtype).
  if (c.rows == 1) {
    EXPECT_EQ(got, to_vector(cast(cast(linear(x, w32, bias), c.x), DType::f32)));
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType w : {DType::q8_0, DType::q4_0, DType::q4_k, DType::q5_k, DType::f8_e4m3, DType::f8_e5m2})
    for (DType x : {DType::f32, DType::bf16})
      for (int64_t rows : {1, 5, 200}) out.push_back({w, x, rows});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Types, QuantizedLinear, testing::ValuesIn(cases()), name_of);

// Strict eager and deferred-and-fused give the same bits on quantized weights (a single-row
// linear grouped with another in deferred mode included).
TEST(QuantizedLinearModes, DeferredGivesStrictEagersBits) {
  const Tensor wq = from_vector(test::random_values(kN * kK, 21, -1, 1), {kN, kK}, DType::q4_k);
  const Tensor w2 = from_vector(test::random_values(kN * kK, 22, -1, 1), {kN, kK}, DType::q8_0);
  const Tensor x = test::random_tensor({7, kK}, 23, DType::bf16), row = test::random_tensor({1, kK}, 24, DType::bf16);
  const auto run = [&] {
    return std::vector<std::vector<float>>{to_vector(cast(linear(x, wq), DType::f32)),
                                           to_vector(cast(linear(row, wq) + linear(row, w2), DType::f32))};
  };
  const auto eager = run();
  EagerModeGuard defer(EagerMode::DeferAndFuse);
  EXPECT_EQ(run(), eager);
}

// --quantize: linear weights whose in_features are whole blocks are quantized at load; others
// (and every non-linear tensor) keep the module's dtype.
TEST(QuantizeAtLoad, LinearWeightsOfWholeBlocksAreQuantized) {
  const auto source = std::make_shared<test::MapSource>(std::map<std::string, Tensor>{
      {"a.weight", test::random_tensor({64, 256}, 31, DType::bf16)},
      {"a.bias", test::random_tensor({64}, 32, DType::bf16)},
      {"b.weight", test::random_tensor({64, 96}, 33, DType::bf16)}});
  const nn::Weights w = nn::Weights(source).with_dtype(DType::bf16).with_quantization(DType::q4_k);
  const nn::Linear a(w.sub("a"), 256, 64), b(w.sub("b"), 96, 64, false);
  EXPECT_EQ(a.weight.dtype(), DType::q4_k);
  EXPECT_EQ(a.bias.dtype(), DType::bf16);
  EXPECT_EQ(a.dtype, DType::bf16);
  EXPECT_EQ(b.weight.dtype(), DType::bf16);  // 96 is not a whole number of 256-element blocks
  EXPECT_EQ(a.weight.nbytes(), storage_bytes(DType::q4_k, 64 * 256));
  // The quantized weight is the weight's values quantized (the same bytes as quantizing them).
  const Tensor again = nn::quantize_weight(source->tensors.at("a.weight"), DType::q4_k);
  EXPECT_EQ(to_vector(a.weight), to_vector(again));
  const Tensor x = test::random_tensor({3, 256}, 34, DType::bf16);
  EXPECT_EQ(a(x).dtype(), DType::bf16);
}

TEST(QuantizeAtLoad, RefusesAFloatTypeAndAWeightOfPartialBlocks) {
  EXPECT_THROW((void)nn::Weights().with_quantization(DType::bf16), Error);
  const Tensor w = test::random_tensor({4, 40}, 41);
  try {
    (void)nn::quantize_weight(w, DType::q8_0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("whole number of its 32-element blocks"), std::string::npos) << e.what();
  }
}

// Scaled fp8 checkpoints: W / s stored in fp8 with s beside it, one per tensor or per output
// feature; the layer computes (x · Qᵀ) · s + b.
TEST(ScaledFp8, TheScaleMultipliesTheProduct) {
  const Tensor q = from_vector(test::random_values(32 * 64, 51, -1, 1), {32, 64}, DType::f8_e4m3);
  const Tensor x = test::random_tensor({3, 64}, 52), b = test::random_tensor({32}, 53);
  const std::vector<float> qd = to_vector(q);
  for (const Shape& scale_shape : {Shape{}, Shape{1}, Shape{32}, Shape{32, 1}}) {
    const int64_t n = numel(scale_shape);
    const std::vector<float> sv = test::random_values(n, 54, 0.5, 2);
    const auto source = std::make_shared<test::MapSource>(std::map<std::string, Tensor>{
        {"a.weight", q}, {"a.bias", b}, {"a.scale_weight", from_vector(sv, scale_shape, DType::f32)},
        {"a.input_scale", from_vector({1.0f}, {}, DType::f32)}});
    const nn::Linear a(nn::Weights(source).sub("a"), 64, 32);
    std::vector<float> w(qd);
    for (int64_t r = 0; r < 32; ++r)
      for (int64_t k = 0; k < 64; ++k) w[size_t(r * 64 + k)] *= sv[size_t(n == 1 ? 0 : r)];
    const std::vector<float> got = to_vector(a(x)), want = to_vector(linear(x, from_vector(w, {32, 64}), b));
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << i;
  }
  const auto bad = std::make_shared<test::MapSource>(std::map<std::string, Tensor>{
      {"a.weight", q}, {"a.weight_scale", from_vector({1, 2, 3}, {3}, DType::f32)}});
  test::expect_error([&] { (void)nn::Linear(nn::Weights(bad).sub("a"), 64, 32, false); },
                     {"'a.weight_scale' has shape [3]", "one value or one per output feature (32)"});
}

// --quantize f8_e4m3 scales each weight so its largest magnitude is e4m3's largest value:
// DiT-sized weights (~0.02) would otherwise fall among the subnormals.
TEST(QuantizeAtLoad, Fp8GetsAPerTensorScale) {
  const Tensor w = from_vector(test::random_values(64 * 128, 61, -0.03, 0.03), {64, 128});
  const auto source = std::make_shared<test::MapSource>(std::map<std::string, Tensor>{{"a.weight", w}});
  const nn::Linear a(nn::Weights(source).with_quantization(DType::f8_e4m3).sub("a"), 128, 64, false);
  ASSERT_EQ(a.weight.dtype(), DType::f8_e4m3);
  ASSERT_TRUE(a.weight_scale.defined());
  EXPECT_NEAR(item(a.weight_scale), nn::max_abs(w) / 448.0, 1e-9);
  const Tensor x = test::random_tensor({4, 128}, 62);
  const std::vector<float> got = to_vector(a(x)), want = to_vector(linear(x, w));
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) num += std::pow(got[i] - want[i], 2), den += std::pow(want[i], 2);
  EXPECT_LT(std::sqrt(num / den), 0.05);  // e4m3's 3 mantissa bits, not its subnormals
}

TEST(QuantizeAtLoad, ANonFiniteWeightIsAnErrorNamingIt) {
  std::vector<float> v = test::random_values(8 * 64, 71);
  v[5 * 64 + 3] = std::numeric_limits<float>::infinity();
  const auto source = std::make_shared<test::MapSource>(
      std::map<std::string, Tensor>{{"blk.proj.weight", from_vector(v, {8, 64})}});
  test::expect_error(
      [&] { (void)nn::Linear(nn::Weights(source).with_quantization(DType::q8_0).sub("blk").sub("proj"), 64, 8, false); },
      {"'blk.proj.weight'", "row 5", "not finite", "q8_0"});
}

// Only a linear's weight may be quantized; views keep whole blocks.
TEST(QuantizedWeights, OtherOpsAndPartialBlocksAreRefused) {
  const Tensor wq = from_vector(test::random_values(4 * 64, 81), {4, 64}, DType::q8_0);
  test::expect_error([&] { (void)(wq + wq); }, {"input 0 is q8_0[4,64]", "only as a linear's weight"});
  test::expect_error([&] { (void)Tensor::view_of(wq.buffer(), {4, 16}, DType::q8_0); },
                     {"q8_0[4,16]", "whole 32-element blocks"});
}

}  // namespace
}  // namespace kiln
