// FluxPipeline: text-to-image with a FLUX.1 checkpoint in Diffusers folder layout, step for
// step as diffusers.FluxPipeline.__call__: CLIP pooled + T5 embeddings, packed
// latents, FlowMatchEuler schedule, the transformer per step, unpack, VAE decode. Placement,
// offload, the memory checks and the size rules are DiffusionPipeline's.
#pragma once
#include <filesystem>
#include <memory>

#include "pipelines/diffusion_pipeline.h"

namespace kiln {

class FluxTransformer2DModel;

class FluxPipeline : public DiffusionPipeline {
 public:
  static constexpr const char* kClassName = "FluxPipeline";
  static FluxPipeline from_pretrained(const std::filesystem::path& dir, const PipelineOptions& options = {});
  FluxPipeline(FluxPipeline&&) noexcept;
  FluxPipeline& operator=(FluxPipeline&&) noexcept;
  ~FluxPipeline() override;

  const char* class_name() const override { return kClassName; }
  bool step_distilled() const override;
  // The denoiser, for compiled mode as in Diffusers: pipe.transformer().compile(options) or
  // pipe.transformer().compile_repeated_blocks(options).
  FluxTransformer2DModel& transformer();
  int64_t default_sample_size() const override { return 128; }

  // Packing of latents into 2x2 patch tokens and back.
  static Tensor pack_latents(const Tensor& latents);  // [B, C, h, w] -> [B, (h/2)(w/2), 4C]
  static Tensor unpack_latents(const Tensor& packed, int64_t h, int64_t w);
  static Tensor image_ids(int64_t h, int64_t w);  // [(h/2)(w/2), 3] rows (0, i, j)

 private:
  struct Models;
  FluxPipeline(std::unique_ptr<PipelineState> state, std::unique_ptr<Models> models);

  int64_t patch_size() const override { return 2; }  // the 2x2 packing
  int64_t max_sequence_length(const PipelineCallArgs& args) const override;
  void check_call(const PipelineCallArgs& args, int64_t height, int64_t width, PipelineOutput& out) const override;
  ComponentActivations trace_activations(int64_t h, int64_t w, int64_t max_sequence_length,
                                         int64_t vae_tile_size) const override;
  size_t carried_bytes(const PipelineCallArgs& args, int64_t h, int64_t w,
                       int64_t max_sequence_length) const override;
  double host_floor_bytes(int64_t height, int64_t width, int64_t max_sequence_length) const override;
  void warmup_transformer(int64_t h, int64_t w, int64_t max_sequence_length) const override;
  void run(const PipelineCallArgs& args, const Sized& sized, PipelineOutput& out) const override;

  std::unique_ptr<Models> m_;
};

}  // namespace kiln
