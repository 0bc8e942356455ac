// AutoencoderKL in the original LDM key names (FLUX.1's ae.safetensors, the VAE of SD3 / SD3.5
// full checkpoints under "first_stage_model.", or "vae."), as a key map to the Diffusers names
// AutoencoderKL reads (io/key_map.h). The rules follow Diffusers' convert_ldm_vae_checkpoint
// (loaders/single_file_utils.py): resnets renamed, the decoder's up blocks numbered the other
// way, the mid-block attention's 1x1 convolutions read as linears.
#pragma once
#include "io/key_map.h"

namespace kiln {

// The rules in order; original_key_map (models/transformer_families.h) names them as the layout.
std::vector<io::KeyRule> ldm_vae_key_rules();

}  // namespace kiln
