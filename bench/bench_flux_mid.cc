// Seconds per denoising step of the realistic-width FLUX.1 transformer (the flux1_transformer_mid
// fixture: FLUX.1-schnell widths, 1 double + 2 single blocks, deterministic weights) at
// 256x256 and 512x512 with a 512-token prompt, in strict eager mode (mode:0), deferred-and-fused
// mode (mode:1), compiled mode with the whole transformer compiled (mode:2) and with
// compile_repeated_blocks (mode:3). The three models share one set of weight buffers. A step is
// one transformer forward plus the scheduler update, waited for on the host.
//  - BM_Step, per size and mode: after one untimed warm-up step per size, the mode's first step
//    (first_step_s; compile_ms is the graph compile inside it, trace_ms the compiled modes'
//    tracing, prepacked_MiB the linear weights they pack in it, graph_host_ms the per-step host
//    cost of deferred flushes) and, for the compiled modes, the warm-cache load of their
//    executables from a persistent cache (load_ms).
//  - BM_Interleaved, per size: rounds of one step in each mode in turn, best of 5 per mode; the
//    summary's per-step ratios to strict eager and to the step's matmuls (every linear, and
//    attention's two GEMMs per head) timed as raw oneDNN calls of the same shapes (the faster
//    of dnnl_sgemm and the matmul primitive with pre-packed weights) come from it.
//  - BM_Offload: a 4-step image with the weights in place against the same with the
//    transformer onloaded and released around it (model offload's cost per image).
// KILN_BENCH_KERNEL_TIMES=1 also prints the time per kernel name (BM_Step).
//
//   build/bench/bench_flux_mid            # ~6 min on 2 cores
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>

#include <oneapi/dnnl/dnnl.h>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "deterministic_weights.h"
#include "devices/cpu/kernels/linear_gemm.h"
#include "devices/cpu/kernels/prepacked_weights.h"
#include "devices/runtime.h"
#include "exec/capture.h"
#include "exec/compile.h"
#include "exec/counters.h"
#include "exec/executable_store.h"
#include "exec/deferred.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "exec/residency.h"
#include "exec/ops.h"
#include "io/json_config.h"
#include "models/flux/flux_transformer.h"
#include "pipelines/flux_pipeline.h"
#include "pipelines/torch_generator.h"
#include "schedulers/flow_match_euler.h"

namespace {

const std::filesystem::path kFixture = std::filesystem::path(KILN_FIXTURES_DIR) / "flux1_transformer_mid";
constexpr int64_t kTextTokens = 512;

// Generated weights, made once and handed to every model built from this source.
class SharedWeights final : public kiln::nn::WeightSource {
 public:
  explicit SharedWeights(std::map<std::string, kiln::Shape> shapes) : gen_(std::move(shapes)) {}
  std::string describe() const override { return gen_.describe(); }
  bool contains(const std::string& key) const override { return gen_.contains(key); }
  kiln::Shape shape(const std::string& key) const override { return gen_.shape(key); }
  kiln::Tensor load(const std::string& key, kiln::DType dtype) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = made_.find(key);
    if (it == made_.end()) it = made_.emplace(key, gen_.load(key, dtype)).first;
    return it->second;
  }

 private:
  kiln::test::GeneratedWeights gen_;
  mutable std::mutex mu_;
  mutable std::map<std::string, kiln::Tensor> made_;
};

// models[0]: eager and deferred modes; [1]: transformer.compile(); [2]: compile_repeated_blocks().
struct Mid {
  double build_seconds = 0;
  std::unique_ptr<kiln::FluxTransformer2DModel> models[3];
  kiln::ComponentWeights weights{"transformer"};  // the (shared) weights, for BM_Offload
};

Mid& mid() {
  static Mid m = [] {
    std::ifstream in(kFixture / "manifest.json");
    const auto manifest = nlohmann::json::parse(in);
    std::map<std::string, kiln::Shape> shapes;
    for (const auto& [name, info] : manifest["weights"]["per_tensor_checksums"].items())
      shapes[name] = info["shape"].get<kiln::Shape>();
    const auto t0 = std::chrono::steady_clock::now();
    Mid r;
    const auto weights = std::make_shared<const SharedWeights>(shapes);
    kiln::WeightCollector collect(r.weights);
    for (auto& model : r.models)
      model = std::make_unique<kiln::FluxTransformer2DModel>(
          kiln::FluxTransformerConfig::from_json(kiln::io::JsonConfig(kFixture / "transformer" / "config.json")),
          kiln::nn::Weights(weights));
    r.build_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }();
  return m;
}

// Compiles models[1] / [2] afresh (new callables: the next call traces, and compiles unless
// the executable is in memory or in the persistent cache).
void compile_for(int64_t mode) {
  kiln::CompileOptions o;
  o.fullgraph = true;
  if (mode == 2) mid().models[1]->compile(o);
  if (mode == 3) mid().models[2]->compile_repeated_blocks(o);
}
kiln::FluxTransformer2DModel& model_for(int64_t mode) { return *mid().models[mode <= 1 ? 0 : mode - 1]; }

// The matmuls of one step at raw library speed: every linear and sdpa of the traced step graph,
// run as oneDNN calls of the same shapes (attention: Q K^T and P V per head), best of 3, each
// the faster of dnnl_sgemm and (B stored [N,K]) the matmul primitive with B pre-packed.
double raw_matmul_seconds(const std::function<kiln::Tensor()>& forward) {
  kiln::wait(forward());  // fills the model's host-side caches (RoPE tables), which a trace must not read
  const kiln::detail::Captured cap = kiln::detail::capture("step", [&] { return std::vector<kiln::Tensor>{forward()}; });
  const kiln::Graph& g = cap.graph;
  struct Gemm {
    int64_t M, N, K;
    bool trans_b;
  };
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, int64_t> count;
  for (const kiln::GraphNode& n : g.nodes) {
    if (n.op == "linear") {
      const kiln::Shape& x = g.shape_of(n.args[0]);
      const int64_t K = x.back(), M = kiln::numel(x) / K, N = g.shape_of(n.args[1])[0];
      ++count[{M, N, K, true}];
    } else if (n.op == "matmul") {
      const kiln::Shape& a = g.shape_of(n.args[0]);
      const kiln::Shape& b = g.shape_of(n.args[1]);
      const int64_t M = a[a.size() - 2], K = a.back(), N = b.back();
      count[{M, N, K, false}] += kiln::numel(n.shape) / (M * N);
    } else if (n.op == "sdpa") {
      const kiln::Shape& q = g.shape_of(n.args[0]);
      const kiln::Shape& k = g.shape_of(n.args[1]);
      const int64_t heads = q[0] * q[1], Lq = q[2], D = q[3], Lk = k[2];
      count[{Lq, Lk, D, true}] += heads;
      count[{Lq, D, Lk, false}] += heads;
    }
  }
  double total = 0;
  for (const auto& [shape, times] : count) {
    const auto [M, N, K, trans_b] = shape;
    std::vector<float> a(size_t(M * K), 0.5f), b(size_t(K * N), 0.25f), c(size_t(M * N));
    // B stored [N,K] also runs as oneDNN's matmul primitive reading B pre-packed (what compiled
    // mode's linears do): the raw time is the faster of the two.
    std::shared_ptr<const kiln::cpu::PackedLinearWeight> packed;
    if (trans_b) packed = kiln::cpu::pack_linear_weight(b.data(), N, K);
    double fastest = 1e30;
    for (int r = 0; r < 3; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      dnnl_sgemm('N', trans_b ? 'T' : 'N', M, N, K, 1.0f, a.data(), K, b.data(), trans_b ? K : N, 0.0f, c.data(), N);
      fastest = std::min(fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      if (!packed) continue;
      t0 = std::chrono::steady_clock::now();
      kiln::cpu::linear_f32(a.data(), b.data(), packed.get(), nullptr, c.data(), M, N, K);
      fastest = std::min(fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    total += fastest * double(times);
  }
  return total;
}
std::map<int64_t, double>& raw_matmuls() {  // by size
  static std::map<int64_t, double> m;
  return m;
}

// Linear-layer and attention FLOPs of one forward (the modulation GEMVs are negligible).
double step_flops(int64_t img, int64_t txt) {
  const double d = 3072, l = double(img + txt);
  const double dbl = 2 * 12 * d * d * double(img + txt) + 4 * l * l * d;
  const double single = 2 * 12 * d * d * l + 4 * l * l * d;
  return dbl + 2 * single + 2.0 * double(txt) * 4096 * d + 2.0 * double(img) * 64 * d;
}

// The inputs of one step on a grid x grid latent (seeded noise, a 512-token prompt).
struct StepInputs {
  StepInputs(int64_t grid, int64_t img) {
    kiln::TorchGenerator gen(0);
    latents = kiln::from_vector(gen.randn(img * 64), {1, img, 64});
    text = kiln::from_vector(gen.randn(kTextTokens * 4096), {1, kTextTokens, 4096});
    pooled = kiln::from_vector(gen.randn(768), {1, 768});
    img_ids = kiln::FluxPipeline::image_ids(2 * grid, 2 * grid);
    txt_ids = kiln::zeros({kTextTokens, 3});
  }
  kiln::Tensor latents, text, pooled, img_ids, txt_ids;
};

// Best steady-state seconds per step, by (size, mode), for the summary.
std::map<std::pair<int64_t, int64_t>, double>& best() {
  static std::map<std::pair<int64_t, int64_t>, double> m;
  return m;
}

void BM_Step(benchmark::State& state) {
  const int64_t size = state.range(0), grid = size / 16, img = grid * grid;  // packed 2x2 latent tokens
  const int64_t mode = state.range(1);
  kiln::EagerModeGuard guard(mode == 1 ? kiln::EagerMode::DeferAndFuse : kiln::EagerMode::DeferNever);
  const auto& model = model_for(mode);
  const StepInputs in(grid, img);
  const kiln::Tensor &latents = in.latents, &text = in.text, &pooled = in.pooled, &img_ids = in.img_ids,
                     &txt_ids = in.txt_ids;
  kiln::FlowMatchEulerDiscreteScheduler scheduler{kiln::FlowMatchEulerConfig{}};
  auto step = [&] {
    scheduler.set_timesteps(4, 0.5);
    const kiln::Tensor t = kiln::from_vector({scheduler.timesteps()[0] / 1000.0f}, {1});
    const kiln::Tensor v = model.forward(latents, text, pooled, t, img_ids, txt_ids);
    const kiln::Tensor next = scheduler.step(v, latents);
    kiln::mark_step();  // as the pipeline does after each step (a no-op in strict eager)
    kiln::wait(next);
  };
  // The very first step at a size also pays oneDNN's first use of its GEMM shapes and the pool
  // growing to the step's working set; run it once untimed, so that first_step_s shows what
  // the mode itself adds (deferred: recording, canonicalising and compiling the step graph).
  static std::set<int64_t> warmed;
  if (warmed.insert(size).second) {
    kiln::EagerModeGuard eager(kiln::EagerMode::DeferNever);
    step();
    const kiln::Tensor t = kiln::from_vector({0.5f}, {1});
    raw_matmuls()[size] =
        raw_matmul_seconds([&] { return mid().models[0]->forward(latents, text, pooled, t, img_ids, txt_ids); });
  }
  kiln::clear_graph_cache();
  kiln::reset_deferred_stats();
  kiln::set_executable_cache_dir({});  // cold: nothing in memory or on disk
  kiln::clear_executable_cache();
  kiln::reset_compile_stats();
  compile_for(mode);
  const uint64_t packed_before = kiln::cpu::prepack_stats().bytes;
  const auto t0 = std::chrono::steady_clock::now();
  step();
  state.counters["first_step_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Compiled modes pack the linear weights on their first step (the models share weight buffers,
  // so blocks finds them packed when full ran first in this process). peak_MiB leaves them out.
  state.counters["prepacked_MiB"] = double(kiln::cpu::prepack_stats().bytes - packed_before) / (1 << 20);
  const kiln::CompileStats cs = kiln::compile_stats();
  state.counters["compile_ms"] = (kiln::deferred_stats().compile_seconds + cs.compile_seconds) * 1e3;
  if (mode >= 2) {
    state.counters["trace_ms"] = cs.trace_seconds * 1e3;
    state.counters["executables"] = double(cs.compiles);
    // Warm persistent cache: one process writes, the next (simulated: empty memory cache, new
    // callables) loads instead of compiling.
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("kiln_bench_cache_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    kiln::set_executable_cache_dir(dir);
    for (int pass = 0; pass < 2; ++pass) {
      kiln::clear_executable_cache();
      kiln::reset_compile_stats();
      compile_for(mode);
      step();
    }
    state.counters["load_ms"] = kiln::compile_stats().load_seconds * 1e3;
    state.counters["loaded"] = double(kiln::compile_stats().disk_hits);
    kiln::set_executable_cache_dir({});
    std::filesystem::remove_all(dir);
  }
  kiln::reset_counters();
  kiln::reset_deferred_stats();
  kiln::runtime(kiln::Device::cpu()).reset_kernel_times();
  kiln::runtime(kiln::Device::cpu()).reset_peak_memory();
  double fastest = 1e30;
  for (auto _ : state) {
    const auto s0 = std::chrono::steady_clock::now();
    step();
    fastest = std::min(fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count());
  }
  state.counters["best_step_s"] = fastest;
  state.counters["kernels_per_step"] = double(kiln::counters().kernels_launched) / double(state.iterations());
  state.counters["graph_host_ms"] = kiln::deferred_stats().host_seconds * 1e3 / double(state.iterations());
  {
    // The packs compiled mode made (on weight buffers every mode shares here) are held
    // throughout: peak_MiB is the rest, packs_held_MiB them.
    const auto m = kiln::runtime(kiln::Device::cpu()).memory();
    const uint64_t packs = kiln::cpu::prepack_stats().live_bytes;
    state.counters["peak_MiB"] = double(m.peak_bytes - std::min<uint64_t>(packs, m.peak_bytes)) / (1 << 20);
    state.counters["packs_held_MiB"] = double(packs) / (1 << 20);
    state.counters["pooled_MiB"] = double(m.pooled_bytes) / (1 << 20);
  }
  if (kiln::env::flag("KILN_BENCH_KERNEL_TIMES"))  // where the time goes, per launch name
    for (const auto& [name, t] : kiln::runtime(kiln::Device::cpu()).kernel_times())
      std::printf("  %s mode %lld: %-24s %8.1f ms/step  (%llu launches/step)\n", size == 256 ? "256" : "512",
                  static_cast<long long>(mode), name.c_str(), t.first * 1e3 / double(state.iterations()),
                  static_cast<unsigned long long>(t.second / uint64_t(state.iterations())));
  state.counters["GFLOP/s"] = benchmark::Counter(step_flops(img, kTextTokens) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["img_tokens"] = double(img);
}

}  // namespace

// The summary's numbers: rounds of one step in each mode in turn (eager, deferred, compiled
// full, compiled blocks), best of 5 rounds per mode, so drift on this noisy machine hits every
// mode alike.
void BM_Interleaved(benchmark::State& state) {
  const int64_t size = state.range(0), grid = size / 16, img = grid * grid;
  const StepInputs in(grid, img);
  const kiln::Tensor &latents = in.latents, &text = in.text, &pooled = in.pooled, &img_ids = in.img_ids,
                     &txt_ids = in.txt_ids;
  kiln::FlowMatchEulerDiscreteScheduler scheduler{kiln::FlowMatchEulerConfig{}};
  scheduler.set_timesteps(4, 0.5);
  const kiln::Tensor t = kiln::from_vector({scheduler.timesteps()[0] / 1000.0f}, {1});
  kiln::set_executable_cache_dir({});
  compile_for(2);
  compile_for(3);
  auto step = [&](int64_t mode) {
    kiln::EagerModeGuard guard(mode == 1 ? kiln::EagerMode::DeferAndFuse : kiln::EagerMode::DeferNever);
    const auto s0 = std::chrono::steady_clock::now();
    const kiln::Tensor v = model_for(mode).forward(latents, text, pooled, t, img_ids, txt_ids);
    scheduler.set_timesteps(4, 0.5);  // every timed step is step 0
    const kiln::Tensor next = scheduler.step(v, latents);
    kiln::mark_step();
    kiln::wait(next);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
  };
  for (int64_t mode = 0; mode < 4; ++mode) step(mode);  // compiles, pools and GEMM shapes warm
  if (!raw_matmuls().count(size))
    raw_matmuls()[size] =
        raw_matmul_seconds([&] { return mid().models[0]->forward(latents, text, pooled, t, img_ids, txt_ids); });
  double fastest[4] = {1e30, 1e30, 1e30, 1e30};
  for (auto _ : state)
    for (int64_t mode = 0; mode < 4; ++mode) fastest[mode] = std::min(fastest[mode], step(mode));
  for (int64_t mode = 0; mode < 4; ++mode) best()[{size, mode}] = fastest[mode];
  state.counters["deferred/eager"] = fastest[1] / fastest[0];
  state.counters["full/eager"] = fastest[2] / fastest[0];
  state.counters["blocks/eager"] = fastest[3] / fastest[0];
  state.counters["full/raw_matmuls"] = fastest[2] / raw_matmuls()[size];
}

// Model offload's cost per image: a 4-step "image" on the mid transformer with
// its weights in place, against the same with the transformer onloaded (its 2.6 GiB of weights
// copied into device memory) before the steps and released after, as model offload does once
// per call. Rounds alternate; best of 3 each.
void BM_Offload(benchmark::State& state) {
  const int64_t size = state.range(0), grid = size / 16, img = grid * grid;
  const StepInputs in(grid, img);
  const kiln::Tensor &latents = in.latents, &text = in.text, &pooled = in.pooled, &img_ids = in.img_ids,
                     &txt_ids = in.txt_ids;
  const auto& model = *mid().models[0];
  kiln::EagerModeGuard guard(kiln::EagerMode::DeferNever);
  auto image = [&](bool offload, double* copy_seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    if (offload) mid().weights.onload(kiln::Device::cpu(), /*for_one_call=*/true);
    const auto t1 = std::chrono::steady_clock::now();
    kiln::FlowMatchEulerDiscreteScheduler scheduler{kiln::FlowMatchEulerConfig{}};
    scheduler.set_timesteps(4, 0.5);
    kiln::Tensor x = latents;
    for (int i = 0; i < 4; ++i) {
      const kiln::Tensor t = kiln::from_vector({scheduler.timesteps()[size_t(i)] / 1000.0f}, {1});
      x = scheduler.step(model.forward(x, text, pooled, t, img_ids, txt_ids), x);
    }
    kiln::wait(x);
    const auto t2 = std::chrono::steady_clock::now();
    if (offload) mid().weights.offload();
    const auto t3 = std::chrono::steady_clock::now();
    *copy_seconds = std::chrono::duration<double>(t1 - t0).count() + std::chrono::duration<double>(t3 - t2).count();
    return std::chrono::duration<double>(t3 - t0).count();
  };
  double unused = 0, copy = 0, best_copy = 1e30;
  image(false, &unused);  // warm
  double fastest[2] = {1e30, 1e30};
  for (auto _ : state)
    for (int offload = 0; offload < 2; ++offload) {
      fastest[offload] = std::min(fastest[offload], image(offload == 1, &copy));
      if (offload) best_copy = std::min(best_copy, copy);
    }
  state.counters["in_place_s"] = fastest[0];
  state.counters["offload_s"] = fastest[1];
  state.counters["offload/in_place"] = fastest[1] / fastest[0];
  state.counters["onload_offload_s"] = best_copy;
  state.counters["weights_GiB"] = double(mid().weights.bytes()) / double(1 << 30);
  std::printf("offload overhead, %lldx%lld, 4 steps: in place %.3f s, model offload %.3f s (onload + release %.3f s "
              "of %.2f GiB): offload/in place = %.3f\n",
              static_cast<long long>(size), static_cast<long long>(size), fastest[0], fastest[1], best_copy,
              double(mid().weights.bytes()) / double(1 << 30), fastest[1] / fastest[0]);
}

BENCHMARK(BM_Step)
    ->ArgNames({"size", "mode"})
    ->Args({256, 0})
    ->Args({256, 1})
    ->Args({256, 2})
    ->Args({256, 3})
    ->Args({512, 0})
    ->Args({512, 1})
    ->Args({512, 2})
    ->Args({512, 3})
    ->Unit(benchmark::kSecond)
    ->UseRealTime()
    ->Iterations(2);

BENCHMARK(BM_Interleaved)->ArgNames({"size"})->Arg(256)->Arg(512)->Unit(benchmark::kSecond)->UseRealTime()->Iterations(5);
BENCHMARK(BM_Offload)->ArgNames({"size"})->Arg(256)->Unit(benchmark::kSecond)->UseRealTime()->Iterations(3);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::printf("building the mid-size transformer (677M parameters, generated)...\n");
  std::printf("weights generated in %.2f s\n", mid().build_seconds);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  const char* names[] = {"eager", "deferred", "compiled (full)", "compiled (blocks)"};
  for (int64_t size : {256, 512}) {
    const auto e = best().find({size, 0});
    if (e == best().end()) continue;
    const double raw = raw_matmuls()[size];
    std::printf("%lldx%lld: raw oneDNN matmuls of one step %.3f s\n", static_cast<long long>(size),
                static_cast<long long>(size), raw);
    for (int64_t mode = 0; mode < 4; ++mode) {
      const auto m = best().find({size, mode});
      if (m == best().end()) continue;
      std::printf("  %-18s best step %.3f s  /eager %.3f  /raw matmuls %.3f\n", names[mode], m->second,
                  m->second / e->second, m->second / raw);
    }
  }
  return 0;
}
