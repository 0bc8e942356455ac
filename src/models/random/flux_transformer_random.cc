#include "models/random/flux_transformer_random.h"

#include <algorithm>
#include <cmath>
#include <string>

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
  TensorList t(c.tensors);
  // Each block adds gated branches to the residual streams (two per double block, one per single
  // block). Scaling every branch's last projection by 1/sqrt(branches) keeps the streams O(1)
  // however deep the model is; norms (the AdaLN LayerNorms, the QK RMSNorms) do the rest.
  const double residual = 1 / std::sqrt(double(std::max<int64_t>(1, 2 * num_layers + num_single_layers)));

  // Module order of Diffusers' FluxTransformer2DModel (where shards split).
  t.linear("time_text_embed.timestep_embedder.linear_1", kTimeChannels, kD);
  t.linear("time_text_embed.timestep_embedder.linear_2", kD, kD);
  if (variant == Flux1Variant::dev) {
    t.linear("time_text_embed.guidance_embedder.linear_1", kTimeChannels, kD);
    t.linear("time_text_embed.guidance_embedder.linear_2", kD, kD);
  }
  t.linear("time_text_embed.text_embedder.linear_1", kPooledDim, kD);
  t.linear("time_text_embed.text_embedder.linear_2", kD, kD);
  t.linear("context_embedder", kJointDim, kD);
  t.linear("x_embedder", kInChannels, kD);

  for (int64_t i = 0; i < num_layers; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    t.linear(b + "norm1.linear", kD, 6 * kD);
    t.linear(b + "norm1_context.linear", kD, 6 * kD);
    for (const char* n : {"norm_q", "norm_k"}) t.norm(b + "attn." + n, kHeadDim, false);
    for (const char* n : {"to_q", "to_k", "to_v"}) t.linear(b + "attn." + n, kD, kD);
    t.linear(b + "attn.to_out.0", kD, kD, true, residual);
    for (const char* n : {"norm_added_q", "norm_added_k"}) t.norm(b + "attn." + n, kHeadDim, false);
    for (const char* n : {"add_q_proj", "add_k_proj", "add_v_proj"}) t.linear(b + "attn." + n, kD, kD);
    t.linear(b + "attn.to_add_out", kD, kD, true, residual);
    for (const char* ff : {"ff", "ff_context"}) {
      t.linear(b + ff + ".net.0.proj", kD, 4 * kD);
      t.linear(b + ff + ".net.2", 4 * kD, kD, true, residual);
    }
  }
  for (int64_t i = 0; i < num_single_layers; ++i) {
    const std::string b = "single_transformer_blocks." + std::to_string(i) + ".";
    t.linear(b + "norm.linear", kD, 3 * kD);
    t.linear(b + "proj_mlp", kD, 4 * kD);
    t.linear(b + "proj_out", 5 * kD, kD, true, residual);  // [attention (D) | MLP (4D)] -> D
    for (const char* n : {"norm_q", "norm_k"}) t.norm(b + "attn." + n, kHeadDim, false);
    for (const char* n : {"to_q", "to_k", "to_v"}) t.linear(b + "attn." + n, kD, kD);
  }
  t.linear("norm_out.linear", kD, 2 * kD);
  t.linear("proj_out", kD, kInChannels);  // patch_size² · out_channels = 64
  return c;
}

}  // namespace kiln::random_weights
