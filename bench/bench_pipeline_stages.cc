// Per-stage seconds of a FluxPipeline call, warm: the call runs once to build its kernels and pool
// its memory, then again; the second call's prompt encoding, its last denoising step and its
// decode are printed, with the process's peak RSS. The same stages the peers' scripts time
// (bench/peer_stage_times.py for Diffusers), on the same `kiln make-random` folder. With --profile
// the second call is profiled (exec/profile.h) and each component's seconds per op are printed.
// With --calls N (default 2) the call runs N times; the stages printed are the last call's, and
// the best encode and the best step of the warm calls are printed too, with every one (the encode
// does not depend on SIZE, so a small SIZE makes many calls cheap: the machine's noise then shows
// in the spread).
//
//   build/bench/bench_pipeline_stages DIR SIZE [f32|bf16|auto] [--vae-tiling on|off|auto] [--vae-tile-size PIXELS]
//                                     [--profile] [--calls N]
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "exec/profile.h"
#include "pipelines/flux_pipeline.h"

int main(int argc, char** argv) {
  using namespace kiln;
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: %s DIR SIZE [f32|bf16|auto] [--vae-tiling on|off|auto] [--vae-tile-size PIXELS] [--profile] "
                 "[--calls N]\n",
                 argv[0]);
    return 2;
  }
  PipelineOptions options;
  PipelineCallArgs args;
  bool profile_ops = false;
  int calls = 2;
  args.prompt = "a photograph of an astronaut riding a horse";
  args.height = args.width = std::atoll(argv[2]);
  args.num_inference_steps = 2;
  args.max_sequence_length = 256;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "f32") options.dtype = DType::f32;
    else if (a == "bf16") options.dtype = DType::bf16;
    else if (a == "auto") options.dtype = std::nullopt;
    else if (a == "--vae-tiling" && i + 1 < argc) {
      const std::string v = argv[++i];
      args.vae_tiling = v == "on" ? VaeTilingMode::kOn : v == "off" ? VaeTilingMode::kOff : VaeTilingMode::kAuto;
    } else if (a == "--vae-tile-size" && i + 1 < argc) {
      args.vae_tile_size = std::atoll(argv[++i]);
    } else if (a == "--profile") {
      profile_ops = true;
    } else if (a == "--calls" && i + 1 < argc) {
      calls = std::max(2, std::atoi(argv[++i]));
    }
  }
  const FluxPipeline pipe = FluxPipeline::from_pretrained(argv[1], options);
  pipe(args);
  std::vector<double> encodes, steps;
  const auto keep = [&](const PipelineOutput& o) {
    encodes.push_back(o.timings.encode);
    steps.insert(steps.end(), o.timings.steps.begin(), o.timings.steps.end());
  };
  for (int c = 2; c < calls; ++c) keep(pipe(args));
  if (profile_ops) {
    reset_profile();
    set_profiling(true);
  }
  const PipelineOutput out = pipe(args);
  keep(out);
  if (profile_ops) {
    set_profiling(false);
    const Profile p = profile();
    std::map<std::string, std::vector<std::pair<double, std::string>>> rows;
    for (const auto& [key, row] : p.by_op)
      rows[key.first].push_back({row.seconds, key.second + " x" + std::to_string(row.launches)});
    for (auto& [component, ops] : rows) {
      std::sort(ops.rbegin(), ops.rend());
      std::printf("%s %.3f s:", component.c_str(), p.component_seconds(component));
      for (size_t i = 0; i < ops.size() && i < 6; ++i) std::printf("  %s %.3f s", ops[i].second.c_str(), ops[i].first);
      std::printf("\n");
    }
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf("kiln %lldx%lld %s: encode %.3f s, step %.3f s, decode %.3f s (vae tile %lld), peak RSS %.2f GiB\n",
              static_cast<long long>(out.height), static_cast<long long>(out.width),
              dtype_name(pipe.dtypes()[2].second), out.timings.encode, out.timings.steps.back(), out.timings.decode,
              static_cast<long long>(out.vae_tile_size), double(usage.ru_maxrss) / double(1 << 20));
  if (encodes.size() > 1) {
    std::printf("encode of the %zu warm calls: best %.3f s, all", encodes.size(),
                *std::min_element(encodes.begin(), encodes.end()));
    for (const double e : encodes) std::printf(" %.3f", e);
    std::printf("\nsteps of the %zu warm calls: best %.3f s, all", encodes.size(),
                *std::min_element(steps.begin(), steps.end()));
    for (const double e : steps) std::printf(" %.3f", e);
    std::printf("\n");
  }
  return 0;
}
