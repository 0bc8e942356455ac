// FLUX.2's transformer in Black Forest Labs' original key names (flux2-dev.safetensors,
// klein; ComfyUI files add "model.diffusion_model."), as a key map to the Diffusers names
// Flux2Transformer2DModel reads (io/key_map.h). The rules follow Diffusers'
// convert_flux2_transformer_checkpoint_to_diffusers (loaders/single_file_utils.py). FLUX.2 has
// no biases; its single blocks keep the fused to_qkv_mlp_proj whole.
#pragma once
#include "io/key_map.h"

namespace kiln {

// The rules in order; original_key_map (models/transformer_families.h) names them as the layout.
std::vector<io::KeyRule> flux2_original_key_rules();

}  // namespace kiln
