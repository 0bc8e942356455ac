// FLUX.1's VAE (Diffusers AutoencoderKL, 16 latent channels) as a random benchmark component
// (kiln make-random): the Hub's vae/config.json and every state-dict tensor of spec flux1.md §3,
// encoder and decoder (244 tensors, 83,819,683 parameters).
#pragma once
#include "models/random/random_component.h"

namespace kiln::random_weights {

RandomComponent autoencoder_kl_random();

}  // namespace kiln::random_weights
