// kiln's AMX bf16 GEMM (kernels/amx_gemm.h). Its values against the f32 kernel are checked with
// the other bf16 paths in test_cpu_bf16_linear.cc; here: the bits do not depend on the threads or
// on how x is read (in place, unaligned, or copied for a K tail), the process runs it exactly
// where AMX is usable, and elsewhere it refuses with a clear error.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "devices/cpu/kernels/amx_gemm.h"
#include "devices/cpu/kernels/linear_gemm.h"
#include "exec/ops.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

std::vector<uint16_t> random_bf16(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& e : v) e = f32_to_bf16(u(rng));
  return v;
}

std::vector<uint16_t> run_amx(const uint16_t* x, const std::vector<uint16_t>& w, const std::vector<uint16_t>& b,
                              int64_t M, int64_t N, int64_t K, int threads) {
  std::vector<uint16_t> y(size_t(M * N));
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  amx_linear_bf16(x, w.data(), b.data(), DType::bf16, y.data(), DType::bf16, M, N, K);
  omp_set_num_threads(before);
  return y;
}

// One and two threads split the work differently (by columns when there are enough 32-column
// panels, else by row blocks; K past 3072 in several chunks), yet every output has one summation
// order: the bits agree. x read in place at an odd address gives the bits of x read aligned.
TEST(AmxLinear, BitsDoNotDependOnThreadsOrOnWhereXLies) {
  if (!amx_bf16_usable()) {
    EXPECT_NE(bf16_linear_path(), Bf16LinearPath::amx);
    uint16_t one = 0x3f80, out = 0;
    test::expect_error([&] { amx_linear_bf16(&one, &one, nullptr, DType::f32, &out, DType::bf16, 1, 1, 1); },
                       {"linear", "AMX"});
    return;
  }
  struct Case {
    int64_t M, N, K;
  };
  // Row split with a row tail; column split; several K chunks with a K tail; columns past a group;
  // CLIP's 77 rows against many of w.
  const Case cases[] = {{70, 40, 96}, {64, 300, 64}, {33, 130, 6500}, {100, 200, 3200}, {77, 300, 768}};
  uint32_t seed = 700;
  for (const Case& c : cases) {
    SCOPED_TRACE("M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K));
    const std::vector<uint16_t> x = random_bf16(c.M * c.K, ++seed), w = random_bf16(c.N * c.K, ++seed),
                                b = random_bf16(c.N, ++seed);
    const std::vector<uint16_t> one = run_amx(x.data(), w, b, c.M, c.N, c.K, 1);
    EXPECT_EQ(run_amx(x.data(), w, b, c.M, c.N, c.K, 2), one);
    std::vector<uint16_t> shifted(x.size() + 1);
    std::memcpy(shifted.data() + 1, x.data(), x.size() * 2);
    EXPECT_EQ(run_amx(shifted.data() + 1, w, b, c.M, c.N, c.K, 2), one);
  }
}

// Unless KILN_BF16_LINEAR says otherwise, bf16 linears of kAmxMinRows rows and more run on the AMX
// kernel exactly where AMX is usable, in every mode's kernels (the op API here), and compiled mode
// pre-packs no bf16 weight there.
TEST(AmxLinear, BF16LinearsRunOnItWhereAmxIsUsable) {
  if (std::getenv("KILN_BF16_LINEAR") == nullptr) {
    EXPECT_EQ(bf16_linear_path() == Bf16LinearPath::amx, amx_bf16_usable());
  }
  const bool amx = bf16_linear_path() == Bf16LinearPath::amx;
  EXPECT_EQ(linear_reads_packed_weight(300, DType::bf16, DType::bf16), bf16_linear_path() == Bf16LinearPath::dot);
  const Tensor x = test::random_tensor({300, 64}, 710, DType::bf16), w = test::random_tensor({48, 64}, 711, DType::bf16);
  const LinearGemmCounts before = linear_gemm_counts();
  const Tensor y = linear(x, w);
  ASSERT_EQ(to_vector(y).size(), size_t(300 * 48));
  EXPECT_EQ(linear_gemm_counts().amx - before.amx, amx ? 1 : 0);
  // Fewer than kAmxMinRows rows (CLIP's 77 tokens) run on oneDNN's primitive wherever it has one.
  const Tensor x77 = test::random_tensor({77, 64}, 712, DType::bf16);
  const LinearGemmCounts before77 = linear_gemm_counts();
  ASSERT_EQ(to_vector(linear(x77, w)).size(), size_t(77 * 48));
  EXPECT_EQ(linear_gemm_counts().amx - before77.amx, amx && !bf16_dot_path_available() ? 1 : 0);
}

}  // namespace
}  // namespace kiln::cpu
