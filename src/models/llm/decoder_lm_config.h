// The config of the decoder-only language models FLUX.2 takes its prompt embeddings from:
// Mistral (FLUX.2-dev's Mistral3ForConditionalGeneration, whose language
// model is its `text_config`) and Qwen3 (FLUX.2 [klein]'s Qwen3ForCausalLM). The two share one
// layer structure; Qwen3 adds a per-head RMSNorm on q and k (q_norm / k_norm).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "io/json_config.h"

namespace kiln {

struct DecoderLMConfig {
  // The language model's model_type: "mistral" or "qwen3" (decides q_norm/k_norm).
  std::string model_type = "mistral";
  // config.json's top-level model_type: "mistral3" (the language model is under text_config, next
  // to a vision tower and projector), "mistral" or "qwen3".
  std::string checkpoint_model_type = "mistral";
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 14336;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 8;
  int64_t head_dim = 128;  // null or absent (Mistral): hidden_size / num_attention_heads
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  // Mistral's sliding window (null: none). Keys further than this behind a query are masked.
  std::optional<int64_t> sliding_window;
  bool attention_bias = false;  // Qwen3's q/k/v/o biases (false in every released checkpoint)

  bool qk_norm() const { return model_type == "qwen3"; }
  bool multimodal() const { return checkpoint_model_type == "mistral3"; }

  // Reads a text_encoder/config.json: fields absent (or null) take the defaults of transformers'
  // MistralConfig / Qwen3Config (a Mistral3 config without text_config: Mistral3Config's default
  // language model). Errors name the file and the field: an unknown model_type or architecture,
  // rope scaling other than "default", Qwen3's sliding window, sizes that do not agree.
  static DecoderLMConfig from_json(const io::JsonConfig& json);
  // Checks the sizes agree (heads divisible by KV heads, positive widths); errors name `source`.
  void validate(const std::string& source) const;
};

}  // namespace kiln
