// The GEMM of a multi-row linear layer at a DiT step's row counts: dnnl_sgemm (what kiln's
// linears ran on before), the oneDNN matmul primitive reading the plain [N,K] weight (what every
// mode's linears run on now: kernels/linear_gemm.h) and the same primitive reading the weight
// pre-packed (compiled mode, CompileOptions::prepack_weights), plus the one-off packing itself.
// GFLOP/s counters (2*M*N*K per product, mean); after the runs a summary prints each path's best
// GFLOP/s and its ratio to dnnl_sgemm's per shape.
//
//   ./bench_linear        # ~1 min on 2 cores
#include <benchmark/benchmark.h>

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "core/buffer.h"
#include "devices/cpu/kernels/linear_gemm.h"

namespace {

// A = [M,K] activations, W = [N,K] weight, C = [M,N].
struct Problem {
  int64_t M, K, N;
  std::vector<float> a, w, c;
  Problem(int64_t m, int64_t k, int64_t n)
      : M(m), K(k), N(n), a(size_t(m * k)), w(size_t(n * k)), c(size_t(m * n)) {
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 17) * 0.01f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = float(i % 13) * 0.01f;
  }
  double flops() const { return 2.0 * double(M) * double(N) * double(K); }
};

// GFLOP/s by (M, K, N) and path, for the summary.
std::map<std::tuple<int64_t, int64_t, int64_t>, std::map<int, double>>& results() {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, std::map<int, double>> r;
  return r;
}
const char* const kPath[] = {"dnnl_sgemm", "primitive, plain weight", "primitive, pre-packed weight"};

// path 0: dnnl_sgemm; 1: linear_f32 reading the plain weight; 2: linear_f32 reading it pre-packed.
void BM_Linear(benchmark::State& st) {
  Problem p(st.range(0), st.range(1), st.range(2));
  const int path = int(st.range(3));
  std::shared_ptr<const kiln::cpu::PackedLinearWeight> packed;
  if (path == 2) packed = kiln::cpu::pack_linear_weight(p.w.data(), p.N, p.K);
  auto run = [&] {
    if (path == 0)
      dnnl_sgemm('N', 'T', p.M, p.N, p.K, 1.0f, p.a.data(), p.K, p.w.data(), p.K, 0.0f, p.c.data(), p.N);
    else
      kiln::cpu::linear_f32(p.a.data(), p.w.data(), packed.get(), nullptr, p.c.data(), p.M, p.N, p.K);
  };
  run();  // first use of the shape (JIT, primitive creation) stays out of the timing
  double fastest = 1e30;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    fastest = std::min(fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(p.flops(), benchmark::Counter::kIsIterationInvariantRate);
  results()[{p.M, p.K, p.N}][path] = p.flops() / fastest * 1e-9;  // the summary takes the best run
  st.SetLabel(kPath[path]);
}

// Packing one weight into the primitive's layout (once per weight in compiled mode), GB/s of weight.
void BM_Pack(benchmark::State& st) {
  Problem p(1, st.range(0), st.range(1));
  const kiln::BufferPtr storage = kiln::host_allocate(kiln::cpu::packed_linear_weight_bytes(p.N, p.K));
  for (auto _ : st) kiln::cpu::pack_linear_weight(p.w.data(), p.N, p.K, storage->data(), storage);
  st.counters["GB/s"] =
      benchmark::Counter(double(p.w.size()) * 4.0, benchmark::Counter::kIsIterationInvariantRate);
}

void linear_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "path"});
  // The image stream at 256² (256 rows), the text stream (512), a single block at 256² (768),
  // and the larger row counts of 512² (1024, 1536) and 1024² (4608).
  for (int64_t M : {256, 512, 768, 1024, 1536, 4608})
    for (auto [K, N] : {std::pair<int64_t, int64_t>{3072, 3072}, {3072, 12288}, {15360, 3072}})
      for (int64_t path : {0, 1, 2}) b->Args({M, K, N, path});
}

}  // namespace

BENCHMARK(BM_Linear)->Apply(linear_shapes)->MinTime(0.2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Pack)->ArgNames({"K", "N"})->Args({3072, 3072})->Args({3072, 12288})->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  std::printf("\nGFLOP/s (and / dnnl_sgemm), B = weight [N,K]:\n");
  std::printf("%6s %6s %6s  %22s  %30s  %34s\n", "M", "K", "N", kPath[0], kPath[1], kPath[2]);
  for (const auto& [shape, by_path] : results()) {
    const auto [M, K, N] = shape;
    const auto at = [&](int p) { return by_path.count(p) ? by_path.at(p) : 0.0; };
    const double base = at(0);
    std::printf("%6lld %6lld %6lld  %22.1f  %22.1f (%5.3f)  %26.1f (%5.3f)\n", (long long)M, (long long)K,
                (long long)N, base, at(1), base > 0 ? at(1) / base : 0.0, at(2), base > 0 ? at(2) / base : 0.0);
  }
  benchmark::Shutdown();
  return 0;
}
