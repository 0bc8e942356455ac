// FLUX.1's FluxTransformer2DModel as a random benchmark component (kiln make-random): the Hub's
// transformer/config.json and every state-dict tensor at the real widths
// (3072 = 24 heads x 128), with the block counts given.
#pragma once
#include <cstdint>

#include "random_checkpoint/flux1_variant.h"
#include "random_checkpoint/random_component.h"

namespace kiln::random_weights {

// `num_layers` double-stream and `num_single_layers` single-stream blocks (FLUX.1: 19 and 38).
RandomComponent flux_transformer_random(Flux1Variant variant, int64_t num_layers, int64_t num_single_layers);

}  // namespace kiln::random_weights
