// FluxPipeline: text-to-image with a FLUX.1 checkpoint in Diffusers folder layout, step for
// step as diffusers.FluxPipeline.__call__ (flux1.md §6): CLIP pooled + T5 embeddings, packed
// latents, FlowMatchEuler schedule, the transformer per step, unpack, VAE decode.
#pragma once
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

class FluxTransformer2DModel;

struct FluxPipelineOptions {
  Device device = Device::cpu();
};

struct FluxCallArgs {
  std::string prompt;
  std::optional<std::string> prompt_2;  // T5 prompt; defaults to prompt
  std::optional<int64_t> height, width;  // default: default_sample_size * vae_scale_factor
  int64_t num_inference_steps = 28;
  double guidance_scale = 3.5;  // used only by guidance-distilled (dev) checkpoints
  int64_t max_sequence_length = 512;
  uint64_t seed = 0;  // torch.Generator("cpu").manual_seed(seed) noise, unless latents are given
  // Explicit initial noise: packed [1, L_img, 4C] or unpacked [1, C, h, w] (parity tests).
  Tensor latents;
  // Called after every denoising step with (step index from 0, total steps, seconds of that step).
  std::function<void(int64_t, int64_t, double)> on_step;
  // Called at once with each warning (e.g. a size rounded down), before the work starts.
  std::function<void(const std::string&)> on_warning;
};

struct FluxTimings {
  double encode = 0, decode = 0, total = 0;
  std::vector<double> steps;
};

struct FluxOutput {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> image;  // RGB, row-major HWC
  Tensor latents;              // final packed latents [1, L_img, 4C]
  FluxTimings timings;
  std::vector<std::string> warnings;  // e.g. a size rounded down to a multiple of 16
};

class FluxPipeline {
 public:
  static FluxPipeline from_pretrained(const std::filesystem::path& dir, const FluxPipelineOptions& options = {});
  FluxPipeline(FluxPipeline&&) noexcept;
  FluxPipeline& operator=(FluxPipeline&&) noexcept;
  ~FluxPipeline();

  FluxOutput operator()(const FluxCallArgs& args) const;

  // The denoiser, for compiled mode as in Diffusers: pipe.transformer().compile(options) or
  // pipe.transformer().compile_repeated_blocks(options) (runtime.md §2.4, §5).
  FluxTransformer2DModel& transformer();
  // Traces and compiles the transformer executables a call at this size would use, without
  // running anything, so serving never compiles on a request (kiln warmup). Sizes are rounded
  // as operator() rounds them. Needs a compiled transformer.
  void warmup(int64_t height, int64_t width, int64_t max_sequence_length = 512) const;

  int64_t vae_scale_factor() const;
  int64_t default_sample_size() const { return 128; }
  double load_seconds() const;
  const std::filesystem::path& model_dir() const;

  // Packing of latents into 2x2 patch tokens and back (flux1.md §6.3).
  static Tensor pack_latents(const Tensor& latents);  // [B, C, h, w] -> [B, (h/2)(w/2), 4C]
  static Tensor unpack_latents(const Tensor& packed, int64_t h, int64_t w);
  static Tensor image_ids(int64_t h, int64_t w);  // [(h/2)(w/2), 3] rows (0, i, j)

 private:
  struct Components;
  explicit FluxPipeline(std::unique_ptr<Components> c);
  std::unique_ptr<Components> c_;
};

}  // namespace kiln
