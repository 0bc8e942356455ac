// CPU sgemm (both backends), the linear layers' GEMM (plain and pre-packed weights), the GEMV
// and the tiled attention kernel against naive double-precision references.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "devices/cpu/kernels/attention.h"
#include "devices/cpu/kernels/gemm.h"
#include "devices/cpu/kernels/gemv.h"
#include "devices/cpu/kernels/linear_gemm.h"

namespace kiln::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> random_vector(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// ---------------------------------------------------------------------------------------
// sgemm

struct GemmCase {
  bool trans_a, trans_b;
  int64_t M, N, K;
  int64_t pad;  // extra elements per stored row, so strides differ from the widths
  float alpha, beta;
};

// Runs `sgemm_with` on random data and compares each element of C with a double
// reference, allowing 1e-5 of the magnitude sum that the element is built from.
void check_sgemm(GemmBackend backend, const GemmCase& c) {
  const int64_t a_rows = c.trans_a ? c.K : c.M, a_cols = c.trans_a ? c.M : c.K;
  const int64_t b_rows = c.trans_b ? c.N : c.K, b_cols = c.trans_b ? c.K : c.N;
  const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  const auto A = random_vector(static_cast<size_t>(a_rows * lda), 1);
  const auto B = random_vector(static_cast<size_t>(b_rows * ldb), 2);
  auto C = random_vector(static_cast<size_t>(c.M * ldc), 3);
  const auto C0 = C;
  sgemm_with(backend, c.trans_a, c.trans_b, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb,
             c.beta, C.data(), ldc);
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      double dot = 0, mag = 0;
      for (int64_t p = 0; p < c.K; ++p) {
        const double a = c.trans_a ? A[p * lda + i] : A[i * lda + p];
        const double b = c.trans_b ? B[j * ldb + p] : B[p * ldb + j];
        dot += a * b;
        mag += std::abs(a * b);
      }
      const double c0 = C0[i * ldc + j];
      const double ref = c.alpha * dot + c.beta * c0;
      const double tol = 1e-5 * (std::abs(c.alpha) * mag + std::abs(c.beta * c0)) + 1e-7;
      ASSERT_NEAR(C[i * ldc + j], ref, tol) << "i=" << i << " j=" << j;
    }
    // The padding between rows of C is not touched.
    for (int64_t j = c.N; j < ldc; ++j) ASSERT_EQ(C[i * ldc + j], C0[i * ldc + j]);
  }
}

// ---- linear layers' GEMM (linear_gemm.h) ----

// y = x·wᵀ + b matches a double reference, and reading the weight pre-packed gives the very same
// bits as reading it plain (compiled mode pre-packs, strict eager does not: their results must
// agree bitwise), for shapes that are and are not multiples of the kernel's blocks.
TEST(LinearGemm, MatchesADoubleReferenceAndPrepackedWeightsGiveTheSameBits) {
  EXPECT_FALSE(linear_runs_on_primitive(1));  // the GEMV's
  EXPECT_TRUE(linear_runs_on_primitive(2));
  EXPECT_TRUE(linear_runs_on_primitive(kPrimitiveMaxRows - 1));
  EXPECT_FALSE(linear_runs_on_primitive(kPrimitiveMaxRows));  // dnnl_sgemm's
  struct Case {
    int64_t M, N, K;
  };
  const Case cases[] = {{2, 3, 5}, {7, 64, 64}, {33, 100, 37}, {65, 17, 1000}, {256, 130, 300}, {3, 1024, 48}};
  uint32_t seed = 10;
  for (const Case& c : cases)
    for (const bool with_bias : {false, true}) {
      SCOPED_TRACE("M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                   (with_bias ? " bias" : ""));
      const auto x = random_vector(size_t(c.M * c.K), ++seed), w = random_vector(size_t(c.N * c.K), ++seed);
      const auto b = random_vector(size_t(c.N), ++seed);
      const float* bias = with_bias ? b.data() : nullptr;
      std::vector<float> plain(size_t(c.M * c.N)), prepacked(plain.size(), kInf);
      const LinearGemmCounts before = linear_gemm_counts();
      linear_f32(x.data(), w.data(), nullptr, bias, plain.data(), c.M, c.N, c.K);
      ASSERT_GE(packed_linear_weight_bytes(c.N, c.K), size_t(c.N * c.K) * sizeof(float));
      const auto packed = pack_linear_weight(w.data(), c.N, c.K);
      linear_f32(x.data(), w.data(), packed.get(), bias, prepacked.data(), c.M, c.N, c.K);
      const LinearGemmCounts after = linear_gemm_counts();
      // Where oneDNN would read the pack with another kernel, linear_f32 reads the plain weight.
      const bool packs = linear_packing_keeps_bits(c.N, c.K);
      EXPECT_EQ(after.packed_in_call - before.packed_in_call, packs ? 1 : 2);
      EXPECT_EQ(after.prepacked - before.prepacked, packs ? 1 : 0);
      ASSERT_EQ(std::memcmp(plain.data(), prepacked.data(), plain.size() * sizeof(float)), 0);
      for (int64_t i = 0; i < c.M; ++i)
        for (int64_t j = 0; j < c.N; ++j) {
          double dot = with_bias ? b[size_t(j)] : 0.0, mag = std::abs(dot);
          for (int64_t p = 0; p < c.K; ++p) {
            const double t = double(x[size_t(i * c.K + p)]) * w[size_t(j * c.K + p)];
            dot += t;
            mag += std::abs(t);
          }
          ASSERT_NEAR(plain[size_t(i * c.N + j)], dot, 1e-5 * mag + 1e-7) << "i=" << i << " j=" << j;
        }
    }
}

// ---- single-row products (gemv.h) ----

TEST(Gemv, MatchesADoubleReferenceAndNeverDependsOnItsCompanyOrThreads) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const int64_t k : {1, 15, 16, 33, 3072 + 7}) {
    std::vector<float> x(static_cast<size_t>(k));
    for (float& v : x) v = u(rng);
    const std::vector<int64_t> widths = {1, 5, 64, 131};  // around the 4-column and 64-column blocks
    std::vector<std::vector<float>> w, b, alone, together;
    std::vector<RowProduct> group;
    for (int64_t n : widths) {
      w.emplace_back(size_t(n * k));
      b.emplace_back(size_t(n));
      for (float& v : w.back()) v = u(rng);
      for (float& v : b.back()) v = u(rng);
      alone.emplace_back(size_t(n));
      together.emplace_back(size_t(n));
    }
    for (size_t p = 0; p < widths.size(); ++p) {
      const float* bias = p % 2 ? nullptr : b[p].data();
      gemv_rows(x.data(), k, {RowProduct{w[p].data(), bias, alone[p].data(), widths[p]}});
      group.push_back({w[p].data(), bias, together[p].data(), widths[p]});
      for (int64_t j = 0; j < widths[p]; ++j) {
        double ref = bias ? bias[j] : 0.0;
        for (int64_t i = 0; i < k; ++i) ref += double(x[size_t(i)]) * w[p][size_t(j * k + i)];
        EXPECT_NEAR(alone[p][size_t(j)], ref, 1e-5 * std::sqrt(double(k)) + 1e-6) << "k " << k << " col " << j;
      }
    }
    // One launch for all of them, on one thread and on all: the very same bits per column.
    for (const int threads : {1, omp_get_max_threads()}) {
      omp_set_num_threads(threads);
      gemv_rows(x.data(), k, group);
      for (size_t p = 0; p < widths.size(); ++p) EXPECT_EQ(together[p], alone[p]) << "k " << k << " product " << p;
    }
  }
}

using SgemmParam = std::tuple<GemmBackend, bool, bool>;

class SgemmTest : public ::testing::TestWithParam<SgemmParam> {
 protected:
  GemmBackend backend() const { return std::get<0>(GetParam()); }
  bool ta() const { return std::get<1>(GetParam()); }
  bool tb() const { return std::get<2>(GetParam()); }
};

TEST_P(SgemmTest, OddSizesWithAlphaBeta) {
  check_sgemm(backend(), {ta(), tb(), 37, 29, 53, 0, 0.75f, -1.25f});
}

TEST_P(SgemmTest, PaddedStrides) {
  check_sgemm(backend(), {ta(), tb(), 37, 29, 53, 5, 1.0f, 0.0f});
}

TEST_P(SgemmTest, LargerMultithreaded) {
  check_sgemm(backend(), {ta(), tb(), 257, 190, 301, 3, -0.5f, 1.0f});
}

TEST_P(SgemmTest, OneByOne) { check_sgemm(backend(), {ta(), tb(), 1, 1, 1, 0, 2.0f, 0.5f}); }

INSTANTIATE_TEST_SUITE_P(
    AllBackendsAndTransposes, SgemmTest,
    ::testing::Combine(::testing::Values(GemmBackend::openblas, GemmBackend::onednn),
                       ::testing::Bool(), ::testing::Bool()),
    [](const ::testing::TestParamInfo<SgemmParam>& info) {
      return std::string(gemm_backend_name(std::get<0>(info.param))) +
             (std::get<1>(info.param) ? "_At" : "_A") + (std::get<2>(info.param) ? "_Bt" : "_B");
    });

class SgemmBackendTest : public ::testing::TestWithParam<GemmBackend> {};

TEST_P(SgemmBackendTest, BetaZeroOverwritesNaN) {
  const int64_t M = 5, N = 7, K = 3;
  const auto A = random_vector(M * K, 4), B = random_vector(K * N, 5);
  std::vector<float> C(M * N, std::numeric_limits<float>::quiet_NaN());
  sgemm_with(GetParam(), false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(),
             N);
  for (float x : C) EXPECT_FALSE(std::isnan(x));
}

TEST_P(SgemmBackendTest, EmptyKScalesC) {
  std::vector<float> C = {1, 2, 3, 4, 5, 6};
  sgemm_with(GetParam(), false, true, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 1, 2.0f, C.data(), 3);
  EXPECT_EQ(C, (std::vector<float>{2, 4, 6, 8, 10, 12}));
  sgemm_with(GetParam(), false, true, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 1, 0.0f, C.data(), 3);
  EXPECT_EQ(C, std::vector<float>(6, 0.0f));
}

TEST_P(SgemmBackendTest, RejectsShortStride) {
  std::vector<float> A(16), B(16), C(16);
  EXPECT_THROW(sgemm_with(GetParam(), false, false, 4, 4, 4, 1.0f, A.data(), 3, B.data(), 4, 0.0f,
                          C.data(), 4),
               Error);
  EXPECT_THROW(sgemm_with(GetParam(), false, false, -1, 4, 4, 1.0f, A.data(), 4, B.data(), 4,
                          0.0f, C.data(), 4),
               Error);
}

// Inside a parallel region each call must run on its own thread and stay correct.
TEST_P(SgemmBackendTest, ConcurrentCallsInsideParallelRegion) {
  const int64_t M = 64, N = 48, K = 80, count = 8;
  const auto A = random_vector(M * K, 6), B = random_vector(N * K, 7);
  std::vector<float> expected(M * N);
  sgemm_with(GetParam(), false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f,
             expected.data(), N);
  std::vector<std::vector<float>> results(count, std::vector<float>(M * N));
#pragma omp parallel for
  for (int64_t t = 0; t < count; ++t) {
    sgemm_with(GetParam(), false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f,
               results[t].data(), N);
  }
  for (const auto& r : results) {
    for (int64_t i = 0; i < M * N; ++i) ASSERT_NEAR(r[i], expected[i], 1e-5f * (1 + std::abs(expected[i])));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, SgemmBackendTest,
                         ::testing::Values(GemmBackend::openblas, GemmBackend::onednn),
                         [](const ::testing::TestParamInfo<GemmBackend>& info) {
                           return std::string(gemm_backend_name(info.param));
                         });

TEST(GemmBackend, NamesAndDefault) {
  EXPECT_STREQ(gemm_backend_name(GemmBackend::openblas), "openblas");
  EXPECT_STREQ(gemm_backend_name(GemmBackend::onednn), "onednn");
  const GemmBackend b = gemm_backend();
  EXPECT_TRUE(b == GemmBackend::openblas || b == GemmBackend::onednn);
  EXPECT_EQ(gemm_backend(), b);  // read once
}

// ---------------------------------------------------------------------------------------
// attention

struct AttnShape {
  int64_t B, H, Lq, Lk, D, Dv;
};

void PrintTo(const AttnShape& s, std::ostream* os) {
  *os << "B=" << s.B << " H=" << s.H << " Lq=" << s.Lq << " Lk=" << s.Lk << " D=" << s.D
      << " Dv=" << s.Dv;
}

struct AttnData {
  AttnShape s;
  std::vector<float> q, k, v;
};

// `spread` scales q so the scores span a wide range (peaky softmax, large exponents).
AttnData make_attention_data(const AttnShape& s, float spread = 1.0f) {
  return {s, random_vector(static_cast<size_t>(s.B * s.H * s.Lq * s.D), 11, -spread, spread),
          random_vector(static_cast<size_t>(s.B * s.H * s.Lk * s.D), 12),
          random_vector(static_cast<size_t>(s.B * s.H * s.Lk * s.Dv), 13)};
}

// Naive double-precision softmax(q k^T * scale + mask) v. A fully masked row gives 0s,
// the kernel's documented behaviour.
std::vector<double> reference_attention(const AttnData& a, const float* mask, const int64_t* ms,
                                        float scale) {
  const AttnShape& s = a.s;
  std::vector<double> out(static_cast<size_t>(s.B * s.H * s.Lq * s.Dv), 0.0);
  std::vector<double> p(static_cast<size_t>(s.Lk));
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t bh = b * s.H + h;
      for (int64_t i = 0; i < s.Lq; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.Lk; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < s.D; ++d) {
            dot += double(a.q[(bh * s.Lq + i) * s.D + d]) * a.k[(bh * s.Lk + j) * s.D + d];
          }
          p[j] = dot * scale;
          if (mask) p[j] += mask[b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]];
          mx = std::max(mx, p[j]);
        }
        if (mx == -INFINITY) continue;
        double sum = 0;
        for (int64_t j = 0; j < s.Lk; ++j) sum += (p[j] = std::exp(p[j] - mx));
        double* o = &out[(bh * s.Lq + i) * s.Dv];
        for (int64_t j = 0; j < s.Lk; ++j) {
          for (int64_t e = 0; e < s.Dv; ++e) o[e] += p[j] / sum * a.v[(bh * s.Lk + j) * s.Dv + e];
        }
      }
    }
  }
  return out;
}

// Runs the kernel and compares with the reference: |err| <= 1e-5 * (|ref| + rms(ref)),
// i.e. 1e-5 relative, with the output's typical magnitude as the floor near zero.
void check_attention(const AttnData& a, const float* mask, const int64_t* ms, float scale) {
  const AttnShape& s = a.s;
  std::vector<float> out(static_cast<size_t>(s.B * s.H * s.Lq * s.Dv), -7.0f);
  attention_f32(a.q.data(), a.k.data(), a.v.data(), mask, ms, out.data(), s.B, s.H, s.Lq, s.Lk,
                s.D, s.Dv, scale);
  const auto ref = reference_attention(a, mask, ms, scale);
  double sq = 0;
  for (double r : ref) sq += r * r;
  const double rms = std::sqrt(sq / std::max<size_t>(1, ref.size()));
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_FALSE(std::isnan(out[i])) << "at " << i;
    ASSERT_NEAR(out[i], ref[i], 1e-5 * (std::abs(ref[i]) + rms)) << "at " << i;
  }
}

float default_scale(const AttnShape& s) { return 1.0f / std::sqrt(static_cast<float>(s.D)); }

class AttentionShapes : public ::testing::TestWithParam<AttnShape> {};

TEST_P(AttentionShapes, NoMask) {
  const auto a = make_attention_data(GetParam());
  check_attention(a, nullptr, nullptr, default_scale(a.s));
}

TEST_P(AttentionShapes, BroadcastMask) {
  const AttnShape s = GetParam();
  const auto a = make_attention_data(s);
  const auto mask = random_vector(static_cast<size_t>(s.Lq * s.Lk), 21, -3.0f, 3.0f);
  const int64_t ms[4] = {0, 0, s.Lk, 1};  // [1,1,Lq,Lk]
  check_attention(a, mask.data(), ms, default_scale(s));
}

TEST_P(AttentionShapes, PerHeadMask) {
  const AttnShape s = GetParam();
  const auto a = make_attention_data(s);
  const auto mask = random_vector(static_cast<size_t>(s.B * s.H * s.Lq * s.Lk), 22, -3.0f, 3.0f);
  const int64_t ms[4] = {s.H * s.Lq * s.Lk, s.Lq * s.Lk, s.Lk, 1};  // [B,H,Lq,Lk]
  check_attention(a, mask.data(), ms, default_scale(s));
}

TEST_P(AttentionShapes, LargeScores) {
  const auto a = make_attention_data(GetParam(), 12.0f);
  check_attention(a, nullptr, nullptr, default_scale(a.s));
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionShapes,
                         ::testing::Values(AttnShape{2, 3, 77, 333, 40, 24},    // Lq!=Lk, D!=Dv
                                           AttnShape{2, 3, 130, 130, 64, 64},   // square
                                           AttnShape{2, 3, 300, 1100, 16, 8},   // many key blocks
                                           AttnShape{2, 3, 1, 5, 3, 7},         // tiny, odd
                                           AttnShape{1, 1, 259, 17, 33, 65}));  // Lk < lanes

// Key-padding mask [B,1,1,Lk] with -inf entries; stride 0 for heads and queries.
TEST(Attention, KeyPaddingMaskWithNegInf) {
  const AttnShape s{2, 3, 77, 333, 40, 24};
  const auto a = make_attention_data(s);
  std::vector<float> mask(static_cast<size_t>(s.B * s.Lk), 0.0f);
  for (int64_t j = 200; j < s.Lk; ++j) mask[j] = -kInf;          // batch 0: keys 200.. padded
  for (int64_t j = 0; j < s.Lk; j += 3) mask[s.Lk + j] = -kInf;  // batch 1: every third key
  const int64_t ms[4] = {s.Lk, 0, 0, 1};
  check_attention(a, mask.data(), ms, default_scale(s));
}

// A mask stored transposed ([Lk,Lq]) exercises the general-stride path.
TEST(Attention, TransposedMaskStrides) {
  const AttnShape s{2, 3, 77, 333, 40, 24};
  const auto a = make_attention_data(s);
  const auto mask = random_vector(static_cast<size_t>(s.Lq * s.Lk), 23, -2.0f, 2.0f);
  const int64_t ms[4] = {0, 0, 1, s.Lq};
  check_attention(a, mask.data(), ms, default_scale(s));
}

// Rows whose scores are all -inf give 0s (documented; PyTorch gives NaN), other rows are
// unaffected, including rows fully masked only in their first key blocks.
TEST(Attention, FullyMaskedRowsGiveZeros) {
  const AttnShape s{2, 3, 70, 1100, 16, 8};
  const auto a = make_attention_data(s);
  std::vector<float> mask(static_cast<size_t>(s.Lq * s.Lk), 0.0f);
  for (int64_t j = 0; j < s.Lk; ++j) mask[5 * s.Lk + j] = -kInf;      // row 5: all masked
  for (int64_t j = 0; j < s.Lk - 1; ++j) mask[9 * s.Lk + j] = -kInf;  // row 9: only last key
  const int64_t ms[4] = {0, 0, s.Lk, 1};
  check_attention(a, mask.data(), ms, default_scale(s));
  std::vector<float> out(static_cast<size_t>(s.B * s.H * s.Lq * s.Dv));
  attention_f32(a.q.data(), a.k.data(), a.v.data(), mask.data(), ms, out.data(), s.B, s.H, s.Lq,
                s.Lk, s.D, s.Dv, default_scale(s));
  for (int64_t e = 0; e < s.Dv; ++e) EXPECT_EQ(out[5 * s.Dv + e], 0.0f);
  for (int64_t e = 0; e < s.Dv; ++e) EXPECT_EQ(out[9 * s.Dv + e], a.v[(s.Lk - 1) * s.Dv + e]);
}

// A NaN in a query poisons that query's output row only (PyTorch does the same).
TEST(Attention, NaNQueryGivesNaNRow) {
  const AttnShape s{1, 2, 130, 600, 16, 8};
  auto a = make_attention_data(s);
  a.q[(s.Lq + 3) * s.D + 5] = std::numeric_limits<float>::quiet_NaN();  // head 1, query 3
  std::vector<float> out(static_cast<size_t>(s.B * s.H * s.Lq * s.Dv));
  attention_f32(a.q.data(), a.k.data(), a.v.data(), nullptr, nullptr, out.data(), s.B, s.H, s.Lq,
                s.Lk, s.D, s.Dv, default_scale(s));
  for (int64_t row = 0; row < s.H * s.Lq; ++row) {
    for (int64_t e = 0; e < s.Dv; ++e) {
      EXPECT_EQ(std::isnan(out[row * s.Dv + e]), row == s.Lq + 3) << "row " << row;
    }
  }
}

// Called from inside a parallel region the kernel runs on the calling thread.
TEST(Attention, InsideParallelRegion) {
  const AttnShape s{1, 2, 77, 333, 40, 24};
  const auto a = make_attention_data(s);
  std::vector<float> expected(static_cast<size_t>(s.B * s.H * s.Lq * s.Dv));
  attention_f32(a.q.data(), a.k.data(), a.v.data(), nullptr, nullptr, expected.data(), s.B, s.H,
                s.Lq, s.Lk, s.D, s.Dv, default_scale(s));
  std::vector<std::vector<float>> outs(4, std::vector<float>(expected.size()));
#pragma omp parallel for
  for (int t = 0; t < 4; ++t) {
    attention_f32(a.q.data(), a.k.data(), a.v.data(), nullptr, nullptr, outs[t].data(), s.B, s.H,
                  s.Lq, s.Lk, s.D, s.Dv, default_scale(s));
  }
  for (const auto& o : outs) {
    for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], expected[i], 1e-6f);
  }
}

TEST(Attention, EmptyKeysGiveZeros) {
  const AttnShape s{1, 2, 3, 0, 4, 5};
  const auto a = make_attention_data(s);
  std::vector<float> out(static_cast<size_t>(s.B * s.H * s.Lq * s.Dv), 1.0f);
  attention_f32(a.q.data(), nullptr, nullptr, nullptr, nullptr, out.data(), s.B, s.H, s.Lq, s.Lk,
                s.D, s.Dv, 0.5f);
  EXPECT_EQ(out, std::vector<float>(out.size(), 0.0f));
}

TEST(Attention, RejectsBadArguments) {
  std::vector<float> x(64);
  EXPECT_THROW(attention_f32(x.data(), x.data(), x.data(), nullptr, nullptr, x.data(), 1, 1, -2,
                             2, 2, 2, 1.0f),
               Error);
  EXPECT_THROW(attention_f32(x.data(), x.data(), x.data(), x.data(), nullptr, x.data(), 1, 1, 2,
                             2, 2, 2, 1.0f),
               Error);
}

TEST(Attention, WorkspaceFarBelowScoreMatrix) {
  const int64_t L = 4608;
  const size_t ws = attention_workspace_bytes(L, L, 128, 128);
  EXPECT_GT(ws, 0u);
  EXPECT_LT(ws, static_cast<size_t>(L * L * 4) / 16);  // < 1/16 of ONE head's scores
  EXPECT_LE(attention_workspace_bytes(10, 10, 8, 8), ws);
}

}  // namespace
}  // namespace kiln::cpu
