// FLUX.1's transformer in Black Forest Labs' original key names (flux1-dev.safetensors,
// flux1-schnell.safetensors; ComfyUI files add "model.diffusion_model."), as a key map to the
// Diffusers names FluxTransformer2DModel reads (io/key_map.h). The rules follow Diffusers'
// convert_flux_transformer_checkpoint_to_diffusers (loaders/single_file_utils.py).
#pragma once
#include "io/key_map.h"

namespace kiln {

// The rules in order; original_key_map (models/transformer_families.h) names them as the layout.
std::vector<io::KeyRule> flux1_original_key_rules();

}  // namespace kiln
