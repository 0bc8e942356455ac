#include "models/random/autoencoder_kl_random.h"

#include <string>
#include <vector>

namespace kiln::random_weights {

namespace {

const std::vector<int64_t> kBlockOutChannels{128, 256, 512, 512};
constexpr int64_t kLayersPerBlock = 2, kImageChannels = 3, kGroups = 32;

int64_t latent_channels(const AutoencoderKlRandomConfig& v) { return v.is_flux2() ? 32 : 16; }

// vae/config.json of the Hub (the same file in FLUX.1-schnell and FLUX.1-dev; SD3's differs in the
// latent scaling, the version and the absent _name_or_path).
nlohmann::json config(const AutoencoderKlRandomConfig& v) {
  const std::vector<std::string> down(4, "DownEncoderBlock2D"), up(4, "UpDecoderBlock2D");
  if (v.is_flux2()) {
    // AutoencoderKLFlux2: the latent BatchNorm's settings and a 2x2 patch instead of the scaling.
    return {
        {"_class_name", v.class_name},
        {"_diffusers_version", v.diffusers_version},
        {"act_fn", "silu"},
        {"batch_norm_eps", 0.0001},
        {"batch_norm_momentum", 0.1},
        {"block_out_channels", kBlockOutChannels},
        {"down_block_types", down},
        {"force_upcast", true},
        {"in_channels", kImageChannels},
        {"latent_channels", latent_channels(v)},
        {"layers_per_block", kLayersPerBlock},
        {"mid_block_add_attention", true},
        {"norm_num_groups", kGroups},
        {"out_channels", kImageChannels},
        {"patch_size", {2, 2}},
        {"sample_size", 1024},
        {"up_block_types", up},
        {"use_post_quant_conv", true},
        {"use_quant_conv", true},
    };
  }
  nlohmann::json c = {
      {"_class_name", "AutoencoderKL"},
      {"_diffusers_version", v.diffusers_version},
      {"act_fn", "silu"},
      {"block_out_channels", kBlockOutChannels},
      {"down_block_types", down},
      {"force_upcast", true},
      {"in_channels", kImageChannels},
      {"latent_channels", latent_channels(v)},
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

AutoencoderKlRandomConfig AutoencoderKlRandomConfig::flux2() {
  // [VERIFY] _diffusers_version: the version FLUX.2-dev was converted with, not read from the file.
  return {1, 0, "0.36.0.dev0", "", "AutoencoderKLFlux2"};
}

RandomComponent autoencoder_kl_random() { return autoencoder_kl_random(AutoencoderKlRandomConfig::flux1()); }

RandomComponent autoencoder_kl_random(const AutoencoderKlRandomConfig& config_fields) {
  RandomComponent c{"vae", config(config_fields), "diffusion_pytorch_model", kDiffusersShardBytes, {}};
  TensorList t(c.tensors);
  const int64_t n = int64_t(kBlockOutChannels.size()), top = kBlockOutChannels.back(),
                latent = latent_channels(config_fields);

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
  t.conv2d("encoder.conv_out", top, 2 * latent, 3);  // mean and log-variance

  t.conv2d("decoder.conv_in", latent, top, 3);
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
  if (config_fields.is_flux2()) {
    t.conv2d("quant_conv", 2 * latent, 2 * latent, 1);
    t.conv2d("post_quant_conv", latent, latent, 1);
    // BatchNorm2d(4·latent, affine=False) over the 2x2-patchified latents: buffers only.
    t.add("bn.running_mean", {4 * latent}, Init::constant(0));
    t.add("bn.running_var", {4 * latent}, Init::constant(1));
    t.add("bn.num_batches_tracked", {}, Init::constant(0), DType::i64);
  }
  return c;
}

}  // namespace kiln::random_weights
