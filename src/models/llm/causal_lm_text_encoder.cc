#include "models/llm/causal_lm_text_encoder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"
#include "exec/capture.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "nn/activations.h"

namespace kiln {

namespace {

constexpr const char* kWhere = "causal_lm_text_encoder";

// Where the language model's keys may start, per checkpoint type: a Mistral3 file in the
// transformers >= 4.52 module tree or the legacy one; a causal LM (Qwen3ForCausalLM,
// MistralForCausalLM) under "model.", or a bare base model at the root.
std::vector<std::string> prefixes_for(const DecoderLMConfig& c) {
  if (c.multimodal()) return {"model.language_model.", "language_model.model."};
  return {"model.", ""};
}

std::string language_model_prefix(const DecoderLMConfig& c, const nn::Weights& w) {
  std::string tried;
  for (const std::string& p : prefixes_for(c)) {
    if (w.has(p + "embed_tokens.weight")) return p;
    tried += (tried.empty() ? "'" : ", '") + p + "embed_tokens.weight'";
  }
  fail(kWhere, w.describe(), ": no token embedding table (looked for ", tried, "); is this the ", c.model_type,
       " text encoder's checkpoint?");
}

int64_t checked_layers_needed(const DecoderLMConfig& c, int64_t n) {
  KILN_CHECK(n == -1 || (n >= 0 && n <= c.num_hidden_layers), kWhere,
             "num_layers_needed (the largest text_encoder_out_layers index) is ", n,
             ", expected -1 (all) or 0..num_hidden_layers (", c.num_hidden_layers, ")");
  return n == -1 ? c.num_hidden_layers : n;
}

// x with its two halves of the last dim swapped, the first negated: [-x2, x1] (rotate_half).
Tensor rotate_half(const Tensor& x) {
  const int64_t d = x.dim(-1), half = d / 2, axis = x.rank() - 1;
  return concat({neg(slice(x, axis, half, d)), slice(x, axis, 0, half)}, axis);
}

}  // namespace

// ---- class data ----

std::vector<TensorParallelEntry> CausalLMTextEncoder::tp_plan() {
  return {
      {"layers.*.self_attn.q_proj", "colwise", {}}, {"layers.*.self_attn.k_proj", "colwise", {}},
      {"layers.*.self_attn.v_proj", "colwise", {}}, {"layers.*.self_attn.o_proj", "rowwise", {}},
      {"layers.*.mlp.gate_proj", "colwise", {}},    {"layers.*.mlp.up_proj", "colwise", {}},
      {"layers.*.mlp.down_proj", "rowwise", {}},
      // kiln's addition: the token table is split by rows too (exact; transformers replicates it).
      {"embed_tokens", "vocab_parallel", {}},
  };
}

int64_t CausalLMTextEncoder::num_layers_needed(const std::vector<int64_t>& layers) {
  int64_t n = 0;
  for (int64_t k : layers) n = std::max(n, k);
  return n;
}

std::vector<std::string> CausalLMTextEncoder::checkpoint_keys_not_loaded(const DecoderLMConfig& c,
                                                                         int64_t num_layers_needed) {
  const int64_t n = checked_layers_needed(c, num_layers_needed);
  std::vector<std::string> out = {"lm_head."};
  if (c.multimodal())
    for (const char* p : {"language_model.lm_head.", "model.vision_tower.", "vision_tower.",
                          "model.multi_modal_projector.", "multi_modal_projector."})
      out.emplace_back(p);
  for (const std::string& p : prefixes_for(c)) {
    for (int64_t i = n; i < c.num_hidden_layers; ++i) out.push_back(p + "layers." + std::to_string(i) + ".");
    if (n < c.num_hidden_layers) out.push_back(p + "norm.");
  }
  return out;
}

std::vector<std::string> CausalLMTextEncoder::checkpoint_keys_not_loaded(const std::filesystem::path& dir,
                                                                         int64_t num_layers_needed) {
  return checkpoint_keys_not_loaded(DecoderLMConfig::from_json(io::JsonConfig(dir / "config.json")),
                                    num_layers_needed);
}

std::vector<std::string> CausalLMTextEncoder::checkpoint_keys_not_loaded() const {
  return checkpoint_keys_not_loaded(config_, num_layers_loaded());
}

// ---- construction ----

CausalLMTextEncoder CausalLMTextEncoder::from_pretrained(const std::filesystem::path& dir, std::optional<DType> dtype,
                                                         int64_t num_layers_needed,
                                                         std::optional<TensorParallelConfig> tp) {
  const std::filesystem::path file = dir / "config.json";
  DecoderLMConfig config = DecoderLMConfig::from_json(io::JsonConfig(file));
  nn::Weights w = nn::Weights(dir).with_dtype(dtype);
  if (tp) {
    const int n = tp->mesh.size();
    KILN_CHECK(config.num_attention_heads % n == 0 && config.num_key_value_heads % n == 0 &&
                   config.intermediate_size % n == 0 && config.vocab_size % n == 0,
               "tp", "tp_degree (", n, ") must divide num_attention_heads (", config.num_attention_heads,
               "), num_key_value_heads (", config.num_key_value_heads, "), intermediate_size (",
               config.intermediate_size, ") and vocab_size (", config.vocab_size, ") of ", file.string());
    // The plan names full paths: the language model's key prefix goes in front of each pattern.
    const std::string prefix = language_model_prefix(config, w);
    std::vector<TensorParallelEntry> plan = tp_plan();
    for (TensorParallelEntry& e : plan) e.pattern = prefix + e.pattern;
    w = w.with_plan(ShardPlan::make(std::move(plan), tp->mesh));
  }
  return CausalLMTextEncoder(std::move(config), w, num_layers_needed);
}

CausalLMTextEncoder::CausalLMTextEncoder(DecoderLMConfig config, const nn::Weights& weights,
                                         int64_t num_layers_needed)
    : config_(std::move(config)) {
  const DecoderLMConfig& c = config_;
  c.validate("DecoderLMConfig");
  const int64_t n = checked_layers_needed(c, num_layers_needed);
  if (const ShardPlan* plan = weights.plan()) {
    const int ws = plan->group->size();
    KILN_CHECK(c.num_attention_heads % ws == 0 && c.num_key_value_heads % ws == 0 && c.intermediate_size % ws == 0,
               "tp", "tp_degree (", ws, ") must divide num_attention_heads (", c.num_attention_heads,
               "), num_key_value_heads (", c.num_key_value_heads, ") and intermediate_size (", c.intermediate_size,
               ") of ", weights.describe());
  }
  prefix_ = language_model_prefix(c, weights);
  const nn::Weights lm = prefix_.empty() ? weights : weights.sub(prefix_.substr(0, prefix_.size() - 1));
  const int64_t M = c.hidden_size, hd = c.head_dim, Q = c.num_attention_heads * hd,
                KV = c.num_key_value_heads * hd, F = c.intermediate_size;
  const double eps = c.rms_norm_eps;

  nn::ParameterRecorder recorded;  // the parameter list is the names the modules read
  embed_tokens_ = nn::Embedding(lm.sub("embed_tokens"), c.vocab_size, M);
  for (int64_t i = 0; i < n; ++i) {
    const nn::Weights w = lm.sub("layers", i);
    const nn::Weights attn = w.sub("self_attn"), mlp = w.sub("mlp");
    Layer l;
    l.input_layernorm = nn::RMSNorm(w.sub("input_layernorm"), M, eps);
    l.q_proj = nn::Linear(attn.sub("q_proj"), M, Q, c.attention_bias);
    l.k_proj = nn::Linear(attn.sub("k_proj"), M, KV, c.attention_bias);
    l.v_proj = nn::Linear(attn.sub("v_proj"), M, KV, c.attention_bias);
    l.o_proj = nn::Linear(attn.sub("o_proj"), Q, M, c.attention_bias);
    if (c.qk_norm()) {
      l.q_norm = nn::RMSNorm(attn.sub("q_norm"), hd, eps);
      l.k_norm = nn::RMSNorm(attn.sub("k_norm"), hd, eps);
    }
    l.post_attention_layernorm = nn::RMSNorm(w.sub("post_attention_layernorm"), M, eps);
    l.gate_proj = nn::Linear(mlp.sub("gate_proj"), M, F, false);
    l.up_proj = nn::Linear(mlp.sub("up_proj"), M, F, false);
    l.down_proj = nn::Linear(mlp.sub("down_proj"), F, M, false);
    layers_.push_back(std::move(l));
  }
  if (n == c.num_hidden_layers) norm_ = nn::RMSNorm(lm.sub("norm"), M, eps);
  named_parameters_ = recorded.named();
}

// ---- forward ----

std::pair<Tensor, Tensor> CausalLMTextEncoder::rotary_tables(int64_t length, int64_t head_dim, double theta,
                                                             DType dtype) {
  // transformers' default RoPE, in fp32: inv_freq_k = 1 / theta^(2k / hd) (the exponent an fp32
  // quotient), angle = fp32(p · inv_freq_k), tables [cos | cos] and [sin | sin] over the two halves.
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t k = 0; k < half; ++k)
    inv_freq[size_t(k)] = 1.0f / std::pow(float(theta), float(2 * k) / float(head_dim));
  std::vector<float> cos_v(static_cast<size_t>(length * head_dim)), sin_v(cos_v.size());
  for (int64_t p = 0; p < length; ++p)
    for (int64_t k = 0; k < half; ++k) {
      const float angle = float(p) * inv_freq[size_t(k)];
      const float c = float(std::cos(double(angle))), s = float(std::sin(double(angle)));
      for (int64_t at : {p * head_dim + k, p * head_dim + half + k}) {
        cos_v[size_t(at)] = c;
        sin_v[size_t(at)] = s;
      }
    }
  return {from_vector(cos_v, {length, head_dim}, dtype), from_vector(sin_v, {length, head_dim}, dtype)};
}

// transformers' RMSNorm: weight * (x·rsqrt(mean(x²) + eps) in fp32, cast to x's dtype): the
// normalised value is rounded to the model dtype before the weight multiplies it.
Tensor CausalLMTextEncoder::rms_norm(const nn::RMSNorm& norm, const Tensor& x) const {
  return mul(kiln::rms_norm(x, Tensor(), norm.eps), norm.weight);
}

// [B, 1, L, L] f32, 0 where query i may attend key j (j <= i, inside the sliding window if any,
// and key j a real token), -inf elsewhere. Built from the mask tensor with ops (no host read).
Tensor CausalLMTextEncoder::additive_mask(const Tensor& attention_mask, int64_t length) const {
  const int64_t B = attention_mask.dim(0), L = length;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> causal(static_cast<size_t>(L * L), 0.0f);
  const int64_t window = config_.sliding_window.value_or(L + 1);
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < L; ++j)
      if (j > i || j <= i - window) causal[size_t(i * L + j)] = -inf;
  const Tensor keep = attention_mask.dtype() == DType::boolean
                          ? attention_mask
                          : ne(attention_mask, scalar(0, attention_mask.dtype(), attention_mask.device()));
  const Tensor padding = where(reshape(keep, {B, 1, 1, L}), scalar(0.0), scalar(-inf));
  return add(padding, from_vector(causal, {1, 1, L, L}));
}

Tensor CausalLMTextEncoder::attention(const Layer& l, const Tensor& x, const Tensor& cos, const Tensor& sin,
                                      const Tensor& mask) const {
  const int64_t B = x.dim(0), L = x.dim(1), hd = config_.head_dim;
  // This rank's heads (all of them without tensor parallelism).
  const int64_t H = l.q_proj.weight.dim(0) / hd, Hkv = l.k_proj.weight.dim(0) / hd;
  Tensor q = reshape(l.q_proj(x), {B, L, H, hd}), k = reshape(l.k_proj(x), {B, L, Hkv, hd});
  const Tensor v = reshape(l.v_proj(x), {B, L, Hkv, hd});
  if (config_.qk_norm()) {  // Qwen3: per-head RMSNorm before RoPE
    q = rms_norm(l.q_norm, q);
    k = rms_norm(l.k_norm, k);
  }
  // [B, heads, L, hd]; RoPE as transformers' apply_rotary_pos_emb: x·cos + rotate_half(x)·sin.
  const auto rope = [&](const Tensor& t) { return add(mul(t, cos), mul(rotate_half(t), sin)); };
  const Tensor qh = rope(transpose(q, 1, 2)), kh = rope(transpose(k, 1, 2));
  // Grouped-query attention: query head h reads KV head h / (H / Hkv), no copy of K/V.
  const Tensor o = scaled_dot_product_attention(qh, kh, transpose(v, 1, 2), mask, 1.0 / std::sqrt(double(hd)));
  return l.o_proj(reshape(transpose(o, 1, 2), {B, L, H * hd}));
}

std::vector<Tensor> CausalLMTextEncoder::hidden_states(const Tensor& input_ids, const Tensor& attention_mask,
                                                       const std::vector<int64_t>& layers) const {
  KILN_CHECK(input_ids.defined() && input_ids.rank() == 2, kWhere, "input_ids must be [batch, length], got ",
             input_ids.defined() ? to_string(input_ids.shape()) : std::string("an empty tensor"));
  KILN_CHECK(input_ids.dtype() == DType::i64 || input_ids.dtype() == DType::i32, kWhere,
             "input_ids must be i64 or i32, got ", dtype_name(input_ids.dtype()));
  KILN_CHECK(attention_mask.defined() && attention_mask.shape() == input_ids.shape(), kWhere, "attention_mask ",
             attention_mask.defined() ? to_string(attention_mask.shape()) : std::string("(none)"),
             " must have input_ids' shape ", to_string(input_ids.shape()));
  KILN_CHECK(!is_floating(attention_mask.dtype()), kWhere, "attention_mask must be an integer or bool tensor, got ",
             dtype_name(attention_mask.dtype()));
  const int64_t L = input_ids.dim(1), N = config_.num_hidden_layers;
  KILN_CHECK(L >= 1, kWhere, "input_ids has no tokens");
  KILN_CHECK(!layers.empty(), kWhere, "text_encoder_out_layers is empty: no hidden state asked for");
  for (int64_t k : layers) {
    KILN_CHECK(k >= 0 && k <= N, kWhere, "text_encoder_out_layers index ", k, " is outside 0..", N,
               " (hidden_states has num_hidden_layers + 1 = ", N + 1, " entries)");
    const bool loaded = k == N ? has_final_norm() : k <= num_layers_loaded();
    KILN_CHECK(loaded, kWhere, "text_encoder_out_layers index ", k, " needs decoder layers 0..", k - 1,
               k == N ? " and the final norm" : "", ", but the text encoder was loaded with num_layers_needed = ",
               num_layers_loaded(), " (from_pretrained's num_layers_needed must be at least ",
               num_layers_needed(layers), ")");
  }
  const int64_t last = num_layers_needed(layers);
  std::map<int64_t, Tensor> kept;
  const auto keep = [&](int64_t k, const Tensor& h) {
    if (std::find(layers.begin(), layers.end(), k) != layers.end()) kept[k] = h;
  };

  Tensor h;
  {
    ModuleScope scope("embed_tokens");
    h = embed_tokens_(input_ids);  // no scaling
  }
  keep(0, h);
  if (last > 0) {
    const auto [cos, sin] = rotary_tables(L, config_.head_dim, config_.rope_theta, dtype());
    const Tensor mask = additive_mask(attention_mask, L);
    for (int64_t i = 0; i < last; ++i) {
      ModuleScope scope("layers", i);
      const Layer& l = layers_[size_t(i)];
      h = add(h, attention(l, rms_norm(l.input_layernorm, h), cos, sin, mask));
      const Tensor n = rms_norm(l.post_attention_layernorm, h);
      h = add(h, l.down_proj(mul(nn::activation(config_.hidden_act, l.gate_proj(n)), l.up_proj(n))));
      // The last entry of transformers' hidden_states is the normed state, not the raw one.
      if (i + 1 < N) keep(i + 1, h);
    }
    if (last == N) {
      ModuleScope scope("norm");
      keep(N, rms_norm(norm_, h));
    }
  }
  std::vector<Tensor> out;
  out.reserve(layers.size());
  for (int64_t k : layers) out.push_back(kept.at(k));
  return out;
}

}  // namespace kiln
