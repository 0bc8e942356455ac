// One FLUX.1 denoising step in f32 against the same step in bf16, in one process: the
// transformer of a Diffusers folder (e.g. `kiln make-random DIR --like flux1-schnell --blocks 2+4`)
// loaded twice, as torch_dtype f32 (bf16 weights converted once at load) and as bf16 (read in
// place), then rounds of one f32 step and one bf16 step in turn, so both see the same machine.
// A step is what the pipeline runs per step: the transformer forward on inputs in its dtype, the
// scheduler update, waited for. Prints each round, the best and the median step per dtype, their
// ratio f32/bf16, the achieved GFLOP/s (linears and attention of the forward), the process's
// bf16 linear path (engine.bf16_linear in kiln's report) and the peak RSS.
//
//   build/bench/bench_step_dtypes DIR [SIZE=512] [ROUNDS=4] [T5_TOKENS=256]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "devices/cpu/kernels/linear_gemm.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "models/flux/flux_transformer.h"
#include "pipelines/flux_pipeline.h"
#include "pipelines/torch_generator.h"
#include "schedulers/flow_match_euler.h"

namespace {

using namespace kiln;

// Linear and attention FLOPs of one forward at the real widths (the modulation GEMVs are
// negligible): per token 12·d² multiply-adds in a double block's linears and in a single block's,
// attention 2·L²·d per block, plus the input projections.
double step_flops(const FluxTransformerConfig& c, int64_t img, int64_t txt) {
  const double d = double(c.num_attention_heads * c.attention_head_dim), l = double(img + txt);
  const double per_block = 2 * 12 * d * d * l + 4 * l * l * d;
  return per_block * double(c.num_layers + c.num_single_layers) + 2.0 * double(txt) * double(c.joint_attention_dim) * d +
         2.0 * double(img) * double(c.in_channels) * d;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [SIZE=512] [ROUNDS=4] [T5_TOKENS=256]\n", argv[0]);
    return 2;
  }
  const std::string dir = std::string(argv[1]) + "/transformer";
  const int64_t size = argc > 2 ? std::atoll(argv[2]) : 512;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 4;
  const int64_t txt = argc > 4 ? std::atoll(argv[4]) : 256;
  const int64_t grid = size / 16, img = grid * grid;  // packed 2x2 latent tokens

  const FluxTransformer2DModel f32 = FluxTransformer2DModel::from_pretrained(dir, DType::f32);
  const FluxTransformer2DModel bf16 = FluxTransformer2DModel::from_pretrained(dir, DType::bf16);
  const FluxTransformerConfig& c = f32.config();

  TorchGenerator gen(0);
  const Tensor latents = from_vector(gen.randn(img * c.in_channels), {1, img, c.in_channels});
  const Tensor text = from_vector(gen.randn(txt * c.joint_attention_dim), {1, txt, c.joint_attention_dim});
  const Tensor pooled = from_vector(gen.randn(c.pooled_projection_dim), {1, c.pooled_projection_dim});
  const Tensor img_ids = FluxPipeline::image_ids(2 * grid, 2 * grid), txt_ids = zeros({txt, 3});

  struct Run {
    const char* name;
    const FluxTransformer2DModel& model;
    DType dtype;
    std::vector<double> seconds;
  };
  std::vector<Run> runs{{"f32", f32, DType::f32, {}}, {"bf16", bf16, DType::bf16, {}}};
  const auto step = [&](Run& r) {
    // As the pipeline calls it: latents and embeddings in the transformer's dtype (flux1.md §6.6).
    FlowMatchEulerDiscreteScheduler scheduler{FlowMatchEulerConfig{}};
    scheduler.set_timesteps(4, 0.5);
    const Tensor x = cast(latents, r.dtype), t = cast(from_vector({scheduler.timesteps()[0] / 1000.0f}, {1}), r.dtype);
    synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor v = r.model.forward(x, cast(text, r.dtype), cast(pooled, r.dtype), t, img_ids, txt_ids);
    wait(scheduler.step(v, x));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (Run& r : runs) step(r);  // first use of every shape (JIT, primitives, the pool) untimed
  for (int i = 0; i < rounds; ++i) {
    std::printf("round %d:", i + 1);
    for (Run& r : runs) {
      r.seconds.push_back(step(r));
      std::printf("  %s %.3f s", r.name, r.seconds.back());
    }
    std::printf("\n");
  }
  const double flops = step_flops(c, img, txt);
  for (const Run& r : runs) {
    const double best = *std::min_element(r.seconds.begin(), r.seconds.end());
    std::printf("%-5s step %lldx%lld (%lld+%lld tokens, %lld+%lld blocks): best %.3f s, median %.3f s, %.0f GFLOP/s\n",
                r.name, static_cast<long long>(size), static_cast<long long>(size), static_cast<long long>(img),
                static_cast<long long>(txt), static_cast<long long>(c.num_layers),
                static_cast<long long>(c.num_single_layers), best, median(r.seconds), flops / best * 1e-9);
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf("speedup bf16 over f32: best %.3f, median %.3f (bf16 linear path: %s; peak RSS %.2f GiB)\n",
              *std::min_element(runs[0].seconds.begin(), runs[0].seconds.end()) /
                  *std::min_element(runs[1].seconds.begin(), runs[1].seconds.end()),
              median(runs[0].seconds) / median(runs[1].seconds), cpu::bf16_linear_path_name(cpu::bf16_linear_path()),
              double(usage.ru_maxrss) / double(1 << 20));
  return 0;
}
