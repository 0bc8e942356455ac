#include "random_checkpoint/flux_transformer_random.h"

#include <string>

#include "models/flux/flux_transformer.h"
#include "random_checkpoint/model_reads.h"

namespace kiln::random_weights {

namespace {

constexpr int64_t kHeads = 24, kHeadDim = 128, kD = kHeads * kHeadDim, kInChannels = 64, kJointDim = 4096,
                  kPooledDim = 768, kTimeChannels = 256;

// The Hub's transformer/config.json (diffusers 0.30.0.dev0 wrote both; dev's carries the
// conversion script's _name_or_path). Every field kiln reads has its FLUX.1 value.
nlohmann::json config(Flux1Variant variant, int64_t num_layers, int64_t num_single_layers) {
  nlohmann::json c = {
      {"_class_name", "FluxTransformer2DModel"},
      {"_diffusers_version", "0.30.0.dev0"},
      {"attention_head_dim", kHeadDim},
      {"guidance_embeds", variant == Flux1Variant::dev},
      {"in_channels", kInChannels},
      {"joint_attention_dim", kJointDim},
      {"num_attention_heads", kHeads},
      {"num_layers", num_layers},
      {"num_single_layers", num_single_layers},
      {"patch_size", 1},
      {"pooled_projection_dim", kPooledDim},
  };
  if (variant == Flux1Variant::dev) c["_name_or_path"] = "../checkpoints/flux-dev/transformer";
  return c;
}

}  // namespace

RandomComponent flux_transformer_random(Flux1Variant variant, int64_t num_layers, int64_t num_single_layers) {
  RandomComponent c{"transformer", config(variant, num_layers, num_single_layers), "diffusion_pytorch_model",
                    kDiffusersShardBytes, {}};
  // Each block adds gated branches to the residual streams: two per double block (and as many to
  // the text stream), one per single block.
  ReadRules rules;
  rules.gains = residual_gains({"attn.to_out.0", "attn.to_add_out", "ff.net.2", "ff_context.net.2", "proj_out"},
                               2 * num_layers + num_single_layers);
  c.tensors = tensors_read_by<FluxTransformer2DModel, FluxTransformerConfig>(c, rules);
  return c;
}

}  // namespace kiln::random_weights
