#include "models/random/clip_text_random.h"

#include <cmath>
#include <string>

namespace kiln::random_weights {

namespace {

constexpr int64_t kVocab = 49408, kPositions = 77, kHidden = 768, kIntermediate = 3072, kLayers = 12, kHeads = 12;

// text_encoder/config.json of the Hub (openai/clip-vit-large-patch14's text tower saved by
// transformers 4.43.3; eos_token_id 2 is the legacy value, spec §4.1).
nlohmann::json config(DType dtype) {
  return {
      {"_name_or_path", "openai/clip-vit-large-patch14"},
      {"architectures", {"CLIPTextModel"}},
      {"attention_dropout", 0.0},
      {"bos_token_id", 0},
      {"dropout", 0.0},
      {"eos_token_id", 2},
      {"hidden_act", "quick_gelu"},
      {"hidden_size", kHidden},
      {"initializer_factor", 1.0},
      {"initializer_range", 0.02},
      {"intermediate_size", kIntermediate},
      {"layer_norm_eps", 1e-05},
      {"max_position_embeddings", kPositions},
      {"model_type", "clip_text_model"},
      {"num_attention_heads", kHeads},
      {"num_hidden_layers", kLayers},
      {"pad_token_id", 1},
      {"projection_dim", 768},
      {"torch_dtype", torch_dtype_name(dtype)},
      {"transformers_version", "4.43.3"},
      {"vocab_size", kVocab},
  };
}

}  // namespace

RandomComponent clip_text_random(DType dtype) {
  RandomComponent c{"text_encoder", config(dtype), "model", kTransformersShardBytes, {}};
  TensorList t(c.tensors);
  const double residual = 1 / std::sqrt(double(2 * kLayers));  // two residual branches a layer
  t.embedding("text_model.embeddings.token_embedding", kVocab, kHidden, 1.0);
  t.embedding("text_model.embeddings.position_embedding", kPositions, kHidden, 1.0);
  for (int64_t i = 0; i < kLayers; ++i) {
    const std::string b = "text_model.encoder.layers." + std::to_string(i) + ".";
    for (const char* n : {"k_proj", "v_proj", "q_proj"}) t.linear(b + "self_attn." + n, kHidden, kHidden);
    t.linear(b + "self_attn.out_proj", kHidden, kHidden, true, residual);
    t.norm(b + "layer_norm1", kHidden, true);
    t.linear(b + "mlp.fc1", kHidden, kIntermediate);
    t.linear(b + "mlp.fc2", kIntermediate, kHidden, true, residual);
    t.norm(b + "layer_norm2", kHidden, true);
  }
  t.norm("text_model.final_layer_norm", kHidden, true);
  return c;
}

}  // namespace kiln::random_weights
