// Tiled attention kernel vs the two plain GEMMs it replaces, at FLUX sizes.
//
// Case L=4608 (FLUX at 1024x1024: 4096 image + 512 text tokens), 24 heads, head dim 128,
// batch 1; and L=1024 for quick runs. Times
//   attention/L:*  kiln's scaled_dot_product_attention op over all heads,
//   qk/L:*         per head, S = Q K^T as one full sgemm into an [L,L] buffer,
//   pv/L:*         per head, O = P V as one full sgemm from that buffer,
// then prints the ratio attention / (qk + pv) (target <= 1.5) and peak memory: the
// kernel's attention_workspace_bytes; the peak-RSS growth (VmHWM, reset through
// /proc/self/clear_refs) of the first attention call, which includes oneDNN's own packing
// buffers; and that of the reference (its one-head [L,L] buffer and first GEMM), all
// against the L*L*heads*4 bytes of a full score tensor.
//
//   ./bench_attention                            # both sizes (~25 s on 2 cores)
//   ./bench_attention --benchmark_filter=L:1024  # quick
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

#include "devices/cpu/kernels/attention.h"
#include "devices/cpu/kernels/gemm.h"
#include "devices/runtime.h"
#include "exec/host.h"
#include "exec/ops.h"

namespace {

constexpr int64_t kHeads = 24, kHeadDim = 128;

struct Case {
  int64_t L;
  std::string suffix() const { return "/L:" + std::to_string(L); }
};
const Case kCases[] = {{4608}, {1024}};

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

// kiln's public attention op on [1, H, L, D] tensors, through the strict-eager dispatcher;
// the host waits for the result.
struct OpInputs {
  kiln::Tensor q, k, v;
  explicit OpInputs(const Inputs& in) {
    const kiln::Shape s{1, kHeads, in.L, kHeadDim};
    q = kiln::from_vector(in.q, s);
    k = kiln::from_vector(in.k, s);
    v = kiln::from_vector(in.v, s);
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

// ---- summary -----------------------------------------------------------------------

// Console output as usual, plus each benchmark's fastest repetition in ms.
class CapturingReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> best_ms;

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      const double ms = r.GetAdjustedRealTime();  // registered with Unit(kMillisecond)
      auto [it, fresh] = best_ms.emplace(r.run_name.function_name, ms);
      if (!fresh) it->second = std::min(it->second, ms);
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

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
    const double attn = get("attention"), qk = get("qk"), pv = get("pv");
    if (attn == 0.0 || qk == 0.0 || pv == 0.0) continue;  // filtered out
    const double flops = 4.0 * static_cast<double>(c.L) * c.L * kHeadDim * kHeads;
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
    // repetition. L=1024 is ~20x cheaper.
    const bool big = c.L > 2048;
    using Body = void (*)(benchmark::State&, int64_t);
    const std::pair<const char*, Body> bodies[] = {
        {"attention", BM_Attention}, {"qk", BM_QK}, {"pv", BM_PV}};
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
  CapturingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  print_summary(reporter.best_ms);
  return 0;
}
