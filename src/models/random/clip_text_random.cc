#include "models/random/clip_text_random.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace kiln::random_weights {

namespace {

constexpr int64_t kVocab = 49408, kPositions = 77;

// text_encoder/config.json as transformers 4.43.3 saves it (FLUX.1's is the Hub's file,
// openai/clip-vit-large-patch14's text tower; eos_token_id 2 is the legacy value).
// SD3's towers differ in the architecture, the sizes and hidden_act.
nlohmann::json config(const ClipTextRandomConfig& c, DType dtype) {
  return {
      {"_name_or_path", c.name_or_path},
      {"architectures", {c.with_projection ? "CLIPTextModelWithProjection" : "CLIPTextModel"}},
      {"attention_dropout", 0.0},
      {"bos_token_id", 0},
      {"dropout", 0.0},
      {"eos_token_id", 2},
      {"hidden_act", c.hidden_act},
      {"hidden_size", c.hidden_size},
      {"initializer_factor", 1.0},
      {"initializer_range", 0.02},
      {"intermediate_size", c.intermediate_size},
      {"layer_norm_eps", 1e-05},
      {"max_position_embeddings", kPositions},
      {"model_type", "clip_text_model"},
      {"num_attention_heads", c.num_attention_heads},
      {"num_hidden_layers", c.num_hidden_layers},
      {"pad_token_id", 1},
      {"projection_dim", c.projection_dim},
      {"torch_dtype", torch_dtype_name(dtype)},
      {"transformers_version", "4.43.3"},
      {"vocab_size", kVocab},
  };
}

}  // namespace

ClipTextRandomConfig ClipTextRandomConfig::flux1_clip_l() { return {}; }

ClipTextRandomConfig ClipTextRandomConfig::sd3_clip_l() {
  ClipTextRandomConfig c;
  c.with_projection = true;
  return c;
}

ClipTextRandomConfig ClipTextRandomConfig::sd3_clip_g() {
  ClipTextRandomConfig c;
  c.folder = "text_encoder_2";
  c.name_or_path = "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k";
  c.hidden_size = 1280;
  c.intermediate_size = 5120;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 20;
  c.hidden_act = "gelu";
  c.projection_dim = 1280;
  c.with_projection = true;
  return c;
}

RandomComponent clip_text_random(const ClipTextRandomConfig& cfg, DType dtype) {
  RandomComponent c{cfg.folder, config(cfg, dtype), "model", kTransformersShardBytes, {}};
  TensorList t(c.tensors);
  const int64_t E = cfg.hidden_size, I = cfg.intermediate_size;
  // two residual branches a layer
  const double residual = 1 / std::sqrt(double(std::max<int64_t>(1, 2 * cfg.num_hidden_layers)));
  t.embedding("text_model.embeddings.token_embedding", kVocab, E, 1.0);
  t.embedding("text_model.embeddings.position_embedding", kPositions, E, 1.0);
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    const std::string b = "text_model.encoder.layers." + std::to_string(i) + ".";
    for (const char* n : {"k_proj", "v_proj", "q_proj"}) t.linear(b + "self_attn." + n, E, E);
    t.linear(b + "self_attn.out_proj", E, E, true, residual);
    t.norm(b + "layer_norm1", E, true);
    t.linear(b + "mlp.fc1", E, I);
    t.linear(b + "mlp.fc2", I, E, true, residual);
    t.norm(b + "layer_norm2", E, true);
  }
  t.norm("text_model.final_layer_norm", E, true);
  if (cfg.with_projection) t.linear("text_projection", E, cfg.projection_dim, /*bias=*/false);
  return c;
}

RandomComponent clip_text_random(DType dtype) { return clip_text_random(ClipTextRandomConfig::flux1_clip_l(), dtype); }

}  // namespace kiln::random_weights
