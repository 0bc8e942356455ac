#include "models/llm/decoder_lm_config.h"

#include <vector>

#include "core/error.h"
#include "io/config_fields.h"
#include "nn/activations.h"

namespace kiln {

namespace {

constexpr const char* kWhere = "decoder_lm";

// transformers' MistralConfig / Qwen3Config defaults.
DecoderLMConfig defaults_for(const std::string& model_type) {
  DecoderLMConfig c;
  c.model_type = model_type;
  if (model_type == "qwen3") {
    c.vocab_size = 151936;
    c.hidden_size = 4096;
    c.intermediate_size = 22016;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 32;  // None -> num_attention_heads
    c.head_dim = 128;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
  } else {
    c.vocab_size = 32000;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 0;  // None -> hidden_size / num_attention_heads
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.sliding_window = 4096;
  }
  return c;
}

// rope_theta, and a check that the RoPE is the default one: transformers <= 4.x keeps it as
// `rope_theta` + `rope_scaling`, 5.x as `rope_parameters` {rope_type, rope_theta}.
void read_rope(const io::JsonConfig& json, DecoderLMConfig& c) {
  c.rope_theta = json.get_float("rope_theta", c.rope_theta);
  for (const char* field : {"rope_scaling", "rope_parameters"}) {
    if (!json.has(field)) continue;
    const io::JsonConfig rope = io::JsonConfig::from_string(json.json()[field].dump(), json.source() + " " + field);
    const std::string type = rope.get_string("rope_type", rope.get_string("type", "default"));
    KILN_CHECK(type == "default", kWhere, json.source(), ": field '", field, "' has rope_type '", type,
               "'; only the default RoPE (no scaling) is supported");
    c.rope_theta = rope.get_float("rope_theta", c.rope_theta);
  }
}

}  // namespace

DecoderLMConfig DecoderLMConfig::from_json(const io::JsonConfig& file) {
  KILN_CHECK(file.has("model_type"), kWhere, file.source(),
             ": field 'model_type' is missing (expected mistral3, mistral or qwen3)");
  const std::string top = file.get_string("model_type");
  KILN_CHECK(top == "mistral3" || top == "mistral" || top == "qwen3", kWhere, file.source(), ": field 'model_type' is '",
             top, "', expected mistral3 (FLUX.2-dev's Mistral3ForConditionalGeneration), mistral or qwen3 (FLUX.2 ",
             "[klein]'s Qwen3ForCausalLM)");
  static const std::vector<std::string> known = {"Mistral3ForConditionalGeneration", "MistralForCausalLM",
                                                 "MistralModel", "Qwen3ForCausalLM", "Qwen3Model"};
  for (const std::string& a : file.get_string_list("architectures", {})) {
    bool ok = false;
    for (const std::string& k : known) ok = ok || a == k;
    KILN_CHECK(ok, kWhere, file.source(), ": field 'architectures' names '", a,
               "', expected Mistral3ForConditionalGeneration, MistralForCausalLM or Qwen3ForCausalLM");
  }

  // A Mistral3 checkpoint's language model is its text_config (model_type "mistral" by default).
  std::optional<io::JsonConfig> nested;
  if (top == "mistral3") {
    KILN_CHECK(file.has("text_config") && file.json()["text_config"].is_object(), kWhere, file.source(),
               ": field 'text_config' is missing or not an object (a Mistral3 config holds its language model there)");
    nested.emplace(io::JsonConfig::from_string(file.json()["text_config"].dump(), file.source() + " text_config"));
  }
  const io::JsonConfig& json = nested ? *nested : file;
  const std::string lm_type = nested ? json.get_string("model_type", "mistral") : top;
  KILN_CHECK(lm_type == "mistral" || lm_type == "qwen3", kWhere, json.source(), ": field 'model_type' is '", lm_type,
             "', expected mistral or qwen3");

  DecoderLMConfig c = defaults_for(lm_type);
  c.checkpoint_model_type = top;
  io::read_fields(json, {{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                         {"intermediate_size", c.intermediate_size}, {"num_hidden_layers", c.num_hidden_layers},
                         {"num_attention_heads", c.num_attention_heads}});
  c.num_key_value_heads =
      json.get_int("num_key_value_heads", lm_type == "qwen3" ? c.num_attention_heads : c.num_key_value_heads);
  KILN_CHECK(c.num_attention_heads > 0, kWhere, json.source(), ": field 'num_attention_heads' must be positive, got ",
             c.num_attention_heads);
  // Mistral: head_dim null, absent or 0 -> hidden_size / heads. Qwen3: absent -> 128 (a null is
  // read as the ratio too, where transformers would fail).
  c.head_dim = json.get_int("head_dim", c.head_dim);
  const bool ratio = lm_type == "mistral" ? c.head_dim == 0 : json.json().contains("head_dim") && !json.has("head_dim");
  if (ratio) c.head_dim = c.hidden_size / c.num_attention_heads;
  c.hidden_act = json.get_string("hidden_act", c.hidden_act);
  c.rms_norm_eps = json.get_float("rms_norm_eps", c.rms_norm_eps);
  read_rope(json, c);
  c.attention_bias = json.get_bool("attention_bias", c.attention_bias);
  if (lm_type == "mistral") {
    // null is "no window" here, unlike absent (MistralConfig's 4096).
    if (json.json().contains("sliding_window"))
      c.sliding_window = json.has("sliding_window") ? std::optional(json.get_int("sliding_window")) : std::nullopt;
  } else {
    KILN_CHECK(!json.get_bool("use_sliding_window", false), kWhere, json.source(),
               ": field 'use_sliding_window' is true; Qwen3's sliding-window layers are not supported");
    for (const std::string& t : json.get_string_list("layer_types", {}))
      KILN_CHECK(t == "full_attention", kWhere, json.source(), ": field 'layer_types' lists '", t,
                 "'; only full_attention layers are supported");
  }
  c.validate(json.source());
  return c;
}

void DecoderLMConfig::validate(const std::string& source) const {
  for (auto [name, v] : {std::pair{"vocab_size", vocab_size}, {"hidden_size", hidden_size},
                         {"intermediate_size", intermediate_size}, {"num_attention_heads", num_attention_heads},
                         {"num_key_value_heads", num_key_value_heads}, {"head_dim", head_dim}})
    KILN_CHECK(v > 0, kWhere, source, ": field '", name, "' must be positive, got ", v);
  KILN_CHECK(num_hidden_layers >= 1, kWhere, source, ": field 'num_hidden_layers' must be >= 1, got ",
             num_hidden_layers);
  KILN_CHECK(num_attention_heads % num_key_value_heads == 0, kWhere, source, ": num_attention_heads ",
             num_attention_heads, " is not a multiple of num_key_value_heads ", num_key_value_heads);
  KILN_CHECK(head_dim % 2 == 0, kWhere, source, ": head_dim ", head_dim, " must be even (RoPE rotates halves)");
  KILN_CHECK(rms_norm_eps > 0 && rope_theta > 0, kWhere, source, ": rms_norm_eps (", rms_norm_eps,
             ") and rope_theta (", rope_theta, ") must be positive");
  KILN_CHECK(!sliding_window || *sliding_window > 0, kWhere, source, ": field 'sliding_window' must be positive or ",
             "null, got ", sliding_window.value_or(0));
  KILN_CHECK(nn::is_known_activation(hidden_act), kWhere, source, ": field 'hidden_act' is '", hidden_act,
             "', expected silu (or another activation kiln knows: gelu, gelu_new, relu, ...)");
}

}  // namespace kiln
