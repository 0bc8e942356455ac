#include "random_checkpoint/autoencoder_kl_random.h"

#include <string>
#include <vector>

#include "models/vae/autoencoder_kl.h"
#include "random_checkpoint/model_reads.h"

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
  ReadRules rules;
  rules.present = {"encoder.conv_in.weight"};  // the pipelines decode only, but the Hub's files hold the encoder
  // BatchNorm2d's step count (AutoencoderKLFlux2's latent statistics), which no forward reads.
  if (config_fields.is_flux2()) rules.unread = {{"bn.num_batches_tracked", {}, Init::constant(0), DType::i64}};
  c.tensors = tensors_read_by<AutoencoderKL, VaeConfig>(c, rules);
  return c;
}

}  // namespace kiln::random_weights
