// The language-model text encoders of FLUX.2 as random benchmark components (kiln make-random),
// the models kiln's CausalLMTextEncoder loads:
//   FLUX.2-dev:     Mistral3ForConditionalGeneration (Mistral Small 3.2 24B): a Mistral3
//                   config.json with the language model in text_config (hidden 5120, 40 layers,
//                   32 / 8 heads of 128, MLP 32768, vocabulary 131072) and its vision tower's
//                   config; keys under `model.language_model.`.
//   FLUX.2 [klein]: Qwen3ForCausalLM, Qwen3-4B (hidden 2560, 36 layers, 32 / 8 heads of 128, MLP
//                   9728, tied embeddings) or Qwen3-8B (4096, 36 layers, MLP 12288); keys under
//                   `model.`, with q_norm / k_norm.
// Written: the embedding table, the decoder layers and the final norm, which is all a FLUX.2
// pipeline can read. Not written: lm_head (never read; the 4B ties it to the embedding anyway)
// and the Mistral3 vision tower and projector (unused for text-to-image), so transformers would
// initialise those at load.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "random_checkpoint/random_component.h"

namespace kiln::random_weights {

struct CausalLmRandomConfig {
  // "mistral3" (a Mistral language model inside Mistral3ForConditionalGeneration) or "qwen3".
  std::string model_type = "mistral3";
  int64_t vocab_size = 131072;
  int64_t hidden_size = 5120;
  int64_t intermediate_size = 32768;
  int64_t num_hidden_layers = 40;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 8;
  int64_t head_dim = 128;
  double rms_norm_eps = 1e-5;
  double rope_theta = 1e9;
  int64_t max_position_embeddings = 131072;
  bool tie_word_embeddings = false;

  static CausalLmRandomConfig mistral_small_3_2();  // FLUX.2-dev's
  static CausalLmRandomConfig qwen3_4b();           // FLUX.2 [klein] 4B's
  static CausalLmRandomConfig qwen3_8b();           // FLUX.2 [klein] 9B's
  bool qwen3() const { return model_type == "qwen3"; }
  // The language model's key prefix: "model.language_model." or "model.".
  std::string key_prefix() const { return qwen3() ? "model." : "model.language_model."; }
};

// text_encoder/config.json; `dtype` is recorded as torch_dtype.
nlohmann::json causal_lm_config(const CausalLmRandomConfig& config, DType dtype);
// The text_encoder component (transformers' 5 GB shards, "model-0000N-of-0000M.safetensors").
RandomComponent causal_lm_random(const CausalLmRandomConfig& config, DType dtype);

}  // namespace kiln::random_weights
