// Linear-layer GEMMs of a FLUX/SD3 DiT block: OpenBLAS vs oneDNN vs kiln's matmul path.
//
// Shapes: A = [M,K] activations, B = weight, C = [M,N]; M in {1024, 4096},
// (K,N) in {(3072,3072), (3072,12288), (12288,3072)}, with B stored [N,K] (trans_b, a
// PyTorch Linear weight) and [K,N]. Each shape is timed through
//   (a) cblas_sgemm directly,
//   (b) oneDNN directly: dnnl_sgemm and a matmul primitive created ahead of time,
//   (c) kiln's path (make_kiln_matmul below),
// reporting GFLOP/s (2*M*N*K flops) as a counter. After the runs a summary prints, per
// shape, each library's GFLOP/s and the ratio kiln / max(OpenBLAS, best oneDNN).
//
//   ./bench_matmul                              # everything (about a minute on 2 cores)
//   ./bench_matmul --benchmark_filter=M:1024    # the smaller shapes only
//   ./bench_matmul --benchmark_repetitions=3    # summary takes the best repetition
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <thread>
#include <vector>

#include "devices/cpu/kernels/gemm.h"
#include "exec/host.h"
#include "exec/ops.h"

namespace {

struct Shape {
  int64_t M, K, N;
  bool trans_b;  // B stored [N,K]

  double flops() const { return 2.0 * static_cast<double>(M) * N * K; }
  int64_t ldb() const { return trans_b ? K : N; }
  std::string name() const {
    return "M:" + std::to_string(M) + "/K:" + std::to_string(K) + "/N:" + std::to_string(N) +
           "/trans_b:" + std::to_string(trans_b);
  }
};

std::vector<Shape> dit_shapes() {
  std::vector<Shape> shapes;
  for (bool trans_b : {true, false}) {
    for (int64_t M : {1024, 4096}) {
      for (auto [K, N] : {std::pair<int64_t, int64_t>{3072, 3072}, {3072, 12288}, {12288, 3072}}) {
        shapes.push_back({M, K, N, trans_b});
      }
    }
  }
  return shapes;
}

// Row-major A [M,K], B [N,K] or [K,N], C [M,N], filled with small values (the values
// do not affect speed; this only avoids denormals and uninitialised reads).
struct Operands {
  std::vector<float> A, B, C;
  explicit Operands(const Shape& s)
      : A(static_cast<size_t>(s.M * s.K)), B(static_cast<size_t>(s.K * s.N)),
        C(static_cast<size_t>(s.M * s.N)) {
    for (size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(i % 17) * 0.01f;
    for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>(i % 13) * 0.01f;
  }
};

// The library paths of one shape run back to back and share operands (up to 400 MB),
// which saves most of the setup time; the last shape's operands stay cached.
std::shared_ptr<Operands> operands_for(const Shape& s) {
  static Shape cached_shape{0, 0, 0, false};
  static std::shared_ptr<Operands> cached;
  if (!cached || cached_shape.M != s.M || cached_shape.K != s.K || cached_shape.N != s.N ||
      cached_shape.trans_b != s.trans_b) {
    cached.reset();  // free the old operands before allocating the new ones
    cached = std::make_shared<Operands>(s);
    cached_shape = s;
  }
  return cached;
}

// A benchmarked path: set up once for a shape, then the returned callable does one GEMM.
using Runner = std::function<void()>;

Runner make_openblas(const Shape& s) {
  auto op = operands_for(s);
  return [s, op] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(s.M), static_cast<blasint>(s.N), static_cast<blasint>(s.K),
                1.0f, op->A.data(), static_cast<blasint>(s.K), op->B.data(),
                static_cast<blasint>(s.ldb()), 0.0f, op->C.data(), static_cast<blasint>(s.N));
  };
}

Runner make_onednn_sgemm(const Shape& s) {
  auto op = operands_for(s);
  return [s, op] {
    dnnl_sgemm('N', s.trans_b ? 'T' : 'N', s.M, s.N, s.K, 1.0f, op->A.data(), s.K, op->B.data(),
               s.ldb(), 0.0f, op->C.data(), s.N);
  };
}

// A oneDNN matmul primitive for the fixed shape and strides, created outside the timing.
Runner make_onednn_matmul(const Shape& s) {
  using dnnl::memory;
  struct State {
    std::shared_ptr<Operands> op;
    dnnl::engine eng{dnnl::engine::kind::cpu, 0};
    dnnl::stream strm{eng};
    dnnl::matmul prim;
    memory a, b, c;
  };
  auto st = std::make_shared<State>();
  st->op = operands_for(s);
  const memory::desc a_md({s.M, s.K}, memory::data_type::f32, memory::dims{s.K, 1});
  const memory::desc b_md({s.K, s.N}, memory::data_type::f32,
                          s.trans_b ? memory::dims{1, s.K} : memory::dims{s.N, 1});
  const memory::desc c_md({s.M, s.N}, memory::data_type::f32, memory::dims{s.N, 1});
  st->prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), st->eng));
  st->a = memory(a_md, st->eng, st->op->A.data());
  st->b = memory(b_md, st->eng, st->op->B.data());
  st->c = memory(c_md, st->eng, st->op->C.data());
  return [st] {
    st->prim.execute(st->strm,
                     {{DNNL_ARG_SRC, st->a}, {DNNL_ARG_WEIGHTS, st->b}, {DNNL_ARG_DST, st->c}});
    st->strm.wait();
  };
}

// ======================= (c) KILN'S PATH ===========================================
// kiln's public matmul op on tensors (B stored [N,K] when trans_b, like a Linear weight):
// each product is dispatched through the strict-eager dispatcher, its output taken from
// the device allocator's pool, the kernel enqueued, and the host waits for the result.
Runner make_kiln_matmul(int64_t M, int64_t N, int64_t K, bool trans_b) {
  const Shape s{M, K, N, trans_b};
  auto op = operands_for(s);
  const kiln::Tensor a = kiln::from_vector(op->A, {M, K});
  const kiln::Tensor b = kiln::from_vector(op->B, trans_b ? kiln::Shape{N, K} : kiln::Shape{K, N});
  return [a, b, trans_b] {
    const kiln::Tensor c = kiln::matmul(a, b, false, trans_b);
    kiln::wait(c);
  };
}
// ===================================================================================

Runner make_kiln(const Shape& s) { return make_kiln_matmul(s.M, s.N, s.K, s.trans_b); }

struct Path {
  const char* name;
  Runner (*make)(const Shape&);
};
const Path kPaths[] = {{"openblas", make_openblas},
                       {"onednn_sgemm", make_onednn_sgemm},
                       {"onednn_matmul", make_onednn_matmul},
                       {"kiln", make_kiln}};

void run_gemm(benchmark::State& state, const Path& path, const Shape& shape) {
  const Runner run = path.make(shape);
  run();  // warm-up: JIT kernels, thread pools, first-touch of C
  for (auto _ : state) run();
  state.counters["GFLOP/s"] = benchmark::Counter(
      shape.flops() * static_cast<double>(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}

// Console output as usual, plus each run's GFLOP/s kept for the summary.
class CapturingReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> gflops;  // registered name -> best GFLOP/s over repetitions

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      const auto it = r.counters.find("GFLOP/s");
      if (r.run_type == Run::RT_Iteration && !r.error_occurred && it != r.counters.end()) {
        double& best = gflops[r.run_name.function_name];
        best = std::max(best, it->second.value);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

std::string bench_name(const Path& p, const Shape& s) { return std::string(p.name) + "/" + s.name(); }

// "%9.1f" of a GFLOP/s figure, or "-" for a path that did not run (filtered out).
std::string cell(double gflops) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%9.1f", gflops);
  return gflops > 0 ? buf : "        -";
}

void print_summary(const std::vector<Shape>& shapes, const std::map<std::string, double>& g) {
  const auto get = [&](const char* path, const Shape& s) {
    const auto it = g.find(std::string(path) + "/" + s.name());
    return it == g.end() ? 0.0 : it->second;
  };
  std::printf("\nSummary (GFLOP/s, best repetition; kiln uses %s; openblas core %s)\n",
              kiln::cpu::gemm_backend_name(kiln::cpu::gemm_backend()), openblas_get_corename());
  std::printf("%-32s %9s %9s %9s %9s %10s\n", "shape", "openblas", "dnnl_gemm", "dnnl_mm", "kiln",
              "kiln/best");
  for (const Shape& s : shapes) {
    const double ob = get("openblas", s), dg = get("onednn_sgemm", s),
                 dm = get("onednn_matmul", s), kl = get("kiln", s);
    const double best = std::max({ob, dg, dm});
    if (kl == 0.0 && best == 0.0) continue;  // shape filtered out
    std::printf("%-32s %s %s %s %s", s.name().c_str(), cell(ob).c_str(), cell(dg).c_str(),
                cell(dm).c_str(), cell(kl).c_str());
    if (kl > 0 && best > 0) {
      std::printf(" %10.3f\n", kl / best);
    } else {
      std::printf(" %10s\n", "-");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // One thread per core for both libraries (OPENBLAS_NUM_THREADS is read when OpenBLAS
  // loads, before main, so set its thread count directly).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(cores);
  openblas_set_num_threads(cores);
  std::printf("threads=%d openblas_core=%s openblas_config=\"%s\" kiln_backend=%s\n", cores,
              openblas_get_corename(), openblas_get_config(),
              kiln::cpu::gemm_backend_name(kiln::cpu::gemm_backend()));

  const std::vector<Shape> shapes = dit_shapes();
  for (const Shape& s : shapes) {
    for (const Path& p : kPaths) {
      benchmark::RegisterBenchmark(bench_name(p, s).c_str(), run_gemm, p, s)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->MinTime(0.5);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  CapturingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  print_summary(shapes, reporter.gflops);
  return 0;
}
