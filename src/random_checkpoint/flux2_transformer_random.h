// FLUX.2's Flux2Transformer2DModel as a random benchmark component (kiln make-random): the Hub's
// transformer/config.json and every state-dict tensor (no biases;
// LayerNorms without parameters; q/k RMSNorm scales of 128), with the widths and depths given.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "random_checkpoint/flux2_variant.h"
#include "random_checkpoint/random_component.h"

namespace kiln::random_weights {

// The config.json fields that differ between the checkpoints (the rest are the class defaults
// every FLUX.2 checkpoint uses: patch 1, 128 input channels, head_dim 128 = 4 RoPE axes of 32,
// timestep/guidance channels 256, mlp_ratio 3, rope_theta 2000, eps 1e-6).
struct Flux2TransformerRandomConfig {
  int64_t num_layers = 8;  // double-stream blocks
  int64_t num_single_layers = 48;
  int64_t num_attention_heads = 48;  // D = heads x 128
  int64_t joint_attention_dim = 15360;  // 3 x the text encoder's hidden size
  bool guidance_embeds = true;
  // FLUX.2-dev's file predates the field (absent reads as true); klein's says false.
  bool writes_guidance_embeds = false;
  std::string diffusers_version = "0.36.0.dev0";

  static Flux2TransformerRandomConfig for_variant(Flux2Variant v);
  int64_t inner_dim() const;
  int64_t mlp_hidden() const;  // F = int(D x 3.0)
};

nlohmann::json flux2_transformer_config(const Flux2TransformerRandomConfig& config);
RandomComponent flux2_transformer_random(const Flux2TransformerRandomConfig& config);

}  // namespace kiln::random_weights
