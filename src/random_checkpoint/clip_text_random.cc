#include "random_checkpoint/clip_text_random.h"

#include <string>

#include "models/clip/clip_text_model.h"
#include "random_checkpoint/model_reads.h"

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
  ReadRules rules;  // two residual branches a layer
  rules.gains = residual_gains({"self_attn.out_proj", "mlp.fc2"}, 2 * cfg.num_hidden_layers);
  c.tensors = tensors_read_by<ClipTextModel, ClipTextModel::Config>(c, rules);
  return c;
}

RandomComponent clip_text_random(DType dtype) { return clip_text_random(ClipTextRandomConfig::flux1_clip_l(), dtype); }

}  // namespace kiln::random_weights
