#include "models/random/t5_encoder_random.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace kiln::random_weights {

namespace {

constexpr int64_t kVocab = 32128, kModel = 4096, kHeads = 64, kHeadDim = 64, kInner = kHeads * kHeadDim,
                  kFeedForward = 10240, kBuckets = 32;

// FLUX.1's text_encoder_2/config.json of the Hub (google/t5-v1_1-xxl saved by transformers 4.43.3),
// also used for SD3's text_encoder_3 (the same model).
nlohmann::json config(int64_t num_layers, DType dtype) {
  return {
      {"_name_or_path", "google/t5-v1_1-xxl"},
      {"architectures", {"T5EncoderModel"}},
      {"classifier_dropout", 0.0},
      {"d_ff", kFeedForward},
      {"d_kv", kHeadDim},
      {"d_model", kModel},
      {"decoder_start_token_id", 0},
      {"dense_act_fn", "gelu_new"},
      {"dropout_rate", 0.1},
      {"eos_token_id", 1},
      {"feed_forward_proj", "gated-gelu"},
      {"initializer_factor", 1.0},
      {"is_encoder_decoder", true},
      {"is_gated_act", true},
      {"layer_norm_epsilon", 1e-06},
      {"model_type", "t5"},
      {"num_decoder_layers", 24},
      {"num_heads", kHeads},
      {"num_layers", num_layers},
      {"output_past", true},
      {"pad_token_id", 0},
      {"relative_attention_max_distance", 128},
      {"relative_attention_num_buckets", kBuckets},
      {"tie_word_embeddings", false},
      {"torch_dtype", torch_dtype_name(dtype)},
      {"transformers_version", "4.43.3"},
      {"use_cache", true},
      {"vocab_size", kVocab},
  };
}

}  // namespace

RandomComponent t5_encoder_random(int64_t num_layers, DType dtype, const std::string& folder) {
  RandomComponent c{folder, config(num_layers, dtype), "model", kTransformersShardBytes, {}};
  TensorList t(c.tensors);
  const double residual = 1 / std::sqrt(double(std::max<int64_t>(1, 2 * num_layers)));  // two branches a block
  // transformers saves the tied embedding once, as shared.weight (encoder.embed_tokens is the same tensor).
  t.embedding("shared", kVocab, kModel, 1.0);
  for (int64_t i = 0; i < num_layers; ++i) {
    const std::string b = "encoder.block." + std::to_string(i) + ".layer.";
    // T5 does not divide the scores by sqrt(d_kv): q carries that factor, so scores stay O(1).
    t.linear(b + "0.SelfAttention.q", kModel, kInner, false, 1 / std::sqrt(double(kHeadDim)));
    t.linear(b + "0.SelfAttention.k", kModel, kInner, false);
    t.linear(b + "0.SelfAttention.v", kModel, kInner, false);
    t.linear(b + "0.SelfAttention.o", kInner, kModel, false, residual);
    // Small next to the O(1) scores, so position only nudges attention.
    if (i == 0) t.add(b + "0.SelfAttention.relative_attention_bias.weight", {kBuckets, kHeads}, Init::uniform(0.1));
    t.norm(b + "0.layer_norm", kModel, false);
    t.linear(b + "1.DenseReluDense.wi_0", kModel, kFeedForward, false);
    t.linear(b + "1.DenseReluDense.wi_1", kModel, kFeedForward, false);
    t.linear(b + "1.DenseReluDense.wo", kFeedForward, kModel, false, residual);
    t.norm(b + "1.layer_norm", kModel, false);
  }
  t.norm("encoder.final_layer_norm", kModel, false);
  return c;
}

}  // namespace kiln::random_weights
