// The SD3 / SD3.5 Medium transformer (Diffusers SD3Transformer2DModel) as a random benchmark
// component (kiln make-random): a Hub-style transformer/config.json and every
// state-dict tensor at the real widths (D = 1536 = 24 heads x 64, joint 4096, pooled
// 2048, patch 2, 16 channels), with the block count given.
//
// Blocks: the first N blocks of the real model, except that the last one is always Diffusers'
// context_pre_only block (norm1_context.linear [2D, D], no attn.to_add_out, no ff_context), as
// Diffusers builds block num_layers - 1. sd3.5-medium's dual-attention blocks are those of 0..12
// below N (so with N <= 13 every block, the last included, has attn2 and the 9-way norm1).
//
// pos_embed.pos_embed [1, M², D] (M = pos_embed_max_size: 384 for 3.5 Medium, 192 for 3.0) holds
// Diffusers' sincos formula (Init::sincos_2d), not random values: the table the
// checkpoint is believed to store, identical for every seed.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "random_checkpoint/random_component.h"
#include "random_checkpoint/sd3_variant.h"

namespace kiln::random_weights {

// The blocks with MMDiT-X dual attention among the first `num_layers` (sd3-medium: none).
std::vector<int64_t> sd3_dual_attention_layers(Sd3Variant variant, int64_t num_layers);
// transformer/config.json with `num_layers` blocks.
nlohmann::json sd3_transformer_config(Sd3Variant variant, int64_t num_layers);
// `num_layers` >= 1 blocks (both Medium models: 24).
RandomComponent sd3_transformer_random(Sd3Variant variant, int64_t num_layers);

}  // namespace kiln::random_weights
