// Tensor parallelism on the mid-size FLUX.1 transformer (flux1_transformer_mid widths, 1 double
// + 2 single blocks, generated weights): seconds per step (transformer forward + scheduler
// update, best of 3 after a warm-up) at 256x256 and 512x512 with a 512-token prompt, and each
// rank's transformer weight bytes and device peak (weights on the device). Run it through
// bench/run_tp.sh, which compares 1 rank x 2 threads with 2 ranks x 1 thread in one go:
//
//   bench/run_tp.sh            # ~3 min on 2 cores
#include <chrono>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "deterministic_weights.h"
#include "devices/runtime.h"
#include "distributed/process_group.h"
#include "distributed/tensor_parallel.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "exec/residency.h"
#include "io/json_config.h"
#include "models/flux/flux_transformer.h"
#include "pipelines/flux_pipeline.h"
#include "pipelines/torch_generator.h"
#include "schedulers/flow_match_euler.h"

int main() {
  using namespace kiln;
  const std::filesystem::path fixture = std::filesystem::path(KILN_FIXTURES_DIR) / "flux1_transformer_mid";
  std::ifstream in(fixture / "manifest.json");
  const auto manifest = nlohmann::json::parse(in);
  std::map<std::string, Shape> shapes;
  for (const auto& [name, info] : manifest["weights"]["per_tensor_checksums"].items())
    shapes[name] = info["shape"].get<Shape>();
  const auto world = ProcessGroup::world();
  const auto config = FluxTransformerConfig::from_json(io::JsonConfig(fixture / "transformer" / "config.json"));
  ComponentWeights weights("transformer");
  std::optional<FluxTransformer2DModel> model;
  {
    WeightCollector collect(weights);
    nn::Weights source(std::make_shared<const test::GeneratedWeights>(shapes));
    if (world->size() > 1)
      source = source.with_plan(ShardPlan::make(FluxTransformer2DModel::tp_plan({}, true), DeviceMesh(world)));
    model.emplace(config, source);
  }
  weights.onload(Device::cpu());
  for (int64_t size : {256, 512}) {
    const int64_t grid = size / 16, img = grid * grid, txt = 512;
    TorchGenerator gen(0);
    const Tensor latents = from_vector(gen.randn(img * 64), {1, img, 64});
    const Tensor text = from_vector(gen.randn(txt * 4096), {1, txt, 4096});
    const Tensor pooled = from_vector(gen.randn(768), {1, 768});
    const Tensor img_ids = FluxPipeline::image_ids(2 * grid, 2 * grid), txt_ids = zeros({txt, 3});
    FlowMatchEulerDiscreteScheduler scheduler{FlowMatchEulerConfig{}};
    auto step = [&] {
      scheduler.set_timesteps(4, 0.5);
      const Tensor t = from_vector({scheduler.timesteps()[0] / 1000.0f}, {1});
      const auto t0 = std::chrono::steady_clock::now();
      wait(scheduler.step(model->forward(latents, text, pooled, t, img_ids, txt_ids), latents));
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    step();  // warm-up
    runtime(Device::cpu()).reset_peak_memory();
    double best = 1e30;
    for (int i = 0; i < 3; ++i) best = std::min(best, step());
    world->barrier();
    const double peak_mib = double(runtime(Device::cpu()).memory().peak_bytes) / double(1 << 20);
    std::printf("ranks %d (%s): %lldx%lld best step %.3f s, transformer weights %.0f MiB, device peak %.0f MiB\n",
                world->size(), world->describe().c_str(), static_cast<long long>(size), static_cast<long long>(size),
                best, double(weights.bytes()) / double(1 << 20), peak_mib);
    std::fflush(stdout);
  }
  weights.offload();
  return 0;
}
