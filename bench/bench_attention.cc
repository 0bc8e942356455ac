// Tiled attention kernel vs the two plain GEMMs it replaces, and bf16 vs f32 attention, at
// FLUX sizes.
//
// Cases L=4608 (FLUX at 1024x1024: 4096 image + 512 text tokens) and L=1536 (512x512: 1024
// image + 512 text tokens), 24 heads, head dim 128, batch 1. Times
//   attention/L:*       kiln's scaled_dot_product_attention op over all heads, f32 tensors,
//   attention_bf16/L:*  the same op on bf16 q/k/v (bf16 output), the same values rounded,
//   qk/L:*              per head, S = Q K^T as one full sgemm into an [L,L] buffer,
//   pv/L:*              per head, O = P V as one full sgemm from that buffer,
//   tiles_widened/L:*   the bf16 kernel's tile products alone (no softmax), as it runs them:
//                       bf16 rows widened to f32, then sgemm,
//   tiles_bf16/L:*      the same products with bf16 operands through oneDNN's bf16 matmul
//                       (f32 accumulation): the alternative the kernel was measured against,
// then prints the ratio attention / (qk + pv) (target <= 1.5), the speedup f32 / bf16, the
// ratio tiles_bf16 / tiles_widened, the ratio attention_bf16 / tiles_bf16 (target <= 1.5), and
// peak memory: the kernel's attention_workspace_bytes; the peak-RSS growth (VmHWM, reset
// through /proc/self/clear_refs) of the first attention call, which includes oneDNN's own
// packing buffers; and that of the reference (its one-head [L,L] buffer and first GEMM), all
// against the L*L*heads*4 bytes of a full score tensor.
//
//   ./bench_attention                            # both sizes (~60 s on 2 cores)
//   ./bench_attention --benchmark_filter=L:1536  # quick
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "best_time_reporter.h"
#include "core/dtype.h"
#include "devices/cpu/kernels/attention.h"
#include "devices/cpu/kernels/gemm.h"
#include "devices/cpu/kernels/onednn.h"
#include "devices/runtime.h"
#include "exec/host.h"
#include "exec/ops.h"

namespace {

constexpr int64_t kHeads = 24, kHeadDim = 128;

struct Case {
  int64_t L;
  std::string suffix() const { return "/L:" + std::to_string(L); }
};
const Case kCases[] = {{4608}, {1536}};

// q, k, v [1,H,L,D] with smooth values in [-1,1] and the [1,H,L,D] output.
struct Inputs {
  int64_t L;
  std::vector<float> q, k, v, out;
  explicit Inputs(int64_t l) : L(l) {
    const size_t n = static_cast<size_t>(kHeads * L * kHeadDim);
    q.resize(n);
    k.resize(n);
    v.resize(n);
    out.resize(n);
    for (size_t i = 0; i < n; ++i) {
      q[i] = std::sin(0.37f * static_cast<float>(i % 9973));
      k[i] = std::cos(0.11f * static_cast<float>(i % 7919));
      v[i] = std::sin(0.05f * static_cast<float>(i % 5003));
    }
  }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(kHeadDim)); }
  size_t head_offset(int64_t h) const { return static_cast<size_t>(h * L * kHeadDim); }
};

// kiln's public attention op on [1, H, L, D] tensors of `dtype`, through the strict-eager
// dispatcher; the host waits for the result.
struct OpInputs {
  kiln::Tensor q, k, v;
  explicit OpInputs(const Inputs& in, kiln::DType dtype = kiln::DType::f32) {
    const kiln::Shape s{1, kHeads, in.L, kHeadDim};
    q = kiln::from_vector(in.q, s, dtype);
    k = kiln::from_vector(in.k, s, dtype);
    v = kiln::from_vector(in.v, s, dtype);
  }
};

void run_attention(const OpInputs& in) {
  kiln::wait(kiln::scaled_dot_product_attention(in.q, in.k, in.v));
}

// Reference GEMM 1 for one head: S[L,L] = Q K^T * scale.
void run_qk(Inputs& in, int64_t h, std::vector<float>& s) {
  kiln::cpu::sgemm(false, true, in.L, in.L, kHeadDim, in.scale(), in.q.data() + in.head_offset(h),
                   kHeadDim, in.k.data() + in.head_offset(h), kHeadDim, 0.0f, s.data(), in.L);
}

// Reference GEMM 2 for one head: O[L,D] = S V (the softmax itself is not timed).
void run_pv(Inputs& in, int64_t h, const std::vector<float>& s) {
  kiln::cpu::sgemm(false, false, in.L, kHeadDim, in.L, 1.0f, s.data(), in.L,
                   in.v.data() + in.head_offset(h), kHeadDim, 0.0f,
                   in.out.data() + in.head_offset(h), kHeadDim);
}

// ---- peak memory -------------------------------------------------------------------

// Peak resident set size (VmHWM) in bytes, or -1 when /proc is unavailable.
int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmHWM:") {
      int64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 12, '\n');
  }
  return -1;
}

// Resets VmHWM to the current RSS (writing 5 to clear_refs, Linux >= 4.0).
bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

// Peak-RSS growth per case, measured on the first (warm-up) call of each benchmark.
struct MemoryReport {
  int64_t attention_growth = -1, reference_growth = -1, device_growth = -1;
  bool exact = true;  // VmHWM could be reset before each measurement
};
std::map<int64_t, MemoryReport> g_memory;  // by L

// Peak-RSS growth while `fn` runs, with its inputs already resident. Free heap pages are
// first handed back (malloc_trim) so that memory `fn` reuses from the heap counts too.
template <typename Fn>
int64_t peak_growth(Fn&& fn, bool& exact) {
  malloc_trim(0);
  exact = reset_peak_rss() && exact;
  const int64_t before = peak_rss_bytes();
  fn();
  return peak_rss_bytes() - before;
}

void record_growth(int64_t& slot, int64_t growth) { slot = std::max(slot, growth); }

void BM_Attention(benchmark::State& state, int64_t L) {
  const OpInputs in{Inputs(L)};
  MemoryReport& mem = g_memory[L];
  kiln::DeviceRuntime& rt = kiln::runtime(kiln::Device::cpu());
  rt.reset_peak_memory();
  const size_t before = rt.memory().in_use_bytes;
  record_growth(mem.attention_growth, peak_growth([&] { run_attention(in); }, mem.exact));
  // Device allocations made by the op: its [1,H,L,D] output only (no score matrix).
  mem.device_growth = int64_t(rt.memory().peak_bytes - before);
  for (auto _ : state) run_attention(in);
}

void BM_AttentionBf16(benchmark::State& state, int64_t L) {
  const OpInputs in{Inputs(L), kiln::DType::bf16};
  run_attention(in);  // warm-up
  for (auto _ : state) run_attention(in);
}

void BM_QK(benchmark::State& state, int64_t L) {
  Inputs in(L);
  std::vector<float> s;
  MemoryReport& mem = g_memory[L];
  const int64_t growth = peak_growth(
      [&] {
        s.resize(static_cast<size_t>(L * L));  // the one-head [L,L] score buffer
        run_qk(in, 0, s);
      },
      mem.exact);
  record_growth(mem.reference_growth, growth);
  for (auto _ : state) {
    for (int64_t h = 0; h < kHeads; ++h) run_qk(in, h, s);
  }
}

void BM_PV(benchmark::State& state, int64_t L) {
  Inputs in(L);
  std::vector<float> s(static_cast<size_t>(L * L));
  run_qk(in, 0, s);  // realistic magnitudes in S, and warm-up
  run_pv(in, 0, s);
  for (auto _ : state) {
    for (int64_t h = 0; h < kHeads; ++h) run_pv(in, h, s);
  }
}

// ---- the tile products of bf16 attention, two ways -------------------------------------

// Tile sizes of attention() with bf16 operands; both FLUX lengths are whole multiples.
constexpr int64_t kTileQ = 256, kTileK = 512;

// [H,L,D] q/k/v as bf16 bits.
struct Bf16Inputs {
  int64_t L;
  std::vector<uint16_t> q, k, v;
  explicit Bf16Inputs(const Inputs& in) : L(in.L), q(narrow(in.q)), k(narrow(in.k)), v(narrow(in.v)) {}
  static std::vector<uint16_t> narrow(const std::vector<float>& x) {
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); ++i) b[i] = kiln::f32_to_bf16(x[i]);
    return b;
  }
};

// Runs body(thread, head, i0) for every (head, query block) in parallel, as attention() does.
template <typename Body>
void for_each_query_block(int64_t L, Body body) {
  const int64_t blocks = L / kTileQ;
#pragma omp parallel for schedule(dynamic)
  for (int64_t task = 0; task < kHeads * blocks; ++task) body(omp_get_thread_num(), task / blocks, task % blocks * kTileQ);
}

// Per head and query block: Q widened once; per key block K and V widened, S = Q K^T, O += S V.
void run_tiles_widened(const Bf16Inputs& in, std::vector<std::vector<float>>& scratch) {
  const int64_t L = in.L, D = kHeadDim;
  for_each_query_block(L, [&](int thread, int64_t h, int64_t i0) {
    float* q = scratch[size_t(thread)].data();
    float *k = q + kTileQ * D, *v = k + kTileK * D, *s = v + kTileK * D, *o = s + kTileQ * kTileK;
    const size_t head = static_cast<size_t>(h * L * D);
    kiln::convert_to_f32(in.q.data() + head + i0 * D, kiln::DType::bf16, q, kTileQ * D);
    for (int64_t j0 = 0; j0 < L; j0 += kTileK) {
      kiln::convert_to_f32(in.k.data() + head + j0 * D, kiln::DType::bf16, k, kTileK * D);
      kiln::cpu::sgemm(false, true, kTileQ, kTileK, D, 1.0f, q, D, k, D, 0.0f, s, kTileK);
      kiln::convert_to_f32(in.v.data() + head + j0 * D, kiln::DType::bf16, v, kTileK * D);
      kiln::cpu::sgemm(false, false, kTileQ, D, kTileK, 1.0f, s, kTileK, v, D, j0 == 0 ? 0.0f : 1.0f, o, D);
    }
  });
}

// The same products on bf16 operands through oneDNN matmul primitives (S in bf16 for PV).
struct Bf16TileMatmuls {
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  md q{{kTileQ, kHeadDim}, dt::bf16, {kHeadDim, 1}};
  md kt{{kHeadDim, kTileK}, dt::bf16, {1, kHeadDim}};  // K^T: K's rows read as columns
  md s{{kTileQ, kTileK}, dt::bf16, {kTileK, 1}};
  md v{{kTileK, kHeadDim}, dt::bf16, {kHeadDim, 1}};
  md o{{kTileQ, kHeadDim}, dt::f32, {kHeadDim, 1}};
  dnnl::matmul::primitive_desc qk_pd, pv_pd;
  dnnl::matmul qk, pv;
  Bf16TileMatmuls() {
    const dnnl::engine& eng = kiln::cpu::onednn::engine();
    dnnl::primitive_attr accumulate = kiln::cpu::onednn::user_scratchpad_attr();
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    accumulate.set_post_ops(sum);
    qk_pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(q, kt, s), kiln::cpu::onednn::user_scratchpad_attr(), eng);
    pv_pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(s, v, o), accumulate, eng);
    qk = dnnl::matmul(qk_pd);
    pv = dnnl::matmul(pv_pd);
  }
};

void run_tiles_bf16(const Bf16TileMatmuls& mm, Bf16Inputs& in, std::vector<std::vector<float>>& scratch) {
  const int64_t L = in.L, D = kHeadDim;
  const dnnl::engine& eng = kiln::cpu::onednn::engine();
  for_each_query_block(L, [&](int thread, int64_t h, int64_t i0) {
    dnnl::stream& stream = kiln::cpu::onednn::thread_stream();
    float* o = scratch[size_t(thread)].data();
    void* s = o + kTileQ * D;  // bf16 [kTileQ, kTileK]
    const size_t head = static_cast<size_t>(h * L * D);
    const dnnl::memory q(mm.q, eng, in.q.data() + head + i0 * D), sm(mm.s, eng, s), om(mm.o, eng, o);
    std::fill_n(o, kTileQ * D, 0.0f);
    for (int64_t j0 = 0; j0 < L; j0 += kTileK) {
      kiln::cpu::onednn::Args qk{{DNNL_ARG_SRC, q},
                                 {DNNL_ARG_WEIGHTS, dnnl::memory(mm.kt, eng, in.k.data() + head + j0 * D)},
                                 {DNNL_ARG_DST, sm}};
      kiln::cpu::onednn::add_scratchpad(qk, mm.qk_pd.scratchpad_desc());
      mm.qk.execute(stream, qk);
      kiln::cpu::onednn::Args pv{{DNNL_ARG_SRC, sm},
                                 {DNNL_ARG_WEIGHTS, dnnl::memory(mm.v, eng, in.v.data() + head + j0 * D)},
                                 {DNNL_ARG_DST, om}};
      kiln::cpu::onednn::add_scratchpad(pv, mm.pv_pd.scratchpad_desc());
      mm.pv.execute(stream, pv);
    }
    stream.wait();
  });
}

std::vector<std::vector<float>> tile_scratch() {
  const size_t floats = static_cast<size_t>(kTileQ * kHeadDim + 2 * kTileK * kHeadDim + kTileQ * kTileK + kTileQ * kHeadDim);
  return std::vector<std::vector<float>>(size_t(omp_get_max_threads()), std::vector<float>(floats));
}

void BM_TilesWidened(benchmark::State& state, int64_t L) {
  const Bf16Inputs in{Inputs(L)};
  auto scratch = tile_scratch();
  run_tiles_widened(in, scratch);  // warm-up
  for (auto _ : state) run_tiles_widened(in, scratch);
}

void BM_TilesBf16(benchmark::State& state, int64_t L) {
  Bf16Inputs in{Inputs(L)};
  const Bf16TileMatmuls mm;
  auto scratch = tile_scratch();
  run_tiles_bf16(mm, in, scratch);  // warm-up
  for (auto _ : state) run_tiles_bf16(mm, in, scratch);
}

// ---- summary -----------------------------------------------------------------------

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

void print_summary(const std::map<std::string, double>& best) {
  std::printf("\nSummary (fastest repetition; %d heads, head dim %d, GEMMs via %s)\n",
              static_cast<int>(kHeads), static_cast<int>(kHeadDim),
              kiln::cpu::gemm_backend_name(kiln::cpu::gemm_backend()));
  for (const Case& c : kCases) {
    const auto get = [&](const char* what) {
      const auto it = best.find(what + c.suffix());
      return it == best.end() ? 0.0 : it->second;
    };
    const double attn = get("attention"), qk = get("qk"), pv = get("pv"), bf16 = get("attention_bf16");
    const double flops = 4.0 * static_cast<double>(c.L) * c.L * kHeadDim * kHeads;
    if (attn > 0.0 && bf16 > 0.0) {
      std::printf("L=%-5ld attention f32 %8.1f ms (%5.1f GFLOP/s)  bf16 %8.1f ms (%5.1f GFLOP/s)  speedup f32/bf16 = "
                  "%.3f  (bf16 workspace %.2f MiB)\n",
                  static_cast<long>(c.L), attn, flops / attn * 1e-6, bf16, flops / bf16 * 1e-6, attn / bf16,
                  mib(static_cast<double>(kiln::cpu::attention_workspace_bytes(c.L, c.L, kHeadDim, kHeadDim, true))));
    }
    const double widened = get("tiles_widened"), tiles_bf16 = get("tiles_bf16");
    if (widened > 0.0 && tiles_bf16 > 0.0) {
      std::printf("L=%-5ld tile products: widened + sgemm %8.1f ms (%5.1f GFLOP/s)  bf16 matmul %8.1f ms (%5.1f "
                  "GFLOP/s)  ratio bf16/widened = %.3f\n",
                  static_cast<long>(c.L), widened, flops / widened * 1e-6, tiles_bf16, flops / tiles_bf16 * 1e-6,
                  tiles_bf16 / widened);
    }
    if (bf16 > 0.0 && tiles_bf16 > 0.0)
      std::printf("L=%-5ld attention bf16 %8.1f ms  its bf16 tile products alone %8.1f ms  ratio = %.3f (target <= 1.5)\n",
                  static_cast<long>(c.L), bf16, tiles_bf16, bf16 / tiles_bf16);
    if (attn == 0.0 || qk == 0.0 || pv == 0.0) continue;  // filtered out
    std::printf("L=%-5ld attention %8.1f ms (%5.1f GFLOP/s)  qk %8.1f ms + pv %8.1f ms = %8.1f ms"
                "  ratio attention/(qk+pv) = %.3f (target <= 1.5)\n",
                static_cast<long>(c.L), attn, flops / attn * 1e-6, qk, pv, qk + pv,
                attn / (qk + pv));
    const MemoryReport& m = g_memory[c.L];
    const double full = static_cast<double>(c.L) * c.L * kHeads * 4;
    std::printf("        memory: device allocator growth %.2f MiB (the output), workspace %.2f MiB, "
                "attention peak-RSS growth %.2f MiB, "
                "reference GEMMs (one-head [L,L] buffer) %.2f MiB, full scores L*L*heads*4 = "
                "%.1f MiB%s\n",
                mib(static_cast<double>(m.device_growth)),
                mib(static_cast<double>(
                    kiln::cpu::attention_workspace_bytes(c.L, c.L, kHeadDim, kHeadDim))),
                mib(static_cast<double>(m.attention_growth)),
                mib(static_cast<double>(m.reference_growth)), mib(full),
                m.exact ? "" : " (VmHWM not resettable: growth figures are lower bounds)");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(cores);
  std::printf("threads=%d kiln_backend=%s\n", cores,
              kiln::cpu::gemm_backend_name(kiln::cpu::gemm_backend()));
  for (const Case& c : kCases) {
    // L=4608 is ~260 GFLOP per attention call (seconds on 2 cores): one iteration per
    // repetition. L=1536 is 9x cheaper.
    const bool big = c.L > 2048;
    using Body = void (*)(benchmark::State&, int64_t);
    const std::pair<const char*, Body> bodies[] = {
        {"attention", BM_Attention}, {"attention_bf16", BM_AttentionBf16}, {"qk", BM_QK}, {"pv", BM_PV},
        {"tiles_widened", BM_TilesWidened}, {"tiles_bf16", BM_TilesBf16}};
    for (const auto& [name, fn] : bodies) {
      auto* b = benchmark::RegisterBenchmark((name + c.suffix()).c_str(), fn, c.L)
                    ->Unit(benchmark::kMillisecond)
                    ->UseRealTime();
      if (big) {
        b->Iterations(1)->Repetitions(3);
      } else {
        b->MinTime(0.3);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  kiln::bench::BestTimeReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  print_summary(reporter.best_ms);
  return 0;
}
