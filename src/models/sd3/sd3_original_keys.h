// SD3 / SD3.5's MMDiT transformer in Stability's original key names (sd3.5_medium.safetensors,
// sd3.5_large.safetensors, whose full checkpoints put it under "model.diffusion_model."), as a
// key map to the Diffusers names SD3Transformer2DModel reads (io/key_map.h). The rules follow
// Diffusers' convert_sd3_transformer_checkpoint_to_diffusers (loaders/single_file_utils.py).
#pragma once
#include "io/key_map.h"

namespace kiln {

// The rules in order; original_key_map (models/transformer_families.h) names them as the layout.
std::vector<io::KeyRule> sd3_original_key_rules();

}  // namespace kiln
