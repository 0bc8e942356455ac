#include "models/random/autoencoder_kl_random.h"

#include <string>
#include <vector>

namespace kiln::random_weights {

namespace {

const std::vector<int64_t> kBlockOutChannels{128, 256, 512, 512};
constexpr int64_t kLayersPerBlock = 2, kLatentChannels = 16, kImageChannels = 3, kGroups = 32;

// vae/config.json of the Hub (the same file in FLUX.1-schnell and FLUX.1-dev; SD3's differs in the
// latent scaling, the version and the absent _name_or_path).
nlohmann::json config(const AutoencoderKlRandomConfig& v) {
  const std::vector<std::string> down(4, "DownEncoderBlock2D"), up(4, "UpDecoderBlock2D");
  nlohmann::json c = {
      {"_class_name", "AutoencoderKL"},
      {"_diffusers_version", v.diffusers_version},
      {"act_fn", "silu"},
      {"block_out_channels", kBlockOutChannels},
      {"down_block_types", down},
      {"force_upcast", true},
      {"in_channels", kImageChannels},
      {"latent_channels", kLatentChannels},
      {"latents_mean", nullptr},
      {"latents_std", nullptr},
      {"layers_per_block", kLayersPerBlock},
      {"mid_block_add_attention", true},
      {"norm_num_groups", kGroups},
      {"out_channels", kImageChannels},
      {"sample_size", 1024},
      {"scaling_factor", v.scaling_factor},
      {"shift_factor", v.shift_factor},
      {"up_block_types", up},
      {"use_post_quant_conv", false},
      {"use_quant_conv", false},
  };
  if (!v.name_or_path.empty()) c["_name_or_path"] = v.name_or_path;
  return c;
}

// ResnetBlock2D: GroupNorm, 3x3 conv, GroupNorm, 3x3 conv, and a 1x1 shortcut when the channel
// count changes. The GroupNorms see every branch input at unit scale.
void resnet(TensorList& t, const std::string& p, int64_t in, int64_t out) {
  t.norm(p + "norm1", in, true);
  t.conv2d(p + "conv1", in, out, 3);
  t.norm(p + "norm2", out, true);
  t.conv2d(p + "conv2", out, out, 3);
  if (in != out) t.conv2d(p + "conv_shortcut", in, out, 1);
}

// UNetMidBlock2D: one single-head attention between two resnets.
void mid_block(TensorList& t, const std::string& p, int64_t c) {
  t.norm(p + "attentions.0.group_norm", c, true);
  for (const char* n : {"to_q", "to_k", "to_v", "to_out.0"}) t.linear(p + "attentions.0." + n, c, c);
  resnet(t, p + "resnets.0.", c, c);
  resnet(t, p + "resnets.1.", c, c);
}

}  // namespace

AutoencoderKlRandomConfig AutoencoderKlRandomConfig::flux1() { return {}; }

AutoencoderKlRandomConfig AutoencoderKlRandomConfig::sd3() {
  // [VERIFY] _diffusers_version: the version SD3 Medium was released with, not read from the file.
  return {1.5305, 0.0609, "0.29.0.dev0", ""};
}

RandomComponent autoencoder_kl_random() { return autoencoder_kl_random(AutoencoderKlRandomConfig::flux1()); }

RandomComponent autoencoder_kl_random(const AutoencoderKlRandomConfig& config_fields) {
  RandomComponent c{"vae", config(config_fields), "diffusion_pytorch_model", kDiffusersShardBytes, {}};
  TensorList t(c.tensors);
  const int64_t n = int64_t(kBlockOutChannels.size()), top = kBlockOutChannels.back();

  t.conv2d("encoder.conv_in", kImageChannels, kBlockOutChannels[0], 3);
  int64_t prev = kBlockOutChannels[0];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t out = kBlockOutChannels[size_t(i)];
    const std::string b = "encoder.down_blocks." + std::to_string(i) + ".";
    for (int64_t r = 0; r < kLayersPerBlock; ++r)
      resnet(t, b + "resnets." + std::to_string(r) + ".", r ? out : prev, out);
    if (i != n - 1) t.conv2d(b + "downsamplers.0.conv", out, out, 3);
    prev = out;
  }
  mid_block(t, "encoder.mid_block.", top);
  t.norm("encoder.conv_norm_out", top, true);
  t.conv2d("encoder.conv_out", top, 2 * kLatentChannels, 3);  // mean and log-variance

  t.conv2d("decoder.conv_in", kLatentChannels, top, 3);
  prev = top;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t out = kBlockOutChannels[size_t(n - 1 - i)];
    const std::string b = "decoder.up_blocks." + std::to_string(i) + ".";
    for (int64_t r = 0; r <= kLayersPerBlock; ++r)
      resnet(t, b + "resnets." + std::to_string(r) + ".", r ? out : prev, out);
    if (i != n - 1) t.conv2d(b + "upsamplers.0.conv", out, out, 3);
    prev = out;
  }
  mid_block(t, "decoder.mid_block.", top);
  t.norm("decoder.conv_norm_out", kBlockOutChannels[0], true);
  t.conv2d("decoder.conv_out", kBlockOutChannels[0], kImageChannels, 3);
  return c;
}

}  // namespace kiln::random_weights
