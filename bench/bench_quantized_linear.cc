// Linears on quantized weights against the bf16 linear, at FLUX.1's shapes (a 512² image with
// 256 text tokens: 1280 rows): bf16 x with a bf16 weight, and with the same weight held as Q8_0,
// Q4_K and fp8 e4m3 (kernels/linear_gemm.h linear_quantized: dequantized a panel of rows at a
// time). Rounds interleave the dtypes so a noisy machine slows them alike; the best of 3 calls
// per round, best round reported, with the ratio to bf16.
//
//   ./bench_quantized_linear [rows]     # ~1 min on 2 cores
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "exec/host.h"
#include "exec/ops.h"
#include "test_util.h"

int main(int argc, char** argv) {
  using namespace kiln;
  const int64_t M = argc > 1 ? std::atoll(argv[1]) : 1280;
  struct Shape2 {
    int64_t N, K;
    const char* what;
  };
  const Shape2 shapes[] = {{3072, 3072, "attention q/k/v/out"}, {12288, 3072, "feed-forward up"},
                           {3072, 12288, "feed-forward down"}, {3072, 15360, "single block proj_out"}};
  const DType types[] = {DType::bf16, DType::q8_0, DType::q4_k, DType::f8_e4m3};
  std::printf("rows %lld; ms per call (GFLOP/s), ratio to bf16\n", static_cast<long long>(M));
  for (const Shape2& s : shapes) {
    const Tensor x = test::random_tensor({M, s.K}, 1, DType::bf16);
    const std::vector<float> values = test::random_values(s.N * s.K, 2, -0.05, 0.05);
    std::vector<Tensor> w;
    for (DType t : types) w.push_back(from_vector(values, {s.N, s.K}, t));
    std::vector<double> best(w.size(), 1e30);
    for (int round = 0; round < 3; ++round)
      for (size_t i = 0; i < w.size(); ++i)
        for (int call = 0; call < 3; ++call) {
          const auto t0 = std::chrono::steady_clock::now();
          wait(linear(x, w[i]));
          best[i] = std::min(best[i], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
    std::printf("N %lld K %lld (%s):", static_cast<long long>(s.N), static_cast<long long>(s.K), s.what);
    for (size_t i = 0; i < w.size(); ++i)
      std::printf("  %s %.1f ms (%.0f) %.2fx", dtype_name(types[i]), best[i] * 1e3, 2.0 * M * s.N * s.K / best[i] / 1e9,
                  best[0] / best[i]);
    std::printf("\n");
  }
}
