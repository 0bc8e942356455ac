// The GEMM of a multi-row linear layer at FLUX.1's shapes (a 512² image: 1024 image + 512 text
// tokens; rows 512, 1024, 1536 and 4096), T5-XXL's (256 and 512 tokens) and CLIP-L's (77), f32
// against bf16 (kernels/linear_gemm.h):
//   f32:  dnnl_sgemm (kiln's f32 linears of 1024+ rows), the oneDNN matmul primitive reading the
//         plain [N,K] weight (2..1023 rows) and reading it pre-packed (compiled mode);
//   bf16: the dot path (oneDNN's bf16 primitive) reading the plain and the pre-packed weight, the
//         widened path (bf16 widened to f32 a weight panel at a time, then the f32 primitive), and
//         the amx path (kiln's AMX tile kernel, kernels/amx_gemm.h) where AMX is usable.
// GFLOP/s counters (2*M*N*K per product); after the runs a summary prints each path's best
// GFLOP/s per shape, kiln's f32 and bf16 linear as this process runs them (eager: plain weights;
// compiled: pre-packed where the path reads packs) and their ratio bf16/f32.
//
//   ./bench_linear        # ~3 min on 2 cores; --benchmark_filter=BM_Linear/M:512/ for one row count
#include <benchmark/benchmark.h>

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <new>
#include <tuple>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "devices/cpu/kernels/amx_gemm.h"
#include "devices/cpu/kernels/linear_gemm.h"

namespace {

using kiln::DType;
using kiln::cpu::Bf16LinearPath;

// 64-byte aligned, as kiln's tensors are (its allocator's blocks).
template <class T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <class U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  bool operator==(const Aligned64&) const { return true; }
};
template <class T>
using AlignedVector = std::vector<T, Aligned64<T>>;

// A = [M,K] activations, W = [N,K] weight, C = [M,N]; the same values in f32 and bf16.
struct Problem {
  int64_t M, K, N;
  AlignedVector<float> a, w, c;
  AlignedVector<uint16_t> a16, w16, c16;
  Problem(int64_t m, int64_t k, int64_t n)
      : M(m), K(k), N(n), a(size_t(m * k)), w(size_t(n * k)), c(size_t(m * n)), a16(a.size()), w16(w.size()),
        c16(c.size()) {
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 17) * 0.01f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = float(i % 13) * 0.01f;
    kiln::convert_from_f32(a.data(), a16.data(), DType::bf16, int64_t(a.size()));
    kiln::convert_from_f32(w.data(), w16.data(), DType::bf16, int64_t(w.size()));
  }
  double flops() const { return 2.0 * double(M) * double(N) * double(K); }
};

enum Path { kSgemm, kF32Plain, kF32Packed, kDotPlain, kDotPacked, kWidened, kAmx, kPaths };
const char* const kPathName[] = {"f32 dnnl_sgemm",   "f32 primitive", "f32 primitive, packed", "bf16 dot",
                                 "bf16 dot, packed", "bf16 widened",  "bf16 amx"};

Bf16LinearPath bf16_path(int path) {
  return path == kWidened ? Bf16LinearPath::widened : path == kAmx ? Bf16LinearPath::amx : Bf16LinearPath::dot;
}

// GFLOP/s by (M, K, N) and path, for the summary.
std::map<std::tuple<int64_t, int64_t, int64_t>, std::map<int, double>>& results() {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, std::map<int, double>> r;
  return r;
}

void BM_Linear(benchmark::State& st) {
  Problem p(st.range(0), st.range(1), st.range(2));
  const int path = int(st.range(3));
  if ((path == kDotPlain || path == kDotPacked) && !kiln::cpu::bf16_dot_path_available()) {
    st.SkipWithError("this oneDNN has no bf16 matmul for this CPU");
    return;
  }
  if (path == kAmx && !kiln::cpu::amx_bf16_usable()) {
    st.SkipWithError("AMX is not usable here");
    return;
  }
  std::shared_ptr<const kiln::cpu::PackedLinearWeight> packed;
  if (path == kF32Packed) packed = kiln::cpu::pack_linear_weight(p.w.data(), p.N, p.K);
  if (path == kDotPacked) packed = kiln::cpu::pack_linear_weight(p.w16.data(), DType::bf16, p.N, p.K);
  auto run = [&] {
    switch (path) {
      case kSgemm:
        dnnl_sgemm('N', 'T', p.M, p.N, p.K, 1.0f, p.a.data(), p.K, p.w.data(), p.K, 0.0f, p.c.data(), p.N);
        return;
      case kF32Plain:
      case kF32Packed:
        kiln::cpu::linear_f32(p.a.data(), p.w.data(), packed.get(), nullptr, p.c.data(), p.M, p.N, p.K);
        return;
      default:
        kiln::cpu::linear_bf16(p.a16.data(), p.w16.data(), packed.get(), nullptr, DType::f32, p.c16.data(),
                               DType::bf16, p.M, p.N, p.K, bf16_path(path));
    }
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
  st.SetLabel(kPathName[path]);
}

// Packing one weight into the primitive's layout (once per weight in compiled mode), GB/s of the
// weight as stored.
void BM_Pack(benchmark::State& st) {
  Problem p(1, st.range(0), st.range(1));
  const DType type = st.range(2) ? DType::bf16 : DType::f32;
  const void* w = type == DType::bf16 ? static_cast<const void*>(p.w16.data()) : p.w.data();
  const kiln::BufferPtr storage = kiln::host_allocate(kiln::cpu::packed_linear_weight_bytes(p.N, p.K, type));
  for (auto _ : st) kiln::cpu::pack_linear_weight(w, type, p.N, p.K, storage->data(), storage);
  st.counters["GB/s"] = benchmark::Counter(double(p.w.size() * kiln::dtype_size(type)),
                                           benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(kiln::dtype_name(type));
}

void linear_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "path"});
  // FLUX.1 at 512²: the text stream (512 rows), the image stream (1024), a single block's joint
  // sequence (1536), and 4096 (1024² images). K x N: attention projections (3072 x 3072), a
  // double block's MLP in and out (3072 x 12288, 12288 x 3072), a single block's output
  // projection (15360 x 3072) and its fused q/k/v (3072 x 9216).
  for (int64_t M : {512, 1024, 1536, 4096})
    for (auto [K, N] : {std::pair<int64_t, int64_t>{3072, 3072}, {3072, 12288}, {12288, 3072}, {15360, 3072},
                        {3072, 9216}})
      for (int64_t path = 0; path < kPaths; ++path) b->Args({M, K, N, path});
  // T5-XXL encoding FLUX's 256 (schnell) or 512 (dev) tokens: q/k/v/o (4096 x 4096), the gated
  // feed-forward's wi_0 / wi_1 (4096 x 10240) and wo (10240 x 4096).
  for (int64_t M : {256, 512})
    for (auto [K, N] : {std::pair<int64_t, int64_t>{4096, 4096}, {4096, 10240}, {10240, 4096}})
      for (int64_t path = 0; path < kPaths; ++path) b->Args({M, K, N, path});
  // CLIP-L's 77 tokens: q/k/v/o (768 x 768) and its MLP in and out (768 x 3072, 3072 x 768).
  for (auto [K, N] : {std::pair<int64_t, int64_t>{768, 768}, {768, 3072}, {3072, 768}})
    for (int64_t path = 0; path < kPaths; ++path) b->Args({77, K, N, path});
}

}  // namespace

BENCHMARK(BM_Linear)->Apply(linear_shapes)->MinTime(0.2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Pack)
    ->ArgNames({"K", "N", "bf16"})
    ->ArgsProduct({{3072}, {3072, 12288}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  using kiln::cpu::kPrimitiveMaxRows;
  const Bf16LinearPath bf16 = kiln::cpu::bf16_linear_path();
  std::printf("\nGFLOP/s, weight [N,K]; this process's bf16 path: %s\n", kiln::cpu::bf16_linear_path_name(bf16));
  std::printf("%5s %6s %6s |", "M", "K", "N");
  for (int p = 0; p < kPaths; ++p) std::printf(" %22s", kPathName[p]);
  std::printf(" | %24s %24s\n", "eager: f32  bf16 (ratio)", "compiled: f32  bf16 (ratio)");
  for (const auto& [shape, by_path] : results()) {
    const auto [M, K, N] = shape;
    const auto at = [&](int p) { return by_path.count(p) ? by_path.at(p) : 0.0; };
    std::printf("%5lld %6lld %6lld |", (long long)M, (long long)K, (long long)N);
    for (int p = 0; p < kPaths; ++p) std::printf(" %22.1f", at(p));
    // What kiln runs: f32 rows < kPrimitiveMaxRows on the primitive (packed when compiled), the
    // rest on dnnl_sgemm; bf16 on the process's path (the dot path reads packs when compiled; amx never).
    const bool prim = M < kPrimitiveMaxRows, dot = bf16 == Bf16LinearPath::dot, amx = bf16 == Bf16LinearPath::amx;
    const double f32_eager = at(prim ? kF32Plain : kSgemm), f32_compiled = at(prim ? kF32Packed : kSgemm);
    const double bf16_eager = at(amx ? kAmx : dot ? kDotPlain : kWidened);
    const double bf16_compiled = at(amx ? kAmx : dot ? kDotPacked : kWidened);
    const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    std::printf(" | %7.1f %7.1f (%5.3f)   %7.1f %7.1f (%5.3f)\n", f32_eager, bf16_eager, ratio(bf16_eager, f32_eager),
                f32_compiled, bf16_compiled, ratio(bf16_compiled, f32_compiled));
  }
  benchmark::Shutdown();
  return 0;
}
