// T5EncoderModel (transformers), FLUX.1's `text_encoder_2` (T5 v1.1 XXL).
// Weights use the transformers state-dict names ("encoder.block.0.layer.0.SelfAttention.q.
// weight", ...). T5 has no biases, no score scaling, RMS-style LayerNorms, and one relative
// position bias table (block 0's) added to the scores of every block.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/json_config.h"
#include "nn/layers.h"

namespace kiln {

class T5EncoderModel {
 public:
  struct Config {
    int64_t vocab_size = 32128;
    int64_t d_model = 512;
    int64_t d_kv = 64;
    int64_t d_ff = 2048;
    int64_t num_layers = 6;
    int64_t num_heads = 8;
    int64_t relative_attention_num_buckets = 32;
    int64_t relative_attention_max_distance = 128;
    double layer_norm_epsilon = 1e-6;
    std::string feed_forward_proj = "relu";
    // Derived from feed_forward_proj ("gated-X" -> gated with X, "gated-gelu" -> gelu_new,
    // "X" -> X) unless the file states them: T5Config lets the file's values win.
    bool is_gated_act = false;
    std::string dense_act_fn = "relu";

    // Fields absent from the file take T5Config's defaults (above).
    static Config from_json(const io::JsonConfig& json);
  };

  struct Output {
    Tensor last_hidden_state;  // [B, L, d_model], after final_layer_norm
    // num_layers+1 entries as transformers returns them: the embeddings, the input of blocks
    // 1..N-1, and last (in place of block N-1's raw output) the final-normed state.
    std::vector<Tensor> hidden_states;
  };

  // `dir` holds config.json and model.safetensors (or model.safetensors.index.json + shards).
  // Checkpoint keys this model leaves unread on purpose: the tied twin of the embedding it reads
  // (shared.weight and encoder.embed_tokens.weight are one tensor), and a decoder's weights.
  static std::vector<std::string> checkpoint_keys_not_loaded() {
    return {"shared.weight", "encoder.embed_tokens.weight", "decoder.", "lm_head."};
  }
  static T5EncoderModel from_pretrained(const std::filesystem::path& dir, std::optional<DType> dtype = DType::f32);  // torch_dtype (std::nullopt: "auto", the checkpoint's)
  T5EncoderModel(const Config& config, const nn::Weights& weights);  // weights at the state-dict root

  // input_ids: integer [B, L]; no attention mask (FLUX passes none: padding is attended to).
  Output forward(const Tensor& input_ids, bool output_hidden_states = false) const;
  const Config& config() const { return config_; }
  DType dtype() const { return shared_.weight.dtype(); }  // torch_dtype it was loaded in

  // Bidirectional relative-position bucket of (query q, key k) for rel = k - q, computed as
  // transformers does (fp32 log branch).
  static int64_t relative_position_bucket(int64_t rel, int64_t num_buckets, int64_t max_distance);
  // The additive score bias [1, H, L, L] for sequence length L (block 0's table), in f32.
  Tensor position_bias(int64_t length) const;

 private:
  struct Block {
    nn::RMSNorm attn_norm, ff_norm;  // layer.0.layer_norm, layer.1.layer_norm
    nn::Linear q, k, v, o;
    nn::Linear wi, wi_0, wi_1, wo;  // wi for the plain FFN, wi_0/wi_1 for the gated one
  };
  Tensor feed_forward(const Block& block, const Tensor& x) const;

  Config config_;
  nn::Embedding shared_;
  Tensor relative_attention_bias_;  // [num_buckets, num_heads]
  std::vector<Block> blocks_;
  nn::RMSNorm final_layer_norm_;
};

}  // namespace kiln
