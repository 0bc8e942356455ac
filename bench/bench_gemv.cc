// Single-row linears (the modulation projections of a DiT block): kiln's gemv kernel with f32
// and with bf16 weights (bf16 x, bias and y too, as in bf16 mode) against the GEMM libraries
// called with M = 1, and one grouped launch of several products against one call per product.
// These products stream their weights once, so the counter is weight GB/s; after the runs a
// summary prints kiln's f32 and bf16 times per shape and their ratio.
//
//   ./bench_gemv
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <tuple>
#include <vector>

#include "core/dtype.h"

#include "devices/cpu/kernels/gemm.h"
#include "devices/cpu/kernels/gemv.h"

namespace {

using kiln::cpu::RowProduct;

struct Problem {
  int64_t k, n;
  int copies;  // products sharing x (FLUX.1: 57 block modulations + norm_out read silu(temb))
  std::vector<float> x, w, bias, y;
  std::vector<uint16_t> x16, w16, bias16, y16;  // the same values in bf16
  Problem(int64_t k_, int64_t n_, int copies_)
      : k(k_), n(n_), copies(copies_), x(size_t(k_), 0.01f), w(size_t(k_ * n_ * copies_), 0.02f),
        bias(size_t(n_ * copies_), 0.5f), y(size_t(n_ * copies_)), x16(x.size(), kiln::f32_to_bf16(0.01f)),
        w16(w.size(), kiln::f32_to_bf16(0.02f)), bias16(bias.size(), kiln::f32_to_bf16(0.5f)), y16(y.size()) {}
  RowProduct product(int c) {
    return {w.data() + size_t(c) * size_t(n * k), bias.data() + size_t(c * n), y.data() + size_t(c * n), n};
  }
  RowProduct product_bf16(int c) {
    return {w16.data() + size_t(c) * size_t(n * k), bias16.data() + size_t(c * n), y16.data() + size_t(c * n), n,
            kiln::DType::bf16, kiln::DType::bf16, kiln::DType::bf16};
  }
  double bytes(bool bf16) const { return double(w.size()) * (bf16 ? 2.0 : 4.0); }
};

// Best seconds per (k, n, copies) and weight dtype (0 f32, 1 bf16), for the summary.
std::map<std::tuple<int64_t, int64_t, int64_t>, std::map<int, double>>& results() {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, std::map<int, double>> r;
  return r;
}

void BM_GemvKiln(benchmark::State& st) {
  Problem p(st.range(0), st.range(1), int(st.range(2)));
  const bool bf16 = st.range(3) != 0;
  std::vector<RowProduct> all;
  for (int c = 0; c < p.copies; ++c) all.push_back(bf16 ? p.product_bf16(c) : p.product(c));
  double fastest = 1e30;
  for (auto _ : st) {  // one launch for every copy
    const auto t0 = std::chrono::steady_clock::now();
    if (bf16) {
      kiln::cpu::gemv_rows(p.x16.data(), kiln::DType::bf16, p.k, all);
    } else {
      kiln::cpu::gemv_rows(p.x.data(), p.k, all);
    }
    fastest = std::min(fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  st.counters["GB/s"] = benchmark::Counter(p.bytes(bf16), benchmark::Counter::kIsIterationInvariantRate);
  results()[{p.k, p.n, p.copies}][bf16 ? 1 : 0] = fastest;
  st.SetLabel(bf16 ? "bf16 weights" : "f32 weights");
}

void BM_GemvOneDnnSgemm(benchmark::State& st) {
  Problem p(st.range(0), st.range(1), int(st.range(2)));
  for (auto _ : st)
    for (int c = 0; c < p.copies; ++c) {  // one call per copy, as strict eager launches them
      const RowProduct r = p.product(c);
      kiln::cpu::sgemm_with(kiln::cpu::GemmBackend::onednn, false, true, 1, p.n, p.k, 1.0f, p.x.data(), p.k,
                            static_cast<const float*>(r.w), p.k, 0.0f, static_cast<float*>(r.y), p.n);
    }
  st.counters["GB/s"] = benchmark::Counter(p.bytes(false), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GemvOpenBlas(benchmark::State& st) {
  Problem p(st.range(0), st.range(1), int(st.range(2)));
  for (auto _ : st)
    for (int c = 0; c < p.copies; ++c) {
      const RowProduct r = p.product(c);
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(p.n), int(p.k), 1.0f, static_cast<const float*>(r.w), int(p.k),
                  p.x.data(), 1, 0.0f, static_cast<float*>(r.y), 1);
    }
  st.counters["GB/s"] = benchmark::Counter(p.bytes(false), benchmark::Counter::kIsIterationInvariantRate);
}

// (k, n, copies): a FLUX.1 double block's modulation (3072 -> 6 x 3072), a single block's
// (3072 -> 3 x 3072), and four single-block modulations in one group.
#define GEMV_ARGS Args({3072, 18432, 1})->Args({3072, 9216, 1})->Args({3072, 9216, 4})->Unit(benchmark::kMillisecond)
BENCHMARK(BM_GemvKiln)
    ->ArgNames({"k", "n", "copies", "bf16"})
    ->ArgsProduct({{3072}, {18432}, {1}, {0, 1}})
    ->ArgsProduct({{3072}, {9216}, {1, 4}, {0, 1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemvOneDnnSgemm)->GEMV_ARGS;
BENCHMARK(BM_GemvOpenBlas)->GEMV_ARGS;

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  std::printf("\nkiln's gemv, best ms per launch (f32 / bf16 = the speedup of bf16 weights):\n");
  std::printf("%6s %6s %6s  %10s %10s %8s\n", "k", "n", "copies", "f32", "bf16", "f32/bf16");
  for (const auto& [shape, by_type] : results()) {
    const auto [k, n, copies] = shape;
    const double f = by_type.count(0) ? by_type.at(0) : 0.0, b = by_type.count(1) ? by_type.at(1) : 0.0;
    std::printf("%6lld %6lld %6lld  %10.3f %10.3f %8.3f\n", (long long)k, (long long)n, (long long)copies, f * 1e3,
                b * 1e3, b > 0 ? f / b : 0.0);
  }
  benchmark::Shutdown();
  return 0;
}
