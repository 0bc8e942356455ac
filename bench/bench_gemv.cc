// Single-row linears (the modulation projections of a DiT block): kiln's gemv kernel against
// the GEMM libraries called with M = 1, and one grouped launch of several products against one
// call per product. These products stream their weights once, so the counter is weight GB/s.
//
//   ./bench_gemv
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdint>
#include <vector>

#include "devices/cpu/kernels/gemm.h"
#include "devices/cpu/kernels/gemv.h"

namespace {

using kiln::cpu::RowProduct;

struct Problem {
  int64_t k, n;
  int copies;  // products sharing x (FLUX.1: 57 block modulations + norm_out read silu(temb))
  std::vector<float> x, w, bias, y;
  Problem(int64_t k_, int64_t n_, int copies_)
      : k(k_), n(n_), copies(copies_), x(size_t(k_), 0.01f), w(size_t(k_ * n_ * copies_), 0.02f),
        bias(size_t(n_ * copies_), 0.5f), y(size_t(n_ * copies_)) {}
  RowProduct product(int c) {
    return {w.data() + size_t(c) * size_t(n * k), bias.data() + size_t(c * n), y.data() + size_t(c * n), n};
  }
  double bytes() const { return double(w.size()) * 4.0; }
};

void BM_GemvKiln(benchmark::State& st) {
  Problem p(st.range(0), st.range(1), int(st.range(2)));
  std::vector<RowProduct> all;
  for (int c = 0; c < p.copies; ++c) all.push_back(p.product(c));
  for (auto _ : st) kiln::cpu::gemv_rows(p.x.data(), p.k, all);  // one launch for every copy
  st.counters["GB/s"] = benchmark::Counter(p.bytes(), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GemvOneDnnSgemm(benchmark::State& st) {
  Problem p(st.range(0), st.range(1), int(st.range(2)));
  for (auto _ : st)
    for (int c = 0; c < p.copies; ++c) {  // one call per copy, as strict eager launches them
      const RowProduct r = p.product(c);
      kiln::cpu::sgemm_with(kiln::cpu::GemmBackend::onednn, false, true, 1, p.n, p.k, 1.0f, p.x.data(), p.k, r.w,
                            p.k, 0.0f, r.y, p.n);
    }
  st.counters["GB/s"] = benchmark::Counter(p.bytes(), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GemvOpenBlas(benchmark::State& st) {
  Problem p(st.range(0), st.range(1), int(st.range(2)));
  for (auto _ : st)
    for (int c = 0; c < p.copies; ++c) {
      const RowProduct r = p.product(c);
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(p.n), int(p.k), 1.0f, r.w, int(p.k), p.x.data(), 1, 0.0f, r.y, 1);
    }
  st.counters["GB/s"] = benchmark::Counter(p.bytes(), benchmark::Counter::kIsIterationInvariantRate);
}

// (k, n, copies): a FLUX.1 double block's modulation (3072 -> 6 x 3072), a single block's
// (3072 -> 3 x 3072), and four single-block modulations in one group.
#define GEMV_ARGS Args({3072, 18432, 1})->Args({3072, 9216, 1})->Args({3072, 9216, 4})->Unit(benchmark::kMillisecond)
BENCHMARK(BM_GemvKiln)->GEMV_ARGS;
BENCHMARK(BM_GemvOneDnnSgemm)->GEMV_ARGS;
BENCHMARK(BM_GemvOpenBlas)->GEMV_ARGS;

}  // namespace

BENCHMARK_MAIN();
