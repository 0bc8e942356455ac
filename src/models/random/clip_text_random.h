// FLUX.1's text_encoder, the CLIP ViT-L/14 text tower (transformers CLIPTextModel), as a random
// benchmark component (kiln make-random): the Hub's config.json and every state-dict tensor of
// spec flux1.md §4.1 (768 wide, 12 layers, 12 heads, MLP 3072, vocabulary 49408).
#pragma once
#include "core/dtype.h"
#include "models/random/random_component.h"

namespace kiln::random_weights {

// `dtype` is recorded as the config's torch_dtype.
RandomComponent clip_text_random(DType dtype);

}  // namespace kiln::random_weights
