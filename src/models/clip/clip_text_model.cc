#include "models/clip/clip_text_model.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "io/config_fields.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "nn/activations.h"

namespace kiln {

namespace {

constexpr const char* kWhere = "clip_text_model";

}  // namespace

ClipTextModel::Config ClipTextModel::Config::from_json(const io::JsonConfig& json) {
  Config c;
  io::read_fields(json, {{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                         {"intermediate_size", c.intermediate_size}, {"num_hidden_layers", c.num_hidden_layers},
                         {"num_attention_heads", c.num_attention_heads},
                         {"max_position_embeddings", c.max_position_embeddings}, {"hidden_act", c.hidden_act},
                         {"layer_norm_eps", c.layer_norm_eps}, {"eos_token_id", c.eos_token_id}});
  for (const std::string& a : json.get_string_list("architectures", {}))
    c.with_projection = c.with_projection || a == "CLIPTextModelWithProjection";
  c.projection_dim = json.get_int("projection_dim", c.projection_dim);
  for (auto [name, v] : {std::pair{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                         {"intermediate_size", c.intermediate_size}, {"num_attention_heads", c.num_attention_heads},
                         {"max_position_embeddings", c.max_position_embeddings}, {"projection_dim", c.projection_dim}})
    KILN_CHECK(v > 0, kWhere, json.source(), ": field '", name, "' must be positive, got ", v);
  KILN_CHECK(c.num_hidden_layers >= 0, kWhere, json.source(), ": field 'num_hidden_layers' must be >= 0, got ",
             c.num_hidden_layers);
  KILN_CHECK(c.hidden_size % c.num_attention_heads == 0, kWhere, json.source(), ": hidden_size ", c.hidden_size,
             " is not divisible by num_attention_heads ", c.num_attention_heads);
  KILN_CHECK(nn::is_known_activation(c.hidden_act), kWhere, json.source(), ": field 'hidden_act' is '", c.hidden_act,
             "', expected quick_gelu, gelu, gelu_new, gelu_pytorch_tanh, relu or silu");
  return c;
}

ClipTextModel ClipTextModel::from_pretrained(const std::filesystem::path& dir, ClipPooledRule pooled_rule,
                                             std::optional<DType> dtype) {
  Config config = Config::from_json(io::JsonConfig(dir / "config.json"));
  config.pooled_rule = pooled_rule;
  return ClipTextModel(config, nn::Weights(dir).with_dtype(dtype));
}

ClipTextModel::ClipTextModel(const Config& config, const nn::Weights& weights) : config_(config) {
  const int64_t E = config.hidden_size, F = config.intermediate_size;
  const nn::Weights tm = weights.sub("text_model");
  token_embedding_ = nn::Embedding(tm.sub("embeddings.token_embedding"), config.vocab_size, E);
  position_embedding_ = nn::Embedding(tm.sub("embeddings.position_embedding"), config.max_position_embeddings, E);
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const nn::Weights w = tm.sub("encoder.layers", i);
    Layer l;
    l.layer_norm1 = nn::LayerNorm(w.sub("layer_norm1"), E, config.layer_norm_eps);
    l.q_proj = nn::Linear(w.sub("self_attn.q_proj"), E, E);
    l.k_proj = nn::Linear(w.sub("self_attn.k_proj"), E, E);
    l.v_proj = nn::Linear(w.sub("self_attn.v_proj"), E, E);
    l.out_proj = nn::Linear(w.sub("self_attn.out_proj"), E, E);
    l.layer_norm2 = nn::LayerNorm(w.sub("layer_norm2"), E, config.layer_norm_eps);
    l.fc1 = nn::Linear(w.sub("mlp.fc1"), E, F);
    l.fc2 = nn::Linear(w.sub("mlp.fc2"), F, E);
    layers_.push_back(std::move(l));
  }
  final_layer_norm_ = nn::LayerNorm(tm.sub("final_layer_norm"), E, config.layer_norm_eps);
  if (config.with_projection)
    text_projection_ = nn::Linear(weights.sub("text_projection"), E, config.projection_dim, /*bias=*/false);
}

std::vector<int64_t> ClipTextModel::pooled_positions(const std::vector<int64_t>& ids, int64_t batch, int64_t length,
                                                     int64_t eos_token_id, ClipPooledRule rule) {
  KILN_CHECK(int64_t(ids.size()) == batch * length && length > 0, kWhere, "pooled_positions: ", ids.size(),
             " ids for [", batch, ", ", length, "]");
  auto row = [&](int64_t b) { return ids.begin() + b * length; };
  // argmax: the first position of the row's largest id (torch.argmax on the CPU).
  auto argmax = [&](int64_t b) { return int64_t(std::max_element(row(b), row(b) + length) - row(b)); };
  auto first_eos = [&](int64_t b) {
    const auto it = std::find(row(b), row(b) + length, eos_token_id);
    return it == row(b) + length ? int64_t(0) : int64_t(it - row(b));
  };
  bool use_argmax = false;
  if (rule == ClipPooledRule::eos2_argmax) {
    use_argmax = eos_token_id == 2;
  } else {
    use_argmax = true;
    for (int64_t b = 0; b < batch; ++b) use_argmax = use_argmax && *std::max_element(row(b), row(b) + length) == 49407;
  }
  std::vector<int64_t> pos(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) pos[size_t(b)] = use_argmax ? argmax(b) : first_eos(b);
  return pos;
}

// Multi-head self-attention with the causal mask; x is the layer_norm1 output [B, L, E].
Tensor ClipTextModel::attention(const Layer& layer, const Tensor& x, const Tensor& causal_mask) const {
  const int64_t B = x.dim(0), L = x.dim(1), H = config_.num_attention_heads, D = config_.hidden_size / H;
  auto heads = [&](const Tensor& t) { return permute(reshape(t, {B, L, H, D}), {0, 2, 1, 3}); };
  // The default sdpa scale 1/sqrt(D) is CLIP's head_dim^-0.5.
  const Tensor a = scaled_dot_product_attention(heads(layer.q_proj(x)), heads(layer.k_proj(x)),
                                                heads(layer.v_proj(x)), causal_mask);
  return layer.out_proj(reshape(permute(a, {0, 2, 1, 3}), {B, L, config_.hidden_size}));
}

std::vector<int64_t> ClipTextModel::checked_ids(const Tensor& input_ids) const {
  KILN_CHECK(input_ids.defined() && input_ids.rank() == 2, kWhere, "input_ids must be [batch, length], got ",
             input_ids.defined() ? to_string(input_ids.shape()) : std::string("an empty tensor"));
  KILN_CHECK(input_ids.dtype() == DType::i64 || input_ids.dtype() == DType::i32, kWhere,
             "input_ids must be i64 or i32, got ", dtype_name(input_ids.dtype()));
  const int64_t L = input_ids.dim(1);
  KILN_CHECK(L >= 1 && L <= config_.max_position_embeddings, kWhere, "sequence length ", L,
             " is outside [1, max_position_embeddings = ", config_.max_position_embeddings, "]");
  const std::vector<int64_t> ids = to_int_vector(input_ids);
  for (int64_t id : ids)
    KILN_CHECK(id >= 0 && id < config_.vocab_size, kWhere, "token id ", id, " is outside [0, vocab_size = ",
               config_.vocab_size, ")");
  return ids;
}

Tensor ClipTextModel::pooled_output(const Tensor& input_ids) const {
  const std::vector<int64_t> ids = checked_ids(input_ids);
  const int64_t B = input_ids.dim(0), L = input_ids.dim(1);
  const std::vector<int64_t> pos = pooled_positions(ids, B, L, config_.eos_token_id, config_.pooled_rule);
  // Truncating after the last pooled position keeps every row's pooled position (the first
  // <|endoftext|>, or the first largest id, both lie within what is kept).
  const int64_t keep = pos.empty() ? L : *std::max_element(pos.begin(), pos.end()) + 1;
  if (keep == L) return encode(input_ids, ids, false).pooler_output;
  std::vector<int64_t> kept;
  kept.reserve(size_t(B * keep));
  for (int64_t b = 0; b < B; ++b) kept.insert(kept.end(), ids.begin() + b * L, ids.begin() + b * L + keep);
  return encode(from_ints(kept, {B, keep}), kept, false).pooler_output;
}

ClipTextModel::Output ClipTextModel::forward(const Tensor& input_ids, bool output_hidden_states) const {
  return encode(input_ids, checked_ids(input_ids), output_hidden_states);
}

ClipTextModel::Output ClipTextModel::encode(const Tensor& input_ids, const std::vector<int64_t>& ids,
                                            bool output_hidden_states) const {
  const int64_t B = input_ids.dim(0), L = input_ids.dim(1);
  Output out;
  Tensor h = add(token_embedding_(input_ids), slice(position_embedding_.weight, 0, 0, L));
  if (output_hidden_states) out.hidden_states.push_back(h);

  // Query i sees keys j <= i. transformers adds finfo.min where this adds -inf; both give
  // an exact 0 after the softmax, and every row keeps its diagonal.
  std::vector<float> mask(size_t(L * L), 0.0f);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = i + 1; j < L; ++j) mask[size_t(i * L + j)] = -std::numeric_limits<float>::infinity();
  const Tensor causal_mask = from_vector(mask, {1, 1, L, L});

  for (const Layer& layer : layers_) {
    h = add(h, attention(layer, layer.layer_norm1(h), causal_mask));
    h = add(h, layer.fc2(nn::activation(config_.hidden_act, layer.fc1(layer.layer_norm2(h)))));
    if (output_hidden_states) out.hidden_states.push_back(h);
  }
  out.last_hidden_state = final_layer_norm_(h);

  // pooled[b] = last_hidden_state[b, pos_b], as one gather over the flattened rows.
  const std::vector<int64_t> pos = pooled_positions(ids, B, L, config_.eos_token_id, config_.pooled_rule);
  std::vector<int64_t> rows(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) rows[size_t(b)] = b * L + pos[size_t(b)];
  out.pooler_output =
      gather(reshape(out.last_hidden_state, {B * L, config_.hidden_size}), from_ints(rows, {B}));
  if (config_.with_projection) out.text_embeds = text_projection_(out.pooler_output);
  return out;
}

}  // namespace kiln
