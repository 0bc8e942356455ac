#include "random_checkpoint/causal_lm_random.h"

#include "core/error.h"
#include "models/llm/causal_lm_text_encoder.h"
#include "random_checkpoint/model_reads.h"

namespace kiln::random_weights {

CausalLmRandomConfig CausalLmRandomConfig::mistral_small_3_2() { return {}; }

CausalLmRandomConfig CausalLmRandomConfig::qwen3_4b() {
  return {"qwen3", 151936, 2560, 9728, 36, 32, 8, 128, 1e-6, 1e6, 40960, true};
}

CausalLmRandomConfig CausalLmRandomConfig::qwen3_8b() {
  return {"qwen3", 151936, 4096, 12288, 36, 32, 8, 128, 1e-6, 1e6, 40960, false};
}

// [VERIFY] some fields (transformers_version, the token ids, Qwen3's
// max_position_embeddings / max_window_layers, the vision tower's intermediate_size and head_dim)
// are those of the published Mistral-Small-3.x and Qwen3 configs as remembered, not read from the
// FLUX.2 repositories. kiln reads none of them.
nlohmann::json causal_lm_config(const CausalLmRandomConfig& c, DType dtype) {
  if (c.qwen3()) {
    return {
        {"architectures", {"Qwen3ForCausalLM"}},
        {"attention_bias", false},
        {"attention_dropout", 0.0},
        {"bos_token_id", 151643},
        {"eos_token_id", 151645},
        {"head_dim", c.head_dim},
        {"hidden_act", "silu"},
        {"hidden_size", c.hidden_size},
        {"initializer_range", 0.02},
        {"intermediate_size", c.intermediate_size},
        {"max_position_embeddings", c.max_position_embeddings},
        {"max_window_layers", c.num_hidden_layers},
        {"model_type", "qwen3"},
        {"num_attention_heads", c.num_attention_heads},
        {"num_hidden_layers", c.num_hidden_layers},
        {"num_key_value_heads", c.num_key_value_heads},
        {"rms_norm_eps", c.rms_norm_eps},
        {"rope_scaling", nullptr},
        {"rope_theta", c.rope_theta},
        {"sliding_window", nullptr},
        {"tie_word_embeddings", c.tie_word_embeddings},
        {"torch_dtype", torch_dtype_name(dtype)},
        {"transformers_version", "4.51.0"},
        {"use_cache", true},
        {"use_sliding_window", false},
        {"vocab_size", c.vocab_size},
    };
  }
  const nlohmann::json text_config = {
      {"attention_dropout", 0.0},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", c.hidden_size},
      {"initializer_range", 0.02},
      {"intermediate_size", c.intermediate_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"model_type", "mistral"},
      {"num_attention_heads", c.num_attention_heads},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_key_value_heads", c.num_key_value_heads},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"sliding_window", nullptr},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"use_cache", true},
      {"vocab_size", c.vocab_size},
  };
  const nlohmann::json vision_config = {
      {"attention_dropout", 0.0}, {"head_dim", 64},          {"hidden_act", "silu"},
      {"hidden_size", 1024},      {"image_size", 1540},      {"initializer_range", 0.02},
      {"intermediate_size", 4096}, {"model_type", "pixtral"}, {"num_attention_heads", 16},
      {"num_channels", 3},        {"num_hidden_layers", 24}, {"patch_size", 14},
      {"rope_theta", 10000.0},
  };
  return {
      {"architectures", {"Mistral3ForConditionalGeneration"}},
      {"image_token_index", 10},
      {"model_type", "mistral3"},
      {"multimodal_projector_bias", false},
      {"projector_hidden_act", "gelu"},
      {"spatial_merge_size", 2},
      {"text_config", text_config},
      {"torch_dtype", torch_dtype_name(dtype)},
      {"transformers_version", "4.52.0.dev0"},
      {"vision_config", vision_config},
      {"vision_feature_layer", -1},
  };
}

RandomComponent causal_lm_random(const CausalLmRandomConfig& c, DType dtype) {
  KILN_CHECK(c.num_hidden_layers >= 1, "make-random", "the text encoder needs at least 1 layer, got ",
             c.num_hidden_layers);
  RandomComponent out{"text_encoder", causal_lm_config(c, dtype), "model", kTransformersShardBytes, {}};
  // Two residual branches a layer; RMSNorm before each branch and (Qwen3) on q and k keep the
  // attention scores O(1) too. The key prefix is the transformers version's module tree.
  ReadRules rules;
  rules.present = {c.key_prefix() + "embed_tokens.weight"};
  rules.gains = residual_gains({"self_attn.o_proj", "mlp.down_proj"}, 2 * c.num_hidden_layers);
  out.tensors = tensors_read_by<CausalLMTextEncoder, DecoderLMConfig>(out, rules);
  return out;
}

}  // namespace kiln::random_weights
