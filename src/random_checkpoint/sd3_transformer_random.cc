#include "random_checkpoint/sd3_transformer_random.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "models/sd3/sd3_transformer.h"
#include "random_checkpoint/model_reads.h"

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
  // Gated branches added to the image stream: attention and feed-forward in every block, and
  // attn2 in the dual ones (the context stream has fewer).
  ReadRules rules;
  rules.gains = residual_gains({"attn.to_out.0", "attn.to_add_out", "attn2.to_out.0", "ff.net.2", "ff_context.net.2"},
                               2 * num_layers + int64_t(sd3_dual_attention_layers(variant, num_layers).size()));
  const int64_t M = pos_embed_max_size(variant);
  rules.inits = {{"pos_embed.pos_embed", Init::sincos_2d(M, kD, kSampleSize / kPatch)}};
  c.tensors = tensors_read_by<SD3Transformer2DModel, SD3TransformerConfig>(c, rules);
  return c;
}

}  // namespace kiln::random_weights
