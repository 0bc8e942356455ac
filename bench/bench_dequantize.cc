// Dequantization of a weight panel (64 rows of 3072, as linears decode before their GEMM) from each
// storage type to bf16 and to f32, one row per call as the linears call it: the cpu row decoders
// (devices/cpu/kernels/dequantize.h) on 1 thread and on 2 (each decoding a panel of its own,
// without synchronising), and, for comparison, the scalar reference (core/quant_blocks.h) on 1
// thread. The counter is elements decoded per second, summed over the threads.
//
//   ./bench_dequantize
#include <benchmark/benchmark.h>

#include <cstdint>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/quant_blocks.h"
#include "devices/cpu/kernels/dequantize.h"

namespace {

using kiln::DType;

constexpr int64_t kRows = 64, kCols = 3072;
constexpr DType kTypes[] = {DType::q8_0, DType::q4_0, DType::q4_k, DType::q5_k, DType::f8_e4m3, DType::f8_e5m2};

template <bool kReference>
void BM_Dequantize(benchmark::State& st) {
  const DType t = kTypes[st.range(0)];
  const bool bf16 = st.range(1) != 0;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> w(size_t(kRows * kCols));
  for (float& v : w) v = dist(rng);
  const size_t row_bytes = kiln::storage_bytes(t, kCols);
  std::vector<uint8_t> q(row_bytes * kRows);
  kiln::quantize_from_f32(t, w.data(), q.data(), kRows * kCols);
  std::vector<float> f32(w.size());
  std::vector<uint16_t> b16(w.size());
  for (auto _ : st) {
    for (int64_t r = 0; r < kRows; ++r) {
      const uint8_t* src = q.data() + size_t(r) * row_bytes;
      if (bf16) {
        if constexpr (kReference) {
          kiln::dequantize_to_bf16(t, src, b16.data() + r * kCols, kCols);
        } else {
          kiln::cpu::dequantize_row_bf16(t, src, b16.data() + r * kCols, kCols);
        }
      } else {
        if constexpr (kReference) {
          kiln::dequantize_to_f32(t, src, f32.data() + r * kCols, kCols);
        } else {
          kiln::cpu::dequantize_row_f32(t, src, f32.data() + r * kCols, kCols);
        }
      }
    }
    benchmark::DoNotOptimize(bf16 ? static_cast<void*>(b16.data()) : static_cast<void*>(f32.data()));
    benchmark::ClobberMemory();
  }
  st.counters["Gelem/s"] =
      benchmark::Counter(double(kRows * kCols) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(std::string(kiln::dtype_name(t)) + (bf16 ? " -> bf16" : " -> f32"));
}

void args(benchmark::internal::Benchmark* b) {
  for (int64_t t = 0; t < int64_t(std::size(kTypes)); ++t)
    for (int64_t bf16 : {1, 0}) b->Args({t, bf16});
}

void BM_DequantizeKernel(benchmark::State& st) { BM_Dequantize<false>(st); }
void BM_DequantizeReference(benchmark::State& st) { BM_Dequantize<true>(st); }

BENCHMARK(BM_DequantizeKernel)->Apply(args)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_DequantizeReference)->Apply(args)->Threads(1)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
