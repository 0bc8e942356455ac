// Flux2Pipeline (FLUX.2-dev: Mistral 3 text encoder, guidance-distilled) and Flux2KleinPipeline
// (FLUX.2 [klein]: Qwen3 text encoder; real classifier-free guidance for the undistilled "base"
// checkpoints), text-to-image step for step as Diffusers' __call__: the chat
// template rendered and tokenized, the text encoder's hidden layers (text_encoder_out_layers)
// concatenated per token, noise drawn patchified and packed, the empirical-mu sigma schedule, the
// transformer per step (twice with klein's CFG), then the tokens unpacked by their ids,
// de-normalized with the VAE's batch-norm statistics, unpatchified and decoded. Placement, offload,
// the memory checks and the size rules are DiffusionPipeline's.
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "pipelines/diffusion_pipeline.h"

namespace kiln {

class Flux2Transformer2DModel;

class Flux2Pipeline : public DiffusionPipeline {
 public:
  static constexpr const char* kClassName = "Flux2Pipeline";
  static Flux2Pipeline from_pretrained(const std::filesystem::path& dir, const PipelineOptions& options = {});
  Flux2Pipeline(Flux2Pipeline&&) noexcept;
  Flux2Pipeline& operator=(Flux2Pipeline&&) noexcept;
  ~Flux2Pipeline() override;

  const char* class_name() const override;
  bool step_distilled() const override;
  Flux2Transformer2DModel& transformer();
  int64_t default_sample_size() const override { return 128; }

  // The call's prompt encoding (Diffusers' encode_prompt): the chat text, its token ids and
  // mask, prompt_embeds [1, L, n·hidden] (the text encoder's hidden states at `layers`, per token)
  // and text_ids [L, 4] = (0, 0, 0, l).
  struct EncodedPrompt {
    std::string chat_text;
    std::vector<int64_t> input_ids, attention_mask;
    Tensor prompt_embeds, text_ids;
  };
  EncodedPrompt encode_prompt(const std::string& prompt, int64_t max_sequence_length,
                              const std::vector<int64_t>& text_encoder_out_layers) const;
  // The chat text Diffusers renders for a prompt (dev: system message + user turn; klein: the
  // user turn with the generation prompt and thinking off).
  std::string chat_text(const std::string& prompt) const;
  // Diffusers' compute_empirical_mu.
  static double compute_empirical_mu(int64_t image_seq_len, int64_t num_steps);
  // The layers a call reads when it names none.
  const std::vector<int64_t>& default_text_encoder_out_layers() const;
  // klein: model_index.json's is_distilled (dev: true; it has no CFG).
  bool is_distilled() const;

  struct Variant;  // what differs between Flux2Pipeline and Flux2KleinPipeline (data)

 protected:
  struct Models;
  Flux2Pipeline(std::unique_ptr<PipelineState> state, std::unique_ptr<Models> models);
  static Flux2Pipeline load(const std::filesystem::path& dir, const PipelineOptions& options, const Variant& variant);

 private:
  int64_t patch_size() const override { return 2; }  // latents are 2x2-patchified
  int64_t max_sequence_length(const PipelineCallArgs& args) const override;
  void check_call(const PipelineCallArgs& args, int64_t height, int64_t width, PipelineOutput& out) const override;
  ComponentActivations trace_activations(int64_t h, int64_t w, int64_t max_sequence_length,
                                         int64_t vae_tile_size) const override;
  size_t carried_bytes(const PipelineCallArgs& args, int64_t h, int64_t w,
                       int64_t max_sequence_length) const override;
  double host_floor_bytes(int64_t height, int64_t width, int64_t max_sequence_length) const override;
  void warmup_transformer(int64_t h, int64_t w, int64_t max_sequence_length) const override;
  void run(const PipelineCallArgs& args, const Sized& sized, PipelineOutput& out) const override;

  bool real_cfg(const PipelineCallArgs& args) const;
  double guidance_scale(const PipelineCallArgs& args) const;
  const std::vector<int64_t>& out_layers(const PipelineCallArgs& args) const;

  std::unique_ptr<Models> m_;
};

class Flux2KleinPipeline : public Flux2Pipeline {
 public:
  static constexpr const char* kClassName = "Flux2KleinPipeline";
  static Flux2KleinPipeline from_pretrained(const std::filesystem::path& dir, const PipelineOptions& options = {});

 private:
  explicit Flux2KleinPipeline(Flux2Pipeline&& p) : Flux2Pipeline(std::move(p)) {}
};

}  // namespace kiln
