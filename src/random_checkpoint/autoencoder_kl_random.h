// The VAE of FLUX.1 and SD3 (Diffusers AutoencoderKL, 16 latent channels; the same architecture
// and tensors, different latent scaling) as a random benchmark component (kiln make-random): a
// Hub-style vae/config.json and every state-dict tensor, encoder and decoder (244 tensors,
// 83,819,683 parameters). FLUX.2's AutoencoderKLFlux2 is the same network with 32 latent
// channels plus quant_conv, post_quant_conv and the latent
// BatchNorm's buffers bn.running_mean / running_var (mean 0, variance 1: the pipeline's latent
// normalisation is then the identity) and bn.num_batches_tracked (int64 0).
#pragma once
#include <string>

#include "random_checkpoint/random_component.h"

namespace kiln::random_weights {

// The config.json fields that differ between the checkpoints.
struct AutoencoderKlRandomConfig {
  double scaling_factor = 0.3611;
  double shift_factor = 0.1159;
  std::string diffusers_version = "0.30.0.dev0";
  std::string name_or_path = "../checkpoints/flux-dev";  // "" writes no _name_or_path
  std::string class_name = "AutoencoderKL";              // or "AutoencoderKLFlux2"

  // FLUX.1-schnell / -dev (the Hub's file).
  static AutoencoderKlRandomConfig flux1();
  // SD3.0 / 3.5 Medium (scaling_factor 1.5305, shift_factor 0.0609).
  static AutoencoderKlRandomConfig sd3();
  // FLUX.2-dev / klein (AutoencoderKLFlux2: no scaling or shift factor).
  static AutoencoderKlRandomConfig flux2();
  bool is_flux2() const { return class_name == "AutoencoderKLFlux2"; }
};

RandomComponent autoencoder_kl_random(const AutoencoderKlRandomConfig& config);
RandomComponent autoencoder_kl_random();  // FLUX.1's

}  // namespace kiln::random_weights
