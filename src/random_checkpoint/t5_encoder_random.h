// The T5 v1.1 XXL encoder (transformers T5EncoderModel) of FLUX.1 (text_encoder_2) and SD3
// (text_encoder_3) as a random benchmark component (kiln make-random): the Hub's config.json
// (FLUX.1's) and every state-dict tensor at the real widths
// (d_model 4096, 64 heads x 64, d_ff 10240, vocabulary 32128), with `num_layers` blocks (both: 24).
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "random_checkpoint/random_component.h"

namespace kiln::random_weights {

// `dtype` is recorded as the config's torch_dtype; `folder` is the component's folder.
RandomComponent t5_encoder_random(int64_t num_layers, DType dtype, const std::string& folder = "text_encoder_2");

}  // namespace kiln::random_weights
