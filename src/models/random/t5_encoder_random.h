// FLUX.1's text_encoder_2, the T5 v1.1 XXL encoder (transformers T5EncoderModel), as a random
// benchmark component (kiln make-random): the Hub's config.json and every state-dict tensor of
// spec flux1.md §4.2 at the real widths (d_model 4096, 64 heads x 64, d_ff 10240, vocabulary
// 32128), with `num_layers` blocks (FLUX.1: 24).
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "models/random/random_component.h"

namespace kiln::random_weights {

// `dtype` is recorded as the config's torch_dtype.
RandomComponent t5_encoder_random(int64_t num_layers, DType dtype);

}  // namespace kiln::random_weights
