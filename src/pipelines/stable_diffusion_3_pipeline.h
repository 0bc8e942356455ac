// StableDiffusion3Pipeline: text-to-image with a Stable Diffusion 3 / 3.5 checkpoint in
// Diffusers folder layout, step for step as diffusers.StableDiffusion3Pipeline.__call__:
// three text encoders (CLIP-L, CLIP-G, T5; T5 optional), classifier-free
// guidance as a batch of two (unconditional first), skip-layer guidance, FlowMatchEuler with
// its static shift, AutoencoderKL with SD3's scaling and shift. Placement, offload, the memory
// checks and the size rules are DiffusionPipeline's.
#pragma once
#include <array>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "pipelines/diffusion_pipeline.h"

namespace kiln {

class SD3Transformer2DModel;

class StableDiffusion3Pipeline : public DiffusionPipeline {
 public:
  static constexpr const char* kClassName = "StableDiffusion3Pipeline";
  static StableDiffusion3Pipeline from_pretrained(const std::filesystem::path& dir,
                                                  const PipelineOptions& options = {});
  StableDiffusion3Pipeline(StableDiffusion3Pipeline&&) noexcept;
  StableDiffusion3Pipeline& operator=(StableDiffusion3Pipeline&&) noexcept;
  ~StableDiffusion3Pipeline() override;

  const char* class_name() const override { return kClassName; }
  SD3Transformer2DModel& transformer();
  int64_t default_sample_size() const override;  // the transformer's sample_size (128: 1024² images)

  // encode_prompt for one prompt of each encoder: prompt_embeds [1, 77 + S, W]
  // (CLIP-L ‖ CLIP-G penultimate hidden states, zero-padded or cut to T5's width W, then T5's
  // S tokens) and pooled_prompt_embeds [1, P_L + P_G].
  struct PromptEmbeds {
    Tensor prompt_embeds, pooled_prompt_embeds;
  };
  PromptEmbeds encode_prompt(const std::string& prompt, const std::string& prompt_2, const std::string& prompt_3,
                             int64_t max_sequence_length) const;
  bool has_text_encoder_3() const;
  // encode_prompt for several (prompt, prompt_2, prompt_3), in order.
  std::vector<PromptEmbeds> encode_prompts(const std::vector<std::array<std::string, 3>>& prompts,
                                           int64_t max_sequence_length) const;

 private:
  struct Models;
  StableDiffusion3Pipeline(std::unique_ptr<PipelineState> state, std::unique_ptr<Models> models);

  int64_t patch_size() const override;
  bool rounds_sizes() const override { return false; }
  int64_t max_sequence_length(const PipelineCallArgs& args) const override;
  void check_call(const PipelineCallArgs& args, int64_t height, int64_t width, PipelineOutput& out) const override;
  ComponentActivations trace_activations(int64_t h, int64_t w, int64_t max_sequence_length,
                                         int64_t vae_tile_size) const override;
  size_t carried_bytes(const PipelineCallArgs& args, int64_t h, int64_t w,
                       int64_t max_sequence_length) const override;
  double host_floor_bytes(int64_t height, int64_t width, int64_t max_sequence_length) const override;
  void warmup_transformer(int64_t h, int64_t w, int64_t max_sequence_length) const override;
  void run(const PipelineCallArgs& args, const Sized& sized, PipelineOutput& out) const override;

  // `stages`: each encoder's work counts for it in the profile (a call's run()). `clip_skip`: per
  // prompt, the CLIP layers skipped from the end (none past its size).
  std::vector<PromptEmbeds> encode_prompts(const std::vector<std::array<std::string, 3>>& prompts,
                                           int64_t max_sequence_length, Stages* stages,
                                           const std::vector<int64_t>& clip_skip = {}) const;

  std::unique_ptr<Models> m_;
};

}  // namespace kiln
