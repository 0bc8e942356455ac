// CLIPTextModel (transformers), the text tower FLUX.1 takes its pooled prompt embedding from
//, and CLIPTextModelWithProjection, the same tower with `text_projection`
// applied to the pooled output (SD3's CLIP-L and CLIP-G). Weights use the transformers state-dict names ("text_model.encoder.
// layers.0.self_attn.q_proj.weight", ...), so a Hub `text_encoder/` folder loads as is.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/json_config.h"
#include "nn/layers.h"

namespace kiln {

// Which position of each row `pooler_output` takes. The rules only differ for
// configs whose eos_token_id is not the largest id in use (the tiny test models); for the
// real FLUX CLIP both give the first <|endoftext|>.
enum class ClipPooledRule {
  // transformers since mid-2023 (and the fixtures' reference, 4.52): eos_token_id == 2 (a
  // legacy wrong value) -> argmax(ids) (first position of the largest id); otherwise the
  // first position of eos_token_id (0 if absent).
  eos2_argmax,
  // A 2025 transformers snapshot: argmax(ids) when every row's maximum id is 49407, otherwise
  // the first position of eos_token_id (0 if absent).
  max_id_49407_argmax,
};

class ClipTextModel {
 public:
  struct Config {
    int64_t vocab_size = 49408;
    int64_t hidden_size = 512;
    int64_t intermediate_size = 2048;
    int64_t num_hidden_layers = 12;
    int64_t num_attention_heads = 8;
    int64_t max_position_embeddings = 77;
    std::string hidden_act = "quick_gelu";
    double layer_norm_eps = 1e-5;
    int64_t eos_token_id = 49407;
    // CLIPTextModelWithProjection (config.json's architectures): text_projection [P, E], no bias.
    bool with_projection = false;
    int64_t projection_dim = 512;
    ClipPooledRule pooled_rule = ClipPooledRule::eos2_argmax;

    // Fields absent from the file take CLIPTextConfig's defaults (above). Checks the sizes
    // agree (hidden_size divisible by the head count) and that hidden_act is known.
    static Config from_json(const io::JsonConfig& json);
  };

  struct Output {
    Tensor last_hidden_state;           // [B, L, E], after final_layer_norm
    Tensor pooler_output;               // [B, E]
    Tensor text_embeds;                 // [B, P]: text_projection(pooler_output) (with projection only)
    std::vector<Tensor> hidden_states;  // N+1 entries: embeddings, then after each layer (no final norm)
  };

  // `dir` holds config.json and model.safetensors (or model.safetensors.index.json + shards).
  // Checkpoint keys this model leaves unread on purpose: the position_ids buffer older exports
  // carry (recomputed here).
  static std::vector<std::string> checkpoint_keys_not_loaded() { return {"text_model.embeddings.position_ids"}; }
  static ClipTextModel from_pretrained(const std::filesystem::path& dir,
                                       ClipPooledRule pooled_rule = ClipPooledRule::eos2_argmax,
                                       std::optional<DType> dtype = DType::f32);  // torch_dtype (std::nullopt: "auto", the checkpoint's)
  ClipTextModel(const Config& config, const nn::Weights& weights);  // weights at the state-dict root

  // input_ids: integer [B, L] with L <= max_position_embeddings. Reads the ids on the host
  // (for the pooled positions).
  Output forward(const Tensor& input_ids, bool output_hidden_states = false) const;
  // forward(input_ids).pooler_output alone, all FLUX.1 takes from CLIP. Attention is causal, so
  // no token after a row's pooled position changes it: only the ids up to the last row's pooled
  // position are encoded (a short prompt's ~10 tokens instead of 77). The same values within
  // rounding (the kernels see shorter rows).
  Tensor pooled_output(const Tensor& input_ids) const;
  const Config& config() const { return config_; }
  DType dtype() const { return token_embedding_.weight.dtype(); }  // torch_dtype it was loaded in

  // The position pooler_output takes in each row of ids [B, L] (row-major).
  static std::vector<int64_t> pooled_positions(const std::vector<int64_t>& ids, int64_t batch, int64_t length,
                                               int64_t eos_token_id, ClipPooledRule rule);

 private:
  struct Layer {
    nn::LayerNorm layer_norm1, layer_norm2;
    nn::Linear q_proj, k_proj, v_proj, out_proj, fc1, fc2;
  };
  Tensor attention(const Layer& layer, const Tensor& x, const Tensor& causal_mask) const;
  // input_ids' values, after checking its shape, dtype, length and ids.
  std::vector<int64_t> checked_ids(const Tensor& input_ids) const;
  // forward() on ids already checked and read to the host (`ids`, row-major [B, L]).
  Output encode(const Tensor& input_ids, const std::vector<int64_t>& ids, bool output_hidden_states) const;

  Config config_;
  nn::Embedding token_embedding_, position_embedding_;
  std::vector<Layer> layers_;
  nn::LayerNorm final_layer_norm_;
  nn::Linear text_projection_;
};

}  // namespace kiln
