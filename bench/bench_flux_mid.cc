// Seconds per denoising step of the realistic-width FLUX.1 transformer (the flux1_transformer_mid
// fixture: FLUX.1-schnell widths, 1 double + 2 single blocks, deterministic weights) at
// 256x256 and 512x512 with a 512-token prompt, in strict eager mode. A step is one
// transformer forward plus the scheduler update, read back to the host.
//
//   build/bench/bench_flux_mid            # ~30 s on 2 cores
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "deterministic_weights.h"
#include "exec/ops.h"
#include "io/json_config.h"
#include "models/flux/flux_transformer.h"
#include "pipelines/flux_pipeline.h"
#include "pipelines/torch_generator.h"
#include "schedulers/flow_match_euler.h"

namespace {

const std::filesystem::path kFixture = std::filesystem::path(KILN_FIXTURES_DIR) / "flux1_transformer_mid";
constexpr int64_t kTextTokens = 512;

struct Mid {
  double build_seconds = 0;
  std::unique_ptr<kiln::FluxTransformer2DModel> model;
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
    r.model = std::make_unique<kiln::FluxTransformer2DModel>(
        kiln::FluxTransformerConfig::from_json(kiln::io::JsonConfig(kFixture / "transformer" / "config.json")),
        kiln::nn::Weights(std::make_shared<const kiln::test::GeneratedWeights>(shapes)));
    r.build_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }();
  return m;
}

// Linear-layer and attention FLOPs of one forward (the modulation GEMVs are negligible).
double step_flops(int64_t img, int64_t txt) {
  const double d = 3072, l = double(img + txt);
  const double dbl = 2 * 12 * d * d * double(img + txt) + 4 * l * l * d;
  const double single = 2 * 12 * d * d * l + 4 * l * l * d;
  return dbl + 2 * single + 2.0 * double(txt) * 4096 * d + 2.0 * double(img) * 64 * d;
}

void BM_Step(benchmark::State& state) {
  const int64_t size = state.range(0), grid = size / 16, img = grid * grid;  // packed 2x2 latent tokens
  const auto& model = *mid().model;
  kiln::TorchGenerator gen(0);
  kiln::Tensor latents = kiln::from_vector(gen.randn(img * 64), {1, img, 64});
  const kiln::Tensor text = kiln::from_vector(gen.randn(kTextTokens * 4096), {1, kTextTokens, 4096});
  const kiln::Tensor pooled = kiln::from_vector(gen.randn(768), {1, 768});
  const kiln::Tensor img_ids = kiln::FluxPipeline::image_ids(2 * grid, 2 * grid);
  const kiln::Tensor txt_ids = kiln::zeros({kTextTokens, 3});
  kiln::FlowMatchEulerDiscreteScheduler scheduler{kiln::FlowMatchEulerConfig{}};
  for (auto _ : state) {
    scheduler.set_timesteps(4, 0.5);
    const kiln::Tensor t = kiln::full({1}, scheduler.timesteps()[0] / 1000.0f);
    const kiln::Tensor v = model.forward(latents, text, pooled, t, img_ids, txt_ids);
    kiln::wait(scheduler.step(v, latents));
  }
  state.counters["GFLOP/s"] = benchmark::Counter(step_flops(img, kTextTokens) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["img_tokens"] = double(img);
}

}  // namespace

BENCHMARK(BM_Step)->Arg(256)->Arg(512)->Unit(benchmark::kSecond)->UseRealTime()->Iterations(1)->Repetitions(3)
    ->ReportAggregatesOnly(false);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::printf("building the mid-size transformer (677M parameters, generated)...\n");
  std::printf("weights generated in %.2f s\n", mid().build_seconds);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
