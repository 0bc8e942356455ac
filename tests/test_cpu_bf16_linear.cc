// bf16 linears on the CPU: the multi-row GEMM (both Bf16LinearPaths, plain and pre-packed
// weights), the single-row GEMV, and the kernels behind the op API in every execution mode,
// which read bf16 operands as they are: no f32 copy of a weight (f32_conversion_bytes).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "devices/cpu/kernels/amx_gemm.h"
#include "devices/cpu/kernels/f32_io.h"
#include "devices/cpu/kernels/gemv.h"
#include "devices/cpu/kernels/linear_gemm.h"
#include "devices/cpu/kernels/prepacked_weights.h"
#include "exec/compile.h"
#include "exec/counters.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

// Random values in [-1, 1] rounded to bf16: the bits, and the same values as f32 (exact).
struct Bf16Values {
  std::vector<uint16_t> bits;
  std::vector<float> wide;
};

Bf16Values bf16_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Bf16Values v{std::vector<uint16_t>(size_t(n)), std::vector<float>(size_t(n))};
  for (size_t i = 0; i < v.bits.size(); ++i) {
    v.bits[i] = f32_to_bf16(u(rng));
    v.wide[i] = bf16_to_f32(v.bits[i]);
  }
  return v;
}

enum class BiasKind { none, f32, bf16 };
const char* name(BiasKind b) { return b == BiasKind::none ? "no bias" : b == BiasKind::f32 ? "f32 bias" : "bf16 bias"; }

// The paths this CPU runs: the AMX kernel where AMX is usable, the dot path wherever oneDNN has a
// bf16 matmul (AVX-512), and the widened one everywhere.
std::vector<Bf16LinearPath> paths() {
  std::vector<Bf16LinearPath> p;
  if (amx_bf16_usable()) p.push_back(Bf16LinearPath::amx);
  if (bf16_dot_path_available()) p.push_back(Bf16LinearPath::dot);
  p.push_back(Bf16LinearPath::widened);
  return p;
}

// ---- the multi-row GEMM (linear_gemm.h) ----

// Every path against the f32 kernel on the same bf16-rounded inputs, at row counts on each side of
// kPrimitiveMaxRows (the f32 kernels' switch; bf16 has none), K that are no multiple of 16 or 32,
// a weight the widened path splits into panels, few rows against many weight rows (CLIP's 77
// tokens), with and without a bias (f32 or bf16), y f32 or bf16. The bound: a bf16 x bf16 product
// is exact in f32, so both kernels sum the same f32 products and each lands within 1e-5 of the
// magnitude sum S = Σ|x·w| + |b| of the exact sum (the bound the f32 kernels meet against a
// double reference in test_cpu_gemm_attention.cc): they differ by at most 2e-5·S. A bf16 y adds
// its one rounding, at most half an ulp of 8 significant bits: 2^-8·|y_f32| <= 2^-8·(|ref| +
// 2e-5·S).
TEST(Bf16Linear, MatchesTheF32KernelOnTheSameRoundedInputs) {
  struct Case {
    int64_t M, N, K;
  };
  const Case cases[] = {{2, 3, 5},      {7, 64, 37},    {33, 100, 100},   {300, 70, 1000}, {1023, 40, 53},
                        {1024, 33, 77}, {1100, 130, 300}, {3, 600, 8200}, {77, 200, 96},   {20, 130, 64}};
  uint32_t seed = 100;
  for (const Case& c : cases) {
    const Bf16Values x = bf16_values(c.M * c.K, ++seed), w = bf16_values(c.N * c.K, ++seed);
    const Bf16Values b = bf16_values(c.N, ++seed);
    std::vector<double> mag(size_t(c.M * c.N));  // Σ|x·w| per element
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        double s = 0;
        for (int64_t p = 0; p < c.K; ++p)
          s += std::abs(double(x.wide[size_t(i * c.K + p)]) * w.wide[size_t(j * c.K + p)]);
        mag[size_t(i * c.N + j)] = s;
      }
    for (const BiasKind bias : {BiasKind::none, BiasKind::f32, BiasKind::bf16}) {
      const float* bias_f32 = bias == BiasKind::none ? nullptr : b.wide.data();
      std::vector<float> ref(size_t(c.M * c.N));
      linear_f32(x.wide.data(), w.wide.data(), nullptr, bias_f32, ref.data(), c.M, c.N, c.K);
      const void* bias_ptr = bias == BiasKind::bf16 ? static_cast<const void*>(b.bits.data()) : bias_f32;
      const DType bias_type = bias == BiasKind::bf16 ? DType::bf16 : DType::f32;
      for (const Bf16LinearPath path : paths()) {
        SCOPED_TRACE(std::string(bf16_linear_path_name(path)) + " M=" + std::to_string(c.M) + " N=" +
                     std::to_string(c.N) + " K=" + std::to_string(c.K) + " " + name(bias));
        const int64_t conversions = f32_conversion_bytes();
        std::vector<float> y32(ref.size());
        std::vector<uint16_t> y16(ref.size());
        linear_bf16(x.bits.data(), w.bits.data(), nullptr, bias_ptr, bias_type, y32.data(), DType::f32, c.M, c.N,
                    c.K, path);
        linear_bf16(x.bits.data(), w.bits.data(), nullptr, bias_ptr, bias_type, y16.data(), DType::bf16, c.M, c.N,
                    c.K, path);
        EXPECT_EQ(f32_conversion_bytes(), conversions);
        for (size_t e = 0; e < ref.size(); ++e) {
          const double s = mag[e] + (bias_f32 ? std::abs(double(bias_f32[e % size_t(c.N)])) : 0.0);
          const double tol = 2e-5 * s + 1e-7, r = ref[e];
          ASSERT_NEAR(y32[e], r, tol) << "element " << e;
          ASSERT_NEAR(bf16_to_f32(y16[e]), r, tol + std::ldexp(std::abs(r) + tol, -8)) << "element " << e;
          // The widened and amx paths compute y in f32 and round it once: their bf16 y is their
          // f32 y rounded.
          if (path != Bf16LinearPath::dot) {
            ASSERT_EQ(y16[e], f32_to_bf16(y32[e])) << "element " << e;
          }
        }
      }
    }
  }
}

// On the dot path a pre-packed bf16 weight gives the very bits of the plain one (compiled mode
// packs, strict eager does not), at row counts below and above kPrimitiveMaxRows; where oneDNN
// would read the pack with another kernel the plain weight is read instead (the counts say which).
// The widened path never reads a pack. (Without a oneDNN bf16 matmul there is no dot path: no
// linear reads a bf16 pack there, and none is made.)
TEST(Bf16Linear, PackedWeightsGiveThePlainBits) {
  if (!bf16_dot_path_available()) {
    EXPECT_FALSE(linear_reads_packed_weight(300, DType::bf16, DType::bf16));
    return;
  }
  struct Case {
    int64_t M, N, K;
  };
  const Case cases[] = {{2, 3, 5}, {33, 100, 37}, {65, 17, 1000}, {1024, 64, 48}, {1100, 130, 300}};
  uint32_t seed = 200;
  for (const Case& c : cases) {
    const Bf16Values x = bf16_values(c.M * c.K, ++seed), w = bf16_values(c.N * c.K, ++seed);
    const Bf16Values b = bf16_values(c.N, ++seed);
    ASSERT_GE(packed_linear_weight_bytes(c.N, c.K, DType::bf16), size_t(c.N * c.K) * 2);
    const auto packed = pack_linear_weight(w.bits.data(), DType::bf16, c.N, c.K);
    const bool packs = linear_packing_keeps_bits(c.N, c.K, DType::bf16);
    for (const DType y_type : {DType::bf16, DType::f32})
      for (const bool with_bias : {false, true}) {
        SCOPED_TRACE("M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + " y " +
                     dtype_name(y_type) + (with_bias ? " bf16 bias" : ""));
        const void* bias = with_bias ? b.bits.data() : nullptr;
        const size_t bytes = size_t(c.M * c.N) * dtype_size(y_type);
        for (const Bf16LinearPath path : paths()) {
          std::vector<char> plain(bytes), prepacked(bytes, 0x7f);
          const LinearGemmCounts before = linear_gemm_counts();
          linear_bf16(x.bits.data(), w.bits.data(), nullptr, bias, DType::bf16, plain.data(), y_type, c.M, c.N, c.K,
                      path);
          linear_bf16(x.bits.data(), w.bits.data(), packed.get(), bias, DType::bf16, prepacked.data(), y_type, c.M,
                      c.N, c.K, path);
          const LinearGemmCounts after = linear_gemm_counts();
          ASSERT_EQ(std::memcmp(plain.data(), prepacked.data(), bytes), 0) << bf16_linear_path_name(path);
          // Short products on the amx path run as on the dot path (linear_gemm.h).
          const bool as_dot = path == Bf16LinearPath::dot || (path == Bf16LinearPath::amx && c.M < kAmxMinRows);
          if (path == Bf16LinearPath::amx && !as_dot) {
            // The AMX kernel packs w inside the call: a pre-packed weight is never read.
            EXPECT_EQ(after.amx - before.amx, 2);
            EXPECT_EQ(after.prepacked, before.prepacked);
            EXPECT_EQ(after.packed_in_call, before.packed_in_call);
          } else if (as_dot) {
            EXPECT_EQ(after.amx, before.amx);
            // Packing is judged at the reference row count (64). Below it oneDNN may pick another
            // kernel (on AMX it does for 33 rows); the call then reads the plain weight, which
            // keeps the bits (checked above) — so only rows >= 64 must read the packed one.
            const int64_t used = after.prepacked - before.prepacked;
            if (c.M >= 64 || !packs) EXPECT_EQ(used, packs ? 1 : 0);
            else EXPECT_LE(used, 1);
            EXPECT_EQ(after.packed_in_call - before.packed_in_call, 2 - used);
            EXPECT_EQ(after.widened, before.widened);
          } else {
            EXPECT_EQ(after.prepacked, before.prepacked);
            EXPECT_EQ(after.packed_in_call, before.packed_in_call);
            EXPECT_EQ(after.widened - before.widened, 2);
          }
        }
      }
  }
}

// Compiled mode pre-packs a bf16 weight exactly where the process's linears read packs (the dot
// path; linear_reads_packed_weight), at every row count, and its results are strict eager's bits.
TEST(Bf16Linear, CompiledModePacksBf16WeightsOnlyForTheDotPath) {
  const int64_t N = 48, K = 40;
  const Tensor w = test::random_tensor({N, K}, 301, DType::bf16), b = test::random_tensor({N}, 302, DType::bf16);
  const bool dot = bf16_linear_path() == Bf16LinearPath::dot;
  EXPECT_EQ(linear_reads_packed_weight(300, DType::bf16, DType::bf16), dot);
  EXPECT_EQ(linear_reads_packed_weight(kPrimitiveMaxRows + 76, DType::bf16, DType::bf16), dot);
  EXPECT_FALSE(linear_reads_packed_weight(1, DType::bf16, DType::bf16)) << "the GEMV's";
  EXPECT_FALSE(linear_reads_packed_weight(300, DType::f32, DType::bf16)) << "read through an f32 copy";
  const uint64_t packs = dot && linear_packing_keeps_bits(N, K, DType::bf16) ? 1 : 0;
  CompileOptions options;
  options.fullgraph = true;
  const CompiledFunction f(
      "bf16_linear", [&](const std::vector<Tensor>& a) { return std::vector<Tensor>{linear(a[0], w, b)}; }, options);
  bool first = true;
  for (const int64_t rows : {int64_t(300), kPrimitiveMaxRows + 76}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    const Tensor x = test::random_tensor({rows, K}, 303, DType::bf16);
    const Tensor eager = linear(x, w, b);
    const PrepackStats before = prepack_stats();
    const int64_t conversions = f32_conversion_bytes();
    const Tensor y = f({x}, {w, b})[0];
    ASSERT_EQ(y.dtype(), DType::bf16);
    EXPECT_EQ(to_vector(y), to_vector(eager));
    EXPECT_EQ(f32_conversion_bytes(), conversions);
    const PrepackStats after = prepack_stats();
    EXPECT_EQ(after.packed - before.packed, first ? packs : 0);
    EXPECT_EQ(after.reused - before.reused, first ? 0 : packs);
    EXPECT_EQ(after.skipped - before.skipped, dot ? 1 - packs : 0);
    first = false;
  }
}

// ---- the single-row GEMV (gemv.h) ----

// bf16 weights (with a bias of either dtype or none, y of either dtype, x of either dtype): each
// column is the f32 kernel's column on the widened values, bit for bit (bf16 x bf16 products are
// exact in f32 and the order is the same), rounded once when y is bf16; and a grouped launch of
// all products gives every product its single launch's bits, on one thread and on all.
TEST(Bf16LinearGemv, IsTheF32GemvOnWidenedValuesAndGroupedLaunchesGiveSingleLaunchBits) {
  uint32_t seed = 400;
  for (const int64_t k : {1, 15, 16, 33, 3072 + 7}) {
    const Bf16Values x = bf16_values(k, ++seed);
    const std::vector<int64_t> widths = {1, 5, 64, 131};  // around the 4-column and 64-column blocks
    for (const DType x_type : {DType::bf16, DType::f32}) {
      const void* xp = x_type == DType::bf16 ? static_cast<const void*>(x.bits.data()) : x.wide.data();
      std::vector<Bf16Values> w, b;
      std::vector<std::vector<char>> alone, together;
      std::vector<RowProduct> group;
      for (size_t p = 0; p < widths.size(); ++p) {
        const int64_t n = widths[p];
        w.push_back(bf16_values(n * k, ++seed));
        b.push_back(bf16_values(n, ++seed));
        const auto bias = BiasKind(p % 3);
        const DType y_type = p % 2 ? DType::f32 : DType::bf16;
        const void* bias_ptr = bias == BiasKind::none  ? nullptr
                               : bias == BiasKind::f32 ? static_cast<const void*>(b[p].wide.data())
                                                       : b[p].bits.data();
        const size_t bytes = size_t(n) * dtype_size(y_type);
        alone.emplace_back(bytes);
        together.emplace_back(bytes);
        const DType bias_type = bias == BiasKind::bf16 ? DType::bf16 : DType::f32;
        const RowProduct product{w[p].bits.data(), bias_ptr, alone[p].data(), n, DType::bf16, bias_type, y_type};
        gemv_rows(xp, x_type, k, {product});
        group.push_back(product);
        group.back().y = together[p].data();
        // The f32 kernel on the widened values.
        std::vector<float> ref(static_cast<size_t>(n));
        gemv_rows(x.wide.data(), k,
                  {RowProduct{w[p].wide.data(), bias == BiasKind::none ? nullptr : b[p].wide.data(), ref.data(), n}});
        for (int64_t j = 0; j < n; ++j) {
          if (y_type == DType::f32) {
            float got;
            std::memcpy(&got, alone[p].data() + j * 4, 4);
            ASSERT_EQ(got, ref[size_t(j)]) << "k " << k << " width " << n << " col " << j << " " << name(bias);
          } else {
            uint16_t got;
            std::memcpy(&got, alone[p].data() + j * 2, 2);
            ASSERT_EQ(got, f32_to_bf16(ref[size_t(j)]))
                << "k " << k << " width " << n << " col " << j << " " << name(bias);
          }
        }
      }
      for (const int threads : {1, omp_get_max_threads()}) {
        omp_set_num_threads(threads);
        gemv_rows(xp, x_type, k, group);
        for (size_t p = 0; p < widths.size(); ++p) EXPECT_EQ(together[p], alone[p]) << "k " << k << " product " << p;
      }
    }
  }
}

// ---- the op API: no weight is converted, in any mode ----

// Strict eager bf16 linears (one row: the GEMV; several: the GEMM) convert no operand, and a
// deferred-mode group of single-row bf16 linears reading one row is one grouped launch with strict
// eager's bits, converting nothing either. The counter itself counts: an f32 x with a bf16 weight
// still goes through the f32 copy of the weight (2 bytes per weight element).
TEST(Bf16LinearOps, NoWeightIsConvertedInAnyMode) {
  const int64_t K = 40;
  const Tensor row = test::random_tensor({1, K}, 501, DType::bf16);
  const Tensor rows = test::random_tensor({3, K}, 502, DType::bf16);
  const Tensor w1 = test::random_tensor({48, K}, 503, DType::bf16), b1 = test::random_tensor({48}, 504, DType::bf16);
  const Tensor w2 = test::random_tensor({20, K}, 505, DType::bf16), b2 = test::random_tensor({20}, 506);
  const int64_t c0 = f32_conversion_bytes();
  // The row is computed (as a DiT's silu(temb) is): deferred mode groups the linears of one value.
  const Tensor t = silu(row);
  const Tensor a = linear(t, w1, b1), m = linear(rows, w1, b1), c = linear(t, w2, b2);
  wait(a);
  wait(m);
  wait(c);
  EXPECT_EQ(f32_conversion_bytes(), c0) << "strict eager";
  EXPECT_EQ(a.dtype(), DType::bf16);
  EXPECT_EQ(m.dtype(), DType::bf16);
  const std::vector<float> a_eager = to_vector(a), c_eager = to_vector(c);
  {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    reset_counters();
    const int64_t c1 = f32_conversion_bytes();
    const Tensor t_d = silu(row);
    const Tensor a_d = linear(t_d, w1, b1), c_d = linear(t_d, w2, b2);
    synchronize();  // one flush for both (reading one value runs only what it needs)
    EXPECT_EQ(to_vector(a_d), a_eager);
    EXPECT_EQ(to_vector(c_d), c_eager);
    EXPECT_EQ(f32_conversion_bytes(), c1) << "deferred";
    EXPECT_EQ(kernels_by_name().at("grouped_linear"), 1u);
  }
  const Tensor x32 = test::random_tensor({3, K}, 507);
  const int64_t c2 = f32_conversion_bytes();
  wait(linear(x32, w1));
  EXPECT_EQ(f32_conversion_bytes() - c2, 48 * K * 2) << "an f32 x with a bf16 weight converts the weight";
}

}  // namespace
}  // namespace kiln::cpu
