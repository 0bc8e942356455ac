#include "random_checkpoint/flux2_transformer_random.h"

#include "core/error.h"
#include "models/flux2/flux2_transformer.h"
#include "random_checkpoint/model_reads.h"

namespace kiln::random_weights {

namespace {

constexpr int64_t kHeadDim = 128, kInChannels = 128, kTimeChannels = 256, kPatch = 1;
constexpr double kMlpRatio = 3.0;

}  // namespace

// [VERIFY] _diffusers_version: the versions the checkpoints were converted with (FLUX.2-dev:
// November 2025, klein: January 2026), not read from the files.
Flux2TransformerRandomConfig Flux2TransformerRandomConfig::for_variant(Flux2Variant v) {
  switch (v) {
    case Flux2Variant::klein_4b: return {5, 20, 24, 7680, false, true, "0.37.0.dev0"};
    case Flux2Variant::klein_9b: return {8, 24, 32, 12288, false, true, "0.37.0.dev0"};
    default: return {};
  }
}

int64_t Flux2TransformerRandomConfig::inner_dim() const { return num_attention_heads * kHeadDim; }
int64_t Flux2TransformerRandomConfig::mlp_hidden() const { return int64_t(double(inner_dim()) * kMlpRatio); }

nlohmann::json flux2_transformer_config(const Flux2TransformerRandomConfig& c) {
  nlohmann::json j = {
      {"_class_name", "Flux2Transformer2DModel"},
      {"_diffusers_version", c.diffusers_version},
      {"attention_head_dim", kHeadDim},
      {"axes_dims_rope", {32, 32, 32, 32}},
      {"eps", 1e-06},
      {"in_channels", kInChannels},
      {"joint_attention_dim", c.joint_attention_dim},
      {"mlp_ratio", kMlpRatio},
      {"num_attention_heads", c.num_attention_heads},
      {"num_layers", c.num_layers},
      {"num_single_layers", c.num_single_layers},
      {"out_channels", nullptr},
      {"patch_size", kPatch},
      {"rope_theta", 2000},
      {"timestep_guidance_channels", kTimeChannels},
  };
  if (c.writes_guidance_embeds || !c.guidance_embeds) j["guidance_embeds"] = c.guidance_embeds;
  return j;
}

RandomComponent flux2_transformer_random(const Flux2TransformerRandomConfig& cfg) {
  KILN_CHECK(cfg.num_layers >= 0 && cfg.num_single_layers >= 0, "make-random", "block counts must be >= 0, got ",
             cfg.num_layers, "+", cfg.num_single_layers);
  RandomComponent c{"transformer", flux2_transformer_config(cfg), "diffusion_pytorch_model", kDiffusersShardBytes, {}};
  // Gated branches added to the residual streams: two per double block (attention, feed-forward;
  // the text stream has as many), one per single block (FLUX.2-dev: 64 in all).
  ReadRules rules;
  rules.gains = residual_gains(
      {"attn.to_out.0", "attn.to_add_out", "ff.linear_out", "ff_context.linear_out", "attn.to_out"},
      2 * cfg.num_layers + cfg.num_single_layers);
  c.tensors = tensors_read_by<Flux2Transformer2DModel, Flux2TransformerConfig>(c, rules);
  return c;
}

}  // namespace kiln::random_weights
