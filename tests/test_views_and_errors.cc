// Views share their input's buffer (no kernel, no copy); errors name the op and the shapes.
#include "devices/runtime.h"
#include "exec/counters.h"
#include "exec/dispatch.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "test_util.h"

namespace kiln {
namespace {

TEST(Views, ShareTheBufferWithoutLaunchingKernels) {
  const Tensor x = test::random_tensor({4, 6, 8}, 1);
  synchronize();
  reset_counters();
  const Tensor v1 = reshape(x, {24, 8});
  const Tensor v2 = transpose(x, 0, 2);
  const Tensor v3 = slice(x, 1, 2, 5);
  const Tensor v4 = expand(unsqueeze(x, 0), {3, 4, 6, 8});
  const auto parts = chunk(x, 2, -1);
  const Counters c = counters();
  EXPECT_EQ(c.kernels_launched, 0u);
  EXPECT_GE(c.ops_dispatched, 6u);
  for (const Tensor& v : {v1, v2, v3, v4, parts[0], parts[1]}) EXPECT_EQ(v.buffer(), x.buffer());
  EXPECT_FALSE(v2.is_contiguous());
  EXPECT_EQ(v4.strides()[0], 0);
  // Values read through the views equal the corresponding values of x.
  const auto xs = to_vector(x);
  const auto t = to_vector(v2);  // [8, 6, 4]
  EXPECT_EQ(t[size_t((3 * 6 + 2) * 4 + 1)], xs[size_t((1 * 6 + 2) * 8 + 3)]);
  const auto s = to_vector(v3);  // [4, 3, 8]
  EXPECT_EQ(s[size_t((1 * 3 + 0) * 8 + 5)], xs[size_t((1 * 6 + 2) * 8 + 5)]);
}

TEST(Views, ReshapeOfAnIncompatibleViewCopiesOnce) {
  EagerModeGuard strict(EagerMode::DeferNever);  // counts strict-eager kernels
  const Tensor x = test::random_tensor({4, 6}, 2);
  const Tensor t = transpose(x, 0, 1);  // [6, 4], not viewable as [24]
  synchronize();
  reset_counters();
  const Tensor flat = reshape(t, {-1});
  EXPECT_EQ(counters().kernels_launched, 1u);
  EXPECT_NE(flat.buffer(), x.buffer());
  const auto xs = to_vector(x), fs = to_vector(flat);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(fs[size_t(i * 4 + j)], xs[size_t(j * 6 + i)]);
}

// contiguous() of a permutation that moves the source's contiguous dim off the end (T5's
// [L, L, H] position bias made [H, L, L]) copies in transposed blocks: every element lands where
// the permutation puts it, for sizes that are no multiple of the blocks, in bf16 and f32, and for a
// source that is itself a slice.
TEST(Views, TransposingCopiesPutEveryElementInPlace) {
  for (const DType dtype : {DType::bf16, DType::f32}) {
    const Tensor x = test::random_tensor({2, 37, 70, 19}, 3, dtype);
    const Tensor y = contiguous(permute(x, {0, 3, 1, 2}));  // [2, 19, 37, 70]
    const Tensor s = contiguous(permute(slice(x, 3, 1, 18), {0, 3, 1, 2}));  // [2, 17, 37, 70]
    const auto xs = to_vector(x), ys = to_vector(y), ss = to_vector(s);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 19; ++h)
        for (int64_t q = 0; q < 37; ++q)
          for (int64_t k = 0; k < 70; ++k) {
            const float v = xs[size_t(((b * 37 + q) * 70 + k) * 19 + h)];
            ASSERT_EQ(ys[size_t(((b * 19 + h) * 37 + q) * 70 + k)], v) << dtype_name(dtype);
            if (h >= 1 && h < 18) {
              ASSERT_EQ(ss[size_t(((b * 17 + h - 1) * 37 + q) * 70 + k)], v) << dtype_name(dtype);
            }
          }
  }
}

TEST(Errors, NameTheOpAndTheShapes) {
  const Tensor a = zeros({2, 3}), b = zeros({4, 5});
  test::expect_error([&] { matmul(a, b); }, {"[matmul] inner dims differ: [2,3] x [4,5]"});
  test::expect_error([&] { add(a, b); }, {"[add]", "cannot broadcast [2,3] with [4,5]"});
  test::expect_error([&] { reshape(a, {4, 2}); }, {"[reshape]", "[2,3]", "[4,2]"});
  test::expect_error([&] { linear(a, zeros({5, 4})); }, {"[linear]", "[2,3]", "[5,4]"});
  test::expect_error([&] { conv2d(zeros({1, 3, 8, 8}), zeros({4, 2, 3, 3})); }, {"[conv2d]", "3 channels"});
  test::expect_error([&] {
    dispatch("conv2d", {zeros({1, 3, 8, 8}), zeros({4, 3, 3, 3}), zeros({1, 4, 7, 8})},
             Attrs{{"stride", std::vector<int64_t>{1, 1}}, {"padding", std::vector<int64_t>{1, 1}}, {"residual", int64_t(1)}});
  }, {"[conv2d]", "residual", "f32[1,4,8,8]", "f32[1,4,7,8]"});
  test::expect_error([&] { layer_norm(a, zeros({4}), Tensor(), 1e-5); }, {"[layer_norm]", "weight", "[3]"});
  test::expect_error([&] { softmax(a, 2); }, {"[softmax]", "axis 2 out of range"});
  test::expect_error([&] { where(a, a, a); }, {"[where]", "condition must be bool"});
  test::expect_error([&] { gather(a, a); }, {"[gather]", "indices must be i32 or i64"});
  test::expect_error([&] { concat({a, zeros({2, 3}, DType::bf16)}, 0); }, {"[concat]", "bf16"});
  test::expect_error([&] { scaled_dot_product_attention(zeros({1, 2, 3, 4}), zeros({1, 2, 5, 8}), zeros({1, 2, 5, 8})); },
                     {"[sdpa]", "[1,2,3,4]", "[1,2,5,8]"});
  test::expect_error([&] { runtime(Device::parse("cuda:0")); }, {"[device]", "cuda:0"});
}

TEST(Errors, ShapeErrorsRaiseAtTheCallBeforeAnyWork) {
  EagerModeGuard strict(EagerMode::DeferNever);  // counts strict-eager kernels (test_deferred.cc: deferred)
  synchronize();
  reset_counters();
  EXPECT_THROW(matmul(zeros({2, 3}), zeros({4, 5})), Error);
  // The two zeros() factories ran; the failed matmul launched nothing.
  EXPECT_EQ(counters().kernels_launched, 2u);
}

}  // namespace
}  // namespace kiln
