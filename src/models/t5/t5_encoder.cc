#include "models/t5/t5_encoder.h"

#include <cmath>

#include "core/error.h"
#include "io/config_fields.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "nn/activations.h"

namespace kiln {

namespace {

constexpr const char* kWhere = "t5_encoder";

}  // namespace

T5EncoderModel::Config T5EncoderModel::Config::from_json(const io::JsonConfig& json) {
  Config c;
  io::read_fields(json, {{"vocab_size", c.vocab_size}, {"d_model", c.d_model}, {"d_kv", c.d_kv}, {"d_ff", c.d_ff},
                         {"num_layers", c.num_layers}, {"num_heads", c.num_heads},
                         {"relative_attention_num_buckets", c.relative_attention_num_buckets},
                         {"relative_attention_max_distance", c.relative_attention_max_distance},
                         {"layer_norm_epsilon", c.layer_norm_epsilon}, {"feed_forward_proj", c.feed_forward_proj}});

  // T5Config: "gated-X" or "X"; anything else is rejected, as transformers does.
  const std::string& ffp = c.feed_forward_proj;
  const bool gated = ffp.rfind("gated-", 0) == 0;
  const std::string act = gated ? ffp.substr(6) : ffp;
  KILN_CHECK(!act.empty() && act.find('-') == std::string::npos, kWhere, json.source(),
             ": field 'feed_forward_proj' is '", ffp, "', expected 'X' or 'gated-X' (e.g. 'relu', 'gated-gelu')");
  c.is_gated_act = gated;
  c.dense_act_fn = ffp == "gated-gelu" ? "gelu_new" : act;  // transformers' backward-compatible mapping
  c.is_gated_act = json.get_bool("is_gated_act", c.is_gated_act);
  c.dense_act_fn = json.get_string("dense_act_fn", c.dense_act_fn);

  for (auto [name, v] : {std::pair{"vocab_size", c.vocab_size}, {"d_model", c.d_model}, {"d_kv", c.d_kv},
                         {"d_ff", c.d_ff}, {"num_heads", c.num_heads}})
    KILN_CHECK(v > 0, kWhere, json.source(), ": field '", name, "' must be positive, got ", v);
  KILN_CHECK(c.num_layers >= 1, kWhere, json.source(), ": field 'num_layers' must be >= 1 (block 0 holds the ",
             "position bias), got ", c.num_layers);
  // Half the buckets per direction, half of those exact: fewer than 4 leaves no exact range
  // and the log branch would divide by zero.
  KILN_CHECK(c.relative_attention_num_buckets >= 4, kWhere, json.source(),
             ": field 'relative_attention_num_buckets' must be >= 4, got ", c.relative_attention_num_buckets);
  KILN_CHECK(c.relative_attention_max_distance > c.relative_attention_num_buckets / 4, kWhere, json.source(),
             ": field 'relative_attention_max_distance' (", c.relative_attention_max_distance,
             ") must exceed relative_attention_num_buckets / 4");
  KILN_CHECK(nn::is_known_activation(c.dense_act_fn), kWhere, json.source(), ": activation '", c.dense_act_fn,
             "' (from feed_forward_proj '", ffp, "') is not supported");
  return c;
}

T5EncoderModel T5EncoderModel::from_pretrained(const std::filesystem::path& dir, std::optional<DType> dtype) {
  return T5EncoderModel(Config::from_json(io::JsonConfig(dir / "config.json")), nn::Weights(dir).with_dtype(dtype));
}

T5EncoderModel::T5EncoderModel(const Config& config, const nn::Weights& weights) : config_(config) {
  const int64_t M = config.d_model, I = config.num_heads * config.d_kv, F = config.d_ff;
  // encoder.embed_tokens is tied to shared; a file may hold either name.
  shared_ = nn::Embedding(weights.has("shared.weight") || !weights.has("encoder.embed_tokens.weight")
                              ? weights.sub("shared")
                              : weights.sub("encoder.embed_tokens"),
                          config.vocab_size, M);
  const nn::Weights enc = weights.sub("encoder");
  relative_attention_bias_ = enc.sub("block.0.layer.0.SelfAttention.relative_attention_bias")
                                 .get("weight", {config.relative_attention_num_buckets, config.num_heads});
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const nn::Weights w = enc.sub("block", i);
    const nn::Weights attn = w.sub("layer.0.SelfAttention"), ff = w.sub("layer.1.DenseReluDense");
    Block b;
    b.attn_norm = nn::RMSNorm(w.sub("layer.0.layer_norm"), M, config.layer_norm_epsilon);
    b.q = nn::Linear(attn.sub("q"), M, I, false);
    b.k = nn::Linear(attn.sub("k"), M, I, false);
    b.v = nn::Linear(attn.sub("v"), M, I, false);
    b.o = nn::Linear(attn.sub("o"), I, M, false);
    b.ff_norm = nn::RMSNorm(w.sub("layer.1.layer_norm"), M, config.layer_norm_epsilon);
    if (config.is_gated_act) {
      b.wi_0 = nn::Linear(ff.sub("wi_0"), M, F, false);
      b.wi_1 = nn::Linear(ff.sub("wi_1"), M, F, false);
    } else {
      b.wi = nn::Linear(ff.sub("wi"), M, F, false);
    }
    b.wo = nn::Linear(ff.sub("wo"), F, M, false);
    blocks_.push_back(std::move(b));
  }
  final_layer_norm_ = nn::RMSNorm(enc.sub("final_layer_norm"), M, config.layer_norm_epsilon);
}

int64_t T5EncoderModel::relative_position_bucket(int64_t rel, int64_t num_buckets, int64_t max_distance) {
  const int64_t nb = num_buckets / 2;  // per direction (bidirectional encoder)
  int64_t bucket = rel > 0 ? nb : 0;
  const int64_t a = rel < 0 ? -rel : rel;
  const int64_t max_exact = nb / 2;
  if (a < max_exact) return bucket + a;  // select the branch first: the log branch is -inf at a = 0
  // transformers: log(fp32(a) / max_exact) / math.log(max_distance / max_exact) * (nb - max_exact),
  // in fp32, truncated toward zero.
  const float ratio = float(a) / float(max_exact);
  const float scaled = std::log(ratio) / float(std::log(double(max_distance) / double(max_exact))) *
                       float(nb - max_exact);
  const int64_t large = max_exact + int64_t(scaled);  // scaled >= 0: a >= max_exact
  return bucket + std::min(large, nb - 1);
}

Tensor T5EncoderModel::position_bias(int64_t length) const {
  // The bucket table is integers, built on the host; the lookup is a gather of block 0's table.
  std::vector<int64_t> buckets(static_cast<size_t>(length * length));
  for (int64_t q = 0; q < length; ++q)
    for (int64_t k = 0; k < length; ++k)
      buckets[size_t(q * length + k)] = relative_position_bucket(k - q, config_.relative_attention_num_buckets,
                                                                 config_.relative_attention_max_distance);
  // In f32 (the table's values exactly): attention reads an f32 mask in place, where a narrower
  // one would be widened into a copy on every call.
  const Tensor table = gather(cast(relative_attention_bias_, DType::f32), from_ints(buckets, {length, length}));
  return contiguous(unsqueeze(permute(table, {2, 0, 1}), 0));  // [L, L, H] -> [1, H, L, L]
}

Tensor T5EncoderModel::feed_forward(const Block& b, const Tensor& x) const {
  if (config_.is_gated_act) return b.wo(mul(nn::activation(config_.dense_act_fn, b.wi_0(x)), b.wi_1(x)));
  return b.wo(nn::activation(config_.dense_act_fn, b.wi(x)));
}

T5EncoderModel::Output T5EncoderModel::forward(const Tensor& input_ids, bool output_hidden_states) const {
  KILN_CHECK(input_ids.defined() && input_ids.rank() == 2, kWhere, "input_ids must be [batch, length], got ",
             input_ids.defined() ? to_string(input_ids.shape()) : std::string("an empty tensor"));
  KILN_CHECK(input_ids.dtype() == DType::i64 || input_ids.dtype() == DType::i32, kWhere,
             "input_ids must be i64 or i32, got ", dtype_name(input_ids.dtype()));
  const int64_t B = input_ids.dim(0), L = input_ids.dim(1), H = config_.num_heads, Dk = config_.d_kv;
  KILN_CHECK(L >= 1, kWhere, "input_ids has no tokens");

  Output out;
  Tensor h = shared_(input_ids);  // no sqrt(d_model) scaling in T5
  const Tensor bias = position_bias(L);
  auto heads = [&](const Tensor& t) { return permute(reshape(t, {B, L, H, Dk}), {0, 2, 1, 3}); };
  for (const Block& b : blocks_) {
    // transformers records each block's input; the last entry is the final-normed state.
    if (output_hidden_states) out.hidden_states.push_back(h);
    const Tensor n = b.attn_norm(h);
    // T5 scores are unscaled dot products (scale 1) plus the shared position bias.
    const Tensor a = scaled_dot_product_attention(heads(b.q(n)), heads(b.k(n)), heads(b.v(n)), bias, 1.0);
    h = add(h, b.o(reshape(permute(a, {0, 2, 1, 3}), {B, L, H * Dk})));
    h = add(h, feed_forward(b, b.ff_norm(h)));
  }
  out.last_hidden_state = final_layer_norm_(h);
  if (output_hidden_states) out.hidden_states.push_back(out.last_hidden_state);
  return out;
}

}  // namespace kiln
