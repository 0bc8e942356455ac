// The CLIP text towers of FLUX.1 and SD3 (transformers CLIPTextModel / CLIPTextModelWithProjection)
// as random benchmark components (kiln make-random): a Hub-style config.json and every
// state-dict tensor at the real widths.
//   FLUX.1's text_encoder: CLIP ViT-L/14, 768 wide, 12 layers, 12 heads, MLP 3072, quick_gelu.
//   SD3's text_encoder:    the same tower with text_projection [768, 768] (no bias).
//   SD3's text_encoder_2:  OpenCLIP ViT-bigG/14, 1280 wide, 32 layers, 20 heads, MLP 5120, gelu,
//                          text_projection [1280, 1280].
// Every tower has the vocabulary 49408 and 77 positions.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "random_checkpoint/random_component.h"

namespace kiln::random_weights {

struct ClipTextRandomConfig {
  std::string folder = "text_encoder";
  std::string name_or_path = "openai/clip-vit-large-patch14";  // config.json's _name_or_path
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  std::string hidden_act = "quick_gelu";
  int64_t projection_dim = 768;
  // CLIPTextModelWithProjection: architectures says so and text_projection.weight
  // [projection_dim, hidden_size] is written.
  bool with_projection = false;

  // FLUX.1's text_encoder (CLIPTextModel).
  static ClipTextRandomConfig flux1_clip_l();
  // SD3's text_encoder (CLIP-L with projection) and text_encoder_2 (CLIP-G with projection).
  static ClipTextRandomConfig sd3_clip_l();
  static ClipTextRandomConfig sd3_clip_g();
};

// `dtype` is recorded as the config's torch_dtype.
RandomComponent clip_text_random(const ClipTextRandomConfig& config, DType dtype);
// FLUX.1's text_encoder.
RandomComponent clip_text_random(DType dtype);

}  // namespace kiln::random_weights
