#include "random_checkpoint/t5_encoder_random.h"

#include <cmath>
#include <string>

#include "models/t5/t5_encoder.h"
#include "random_checkpoint/model_reads.h"

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
  ReadRules rules;
  rules.gains = residual_gains({"SelfAttention.o", "DenseReluDense.wo"}, 2 * num_layers);  // two branches a block
  // T5 does not divide the scores by sqrt(d_kv): q carries that factor, so scores stay O(1).
  rules.gains.emplace_back("SelfAttention.q", 1 / std::sqrt(double(kHeadDim)));
  // Small next to the O(1) scores, so position only nudges attention.
  rules.inits = {{"relative_attention_bias.weight", Init::uniform(0.1)}};
  c.tensors = tensors_read_by<T5EncoderModel, T5EncoderModel::Config>(c, rules);
  return c;
}

}  // namespace kiln::random_weights
