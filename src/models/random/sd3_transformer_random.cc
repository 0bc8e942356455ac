#include "models/random/sd3_transformer_random.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace kiln::random_weights {

namespace {

constexpr int64_t kHeads = 24, kHeadDim = 64, kD = kHeads * kHeadDim, kChannels = 16, kPatch = 2, kSampleSize = 128,
                  kJointDim = 4096, kPooledDim = 2048, kTimeChannels = 256, kDualLayers = 13;

int64_t pos_embed_max_size(Sd3Variant v) { return v == Sd3Variant::sd35_medium ? 384 : 192; }

}  // namespace

std::vector<int64_t> sd3_dual_attention_layers(Sd3Variant variant, int64_t num_layers) {
  std::vector<int64_t> out;
  if (variant == Sd3Variant::sd35_medium)
    for (int64_t i = 0; i < std::min(num_layers, kDualLayers); ++i) out.push_back(i);
  return out;
}

// The Hub's transformer/config.json, keys sorted as save_pretrained writes them.
// SD3.0 Medium's file predates dual_attention_layers and qk_norm and omits both.
// [VERIFY] _diffusers_version: the versions the checkpoints were released with (SD3.0 Medium:
// June 2024, 3.5 Medium: October 2024), not read from the files.
nlohmann::json sd3_transformer_config(Sd3Variant variant, int64_t num_layers) {
  const bool v35 = variant == Sd3Variant::sd35_medium;
  nlohmann::json c = {
      {"_class_name", "SD3Transformer2DModel"},
      {"_diffusers_version", v35 ? "0.31.0.dev0" : "0.29.0.dev0"},
      {"attention_head_dim", kHeadDim},
      {"caption_projection_dim", kD},
      {"in_channels", kChannels},
      {"joint_attention_dim", kJointDim},
      {"num_attention_heads", kHeads},
      {"num_layers", num_layers},
      {"out_channels", kChannels},
      {"patch_size", kPatch},
      {"pooled_projection_dim", kPooledDim},
      {"pos_embed_max_size", pos_embed_max_size(variant)},
      {"sample_size", kSampleSize},
  };
  if (v35) {
    c["dual_attention_layers"] = sd3_dual_attention_layers(variant, num_layers);
    c["qk_norm"] = "rms_norm";
  }
  return c;
}

RandomComponent sd3_transformer_random(Sd3Variant variant, int64_t num_layers) {
  KILN_CHECK(num_layers >= 1, "make-random", "SD3 needs at least 1 transformer block, got ", num_layers);
  RandomComponent c{"transformer", sd3_transformer_config(variant, num_layers), "diffusion_pytorch_model",
                    kDiffusersShardBytes, {}};
  TensorList t(c.tensors);
  const std::vector<int64_t> dual = sd3_dual_attention_layers(variant, num_layers);
  const bool qk_norm = variant == Sd3Variant::sd35_medium;
  const int64_t M = pos_embed_max_size(variant);
  // Gated branches added to the image stream: attention and feed-forward in every block, and
  // attn2 in the dual ones (the context stream has fewer). Scaling every branch's last
  // projection by 1/sqrt(branches) keeps the streams O(1) however deep the model is.
  const double residual = 1 / std::sqrt(double(2 * num_layers + int64_t(dual.size())));

  // Module order of Diffusers' SD3Transformer2DModel (where shards would split; one file here).
  t.add("pos_embed.pos_embed", {1, M * M, kD}, Init::sincos_2d(M, kD, kSampleSize / kPatch));
  t.conv2d("pos_embed.proj", kChannels, kD, kPatch);
  t.linear("time_text_embed.timestep_embedder.linear_1", kTimeChannels, kD);
  t.linear("time_text_embed.timestep_embedder.linear_2", kD, kD);
  t.linear("time_text_embed.text_embedder.linear_1", kPooledDim, kD);
  t.linear("time_text_embed.text_embedder.linear_2", kD, kD);
  t.linear("context_embedder", kJointDim, kD);

  for (int64_t i = 0; i < num_layers; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    const bool is_dual = std::find(dual.begin(), dual.end(), i) != dual.end();
    const bool last = i == num_layers - 1;  // context_pre_only
    t.linear(b + "norm1.linear", kD, (is_dual ? 9 : 6) * kD);
    t.linear(b + "norm1_context.linear", kD, (last ? 2 : 6) * kD);
    if (qk_norm)
      for (const char* n : {"norm_q", "norm_k"}) t.norm(b + "attn." + n, kHeadDim, false);
    for (const char* n : {"to_q", "to_k", "to_v", "add_k_proj", "add_v_proj", "add_q_proj"})
      t.linear(b + "attn." + n, kD, kD);
    t.linear(b + "attn.to_out.0", kD, kD, true, residual);
    if (!last) t.linear(b + "attn.to_add_out", kD, kD, true, residual);
    if (qk_norm)
      for (const char* n : {"norm_added_q", "norm_added_k"}) t.norm(b + "attn." + n, kHeadDim, false);
    if (is_dual) {
      if (qk_norm)
        for (const char* n : {"norm_q", "norm_k"}) t.norm(b + "attn2." + n, kHeadDim, false);
      for (const char* n : {"to_q", "to_k", "to_v"}) t.linear(b + "attn2." + n, kD, kD);
      t.linear(b + "attn2.to_out.0", kD, kD, true, residual);
    }
    t.linear(b + "ff.net.0.proj", kD, 4 * kD);
    t.linear(b + "ff.net.2", 4 * kD, kD, true, residual);
    if (!last) {
      t.linear(b + "ff_context.net.0.proj", kD, 4 * kD);
      t.linear(b + "ff_context.net.2", 4 * kD, kD, true, residual);
    }
  }
  t.linear("norm_out.linear", kD, 2 * kD);
  t.linear("proj_out", kD, kPatch * kPatch * kChannels);
  return c;
}

}  // namespace kiln::random_weights
