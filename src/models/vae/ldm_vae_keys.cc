#include "models/vae/ldm_vae_keys.h"

namespace kiln {

namespace {

using io::KeyRule;
using io::KeyTransform;

struct Rules {
  std::vector<KeyRule> r;

  // weight and bias of one layer
  void layer(const std::string& original, const std::string& diffusers, bool optional = false, bool reversed = false,
             KeyTransform weight_transform = KeyTransform::whole) {
    for (const char* p : {".weight", ".bias"})
      r.push_back({.original = original + p,
                   .diffusers = {diffusers + p},
                   .transform = std::string(p) == ".weight" ? weight_transform : KeyTransform::whole,
                   .optional = optional,
                   .reversed_index = reversed});
  }
  // ResnetBlock2D: the 1x1 shortcut only where the channel count changes.
  void resnet(const std::string& original, const std::string& diffusers, bool reversed = false) {
    for (const char* l : {"norm1", "conv1", "norm2", "conv2"})
      layer(original + "." + l, diffusers + "." + l, false, reversed);
    layer(original + ".nin_shortcut", diffusers + ".conv_shortcut", /*optional=*/true, reversed);
  }
  // The mid block: resnet, single-head attention (q, k, v, proj_out as 1x1 convolutions), resnet.
  void mid_block(const std::string& original, const std::string& diffusers) {
    resnet(original + ".block_1", diffusers + ".resnets.0");
    resnet(original + ".block_2", diffusers + ".resnets.1");
    const std::string a = original + ".attn_1.", d = diffusers + ".attentions.0.";
    layer(a + "norm", d + "group_norm");
    layer(a + "q", d + "to_q", false, false, KeyTransform::conv1x1_to_linear);
    layer(a + "k", d + "to_k", false, false, KeyTransform::conv1x1_to_linear);
    layer(a + "v", d + "to_v", false, false, KeyTransform::conv1x1_to_linear);
    layer(a + "proj_out", d + "to_out.0", false, false, KeyTransform::conv1x1_to_linear);
  }
};

}  // namespace

std::vector<KeyRule> ldm_vae_key_rules() {
  Rules r;
  r.layer("encoder.conv_in", "encoder.conv_in");
  r.resnet("encoder.down.{i}.block.{j}", "encoder.down_blocks.{i}.resnets.{j}");
  // Every down block but the last halves the size.
  r.layer("encoder.down.{i}.downsample.conv", "encoder.down_blocks.{i}.downsamplers.0.conv", /*optional=*/true);
  r.mid_block("encoder.mid", "encoder.mid_block");
  r.layer("encoder.norm_out", "encoder.conv_norm_out");
  r.layer("encoder.conv_out", "encoder.conv_out");

  r.layer("decoder.conv_in", "decoder.conv_in");
  r.mid_block("decoder.mid", "decoder.mid_block");
  // LDM numbers the decoder's up blocks from the output side (up.0 is the last to run), Diffusers
  // from the input side: up_blocks.{n-1-i} is up.{i}.
  r.resnet("decoder.up.{i}.block.{j}", "decoder.up_blocks.{i}.resnets.{j}", /*reversed=*/true);
  r.layer("decoder.up.{i}.upsample.conv", "decoder.up_blocks.{i}.upsamplers.0.conv", /*optional=*/true,
          /*reversed=*/true);
  r.layer("decoder.norm_out", "decoder.conv_norm_out");
  r.layer("decoder.conv_out", "decoder.conv_out");

  // Absent from FLUX.1's and SD3's VAE (use_quant_conv / use_post_quant_conv false).
  r.layer("quant_conv", "quant_conv", /*optional=*/true);
  r.layer("post_quant_conv", "post_quant_conv", /*optional=*/true);
  return std::move(r.r);
}

}  // namespace kiln
