// conv2d on bf16 vs f32 tensors at the VAE decoder's sizes (FLUX / SD3 VAE decoding a 512x512
// image: 512 channels at 64x64 and 128x128, 256 at 256x256, 128 at 512x512, 3x3 convs and the
// 1x1 shortcut convs where the channel count halves; a 1024x1024 image has 4x the pixels).
// Batch 1. Times, per shape,
//   f32/*        conv2d_f32 on f32 x, weight, bias and y,
//   bf16/*       conv2d() on bf16 x, weight, bias and y, with the math conv2d() picks for this
//                CPU (conv2d_bf16_math(): bf16 primitives with AMX, else f32 math),
//   bf16_math/*  the same tensors forced through oneDNN's bf16 primitive (ConvMath::kBf16),
// then prints the speedups f32/bf16 and f32/bf16_math. Best of a few repetitions.
//
//   ./bench_conv2d                                # all shapes (~60 s on 2 cores)
//   ./bench_conv2d --benchmark_filter=C:512/H:64  # quick
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "best_time_reporter.h"
#include "core/dtype.h"
#include "devices/cpu/kernels/conv2d.h"

namespace {

using kiln::DType;
using kiln::cpu::detail::ConvMath;

struct Shape {
  int64_t C, O, H, K;  // square images, stride 1, "same" padding
  std::string name() const {
    return "C:" + std::to_string(C) + "/O:" + std::to_string(O) + "/H:" + std::to_string(H) + "/K:" + std::to_string(K);
  }
  double flops() const { return 2.0 * double(C) * double(O) * double(K * K) * double(H * H); }
};
const Shape kShapes[] = {
    {512, 512, 64, 3},   // mid block and first up block
    {512, 512, 128, 3},  // second up block
    {256, 256, 256, 3},  // third up block
    {128, 128, 512, 3},  // last up block
    {512, 256, 256, 1},  // 1x1 shortcut as the channels halve
    {256, 128, 512, 1},
};

// Smooth inputs in [-1, 1] (weights scaled down), as f32 and as the same values in bf16.
struct Tensors {
  std::vector<float> x, w, b, y;
  std::vector<uint16_t> xb, wb, bb, yb;
  explicit Tensors(const Shape& s) {
    const auto fill = [](size_t n, float scale, float step, std::vector<float>& f, std::vector<uint16_t>& h) {
      f.resize(n);
      h.resize(n);
      for (size_t i = 0; i < n; ++i) {
        h[i] = kiln::f32_to_bf16(scale * std::sin(step * static_cast<float>(i % 10007)));
        f[i] = kiln::bf16_to_f32(h[i]);
      }
    };
    fill(size_t(s.C * s.H * s.H), 1.0f, 0.37f, x, xb);
    fill(size_t(s.O * s.C * s.K * s.K), 0.05f, 0.11f, w, wb);
    fill(size_t(s.O), 0.1f, 0.7f, b, bb);
    y.resize(size_t(s.O * s.H * s.H));
    yb.resize(y.size());
  }
};

void run_f32(const Shape& s, Tensors& t) {
  kiln::cpu::conv2d_f32(t.x.data(), t.w.data(), t.b.data(), t.y.data(), 1, s.C, s.H, s.H, s.O, s.K, s.K, 1, 1, s.K / 2,
                        s.K / 2);
}

void run_bf16(ConvMath math, const Shape& s, Tensors& t) {
  kiln::cpu::detail::conv2d_with_math(math, {t.xb.data(), DType::bf16}, {t.wb.data(), DType::bf16},
                                      {t.bb.data(), DType::bf16}, t.yb.data(), DType::bf16, 1, s.C, s.H, s.H, s.O, s.K,
                                      s.K, 1, 1, s.K / 2, s.K / 2);
}

void BM_F32(benchmark::State& state, Shape s) {
  Tensors t(s);
  run_f32(s, t);  // warm-up: builds the cached primitive
  for (auto _ : state) run_f32(s, t);
}

void BM_Bf16(benchmark::State& state, Shape s, ConvMath math) {
  Tensors t(s);
  run_bf16(math, s, t);
  for (auto _ : state) run_bf16(math, s, t);
}

}  // namespace

int main(int argc, char** argv) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(cores);
  const bool bf16_primitive = kiln::cpu::detail::conv2d_bf16_math() == ConvMath::kBf16;
  std::printf("threads=%d conv2d() bf16 math on this CPU: %s\n", cores,
              bf16_primitive ? "bf16 primitive (AMX)" : "f32 (bf16 widened by the reorders)");
  for (const Shape& s : kShapes) {
    const auto reg = [&](const std::string& what, auto fn) {
      benchmark::RegisterBenchmark((what + "/" + s.name()).c_str(), fn)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->Iterations(1)
          ->Repetitions(3);
    };
    reg("f32", [s](benchmark::State& st) { BM_F32(st, s); });
    reg("bf16", [s](benchmark::State& st) { BM_Bf16(st, s, kiln::cpu::detail::conv2d_bf16_math()); });
    reg("bf16_math", [s](benchmark::State& st) { BM_Bf16(st, s, ConvMath::kBf16); });
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  kiln::bench::BestTimeReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  std::printf("\nSummary (fastest repetition)\n");
  for (const Shape& s : kShapes) {
    const auto get = [&](const std::string& what) {
      const auto it = reporter.best_ms.find(what + "/" + s.name());
      return it == reporter.best_ms.end() ? 0.0 : it->second;
    };
    const double f32 = get("f32"), bf16 = get("bf16"), bf16_math = get("bf16_math");
    if (f32 == 0.0 || bf16 == 0.0 || bf16_math == 0.0) continue;  // filtered out
    std::printf("%-26s f32 %8.1f ms (%5.1f GFLOP/s)  bf16 %8.1f ms  bf16_math %8.1f ms  speedup f32/bf16 = %.3f  "
                "f32/bf16_math = %.3f\n",
                s.name().c_str(), f32, s.flops() / f32 * 1e-6, bf16, bf16_math, f32 / bf16, f32 / bf16_math);
  }
  return 0;
}
