#include "models/random/flux2_transformer_random.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

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
  TensorList t(c.tensors);
  const int64_t D = cfg.inner_dim(), F = cfg.mlp_hidden();
  // Gated branches added to the residual streams: two per double block (attention, feed-forward;
  // the text stream has as many), one per single block. Scaling every branch's last projection
  // by 1/sqrt(branches) keeps the streams O(1) however deep the model is (FLUX.2-dev: 64).
  const double residual =
      1 / std::sqrt(double(std::max<int64_t>(1, 2 * cfg.num_layers + cfg.num_single_layers)));

  // Module order of Diffusers' Flux2Transformer2DModel (where shards split). No biases anywhere.
  t.linear("time_guidance_embed.timestep_embedder.linear_1", kTimeChannels, D, false);
  t.linear("time_guidance_embed.timestep_embedder.linear_2", D, D, false);
  if (cfg.guidance_embeds) {
    t.linear("time_guidance_embed.guidance_embedder.linear_1", kTimeChannels, D, false);
    t.linear("time_guidance_embed.guidance_embedder.linear_2", D, D, false);
  }
  t.linear("double_stream_modulation_img.linear", D, 6 * D, false);
  t.linear("double_stream_modulation_txt.linear", D, 6 * D, false);
  t.linear("single_stream_modulation.linear", D, 3 * D, false);
  t.linear("x_embedder", kInChannels, D, false);
  t.linear("context_embedder", cfg.joint_attention_dim, D, false);

  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    for (const char* n : {"to_q", "to_k", "to_v"}) t.linear(b + "attn." + n, D, D, false);
    for (const char* n : {"norm_q", "norm_k"}) t.norm(b + "attn." + n, kHeadDim, false);
    t.linear(b + "attn.to_out.0", D, D, false, residual);
    for (const char* n : {"norm_added_q", "norm_added_k"}) t.norm(b + "attn." + n, kHeadDim, false);
    for (const char* n : {"add_q_proj", "add_k_proj", "add_v_proj"}) t.linear(b + "attn." + n, D, D, false);
    t.linear(b + "attn.to_add_out", D, D, false, residual);
    for (const char* ff : {"ff", "ff_context"}) {
      t.linear(b + ff + ".linear_in", D, 2 * F, false);  // rows [gate (F); up (F)]
      t.linear(b + ff + ".linear_out", F, D, false, residual);
    }
  }
  for (int64_t i = 0; i < cfg.num_single_layers; ++i) {
    const std::string b = "single_transformer_blocks." + std::to_string(i) + ".attn.";
    t.linear(b + "to_qkv_mlp_proj", D, 3 * D + 2 * F, false);  // rows [Q; K; V; gate; up]
    for (const char* n : {"norm_q", "norm_k"}) t.norm(b + n, kHeadDim, false);
    t.linear(b + "to_out", D + F, D, false, residual);  // [attention (D) | MLP (F)] -> D
  }
  t.linear("norm_out.linear", D, 2 * D, false);
  t.linear("proj_out", D, kPatch * kPatch * kInChannels, false);
  return c;
}

}  // namespace kiln::random_weights
