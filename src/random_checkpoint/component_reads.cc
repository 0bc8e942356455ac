#include "random_checkpoint/component_reads.h"

#include <cmath>
#include <functional>
#include <map>

#include "core/error.h"
#include "io/json_config.h"
#include "models/clip/clip_text_model.h"
#include "models/flux/flux_transformer.h"
#include "models/flux2/flux2_transformer.h"
#include "models/llm/causal_lm_text_encoder.h"
#include "models/sd3/sd3_transformer.h"
#include "models/t5/t5_encoder.h"
#include "models/vae/autoencoder_kl.h"
#include "random_checkpoint/model_reads.h"

namespace kiln::random_weights {

namespace {

// The tensors a class reads from `config`, whose errors name `source` (FOLDER/config.json).
using Reads = std::function<std::vector<RandomTensor>(const nlohmann::json& config, const std::string& source)>;

// The residual-branch rule (model_reads.h) for a stack whose blocks add `branches` branches.
ReadRules residual(const std::vector<std::string>& suffixes, int64_t branches) {
  ReadRules rules;
  rules.gains = residual_gains(suffixes, branches);
  return rules;
}

// Gated branches added to the residual streams: two per double block (attention, feed-forward; the
// text stream has as many), one per single block.
ReadRules flux_rules(const io::JsonConfig& c, std::vector<std::string> suffixes) {
  return residual(suffixes, 2 * c.get_int("num_layers") + c.get_int("num_single_layers"));
}

ReadRules sd3_rules(const io::JsonConfig& c) {
  // Attention and feed-forward in every block, and attn2 in the dual ones (the context stream has fewer).
  const int64_t dual = int64_t(c.get_int_list("dual_attention_layers", {}).size());
  ReadRules rules = residual({"attn.to_out.0", "attn.to_add_out", "attn2.to_out.0", "ff.net.2", "ff_context.net.2"},
                             2 * c.get_int("num_layers") + dual);
  // The fixed table Diffusers' PatchEmbed builds, not a learned one.
  const int64_t dim = c.get_int("num_attention_heads") * c.get_int("attention_head_dim");
  rules.inits = {{"pos_embed.pos_embed", Init::sincos_2d(c.get_int("pos_embed_max_size"), dim,
                                                        c.get_int("sample_size") / c.get_int("patch_size"))}};
  return rules;
}

ReadRules t5_rules(const io::JsonConfig& c) {
  ReadRules rules = residual({"SelfAttention.o", "DenseReluDense.wo"}, 2 * c.get_int("num_layers"));
  // T5 does not divide the scores by sqrt(d_kv): q carries that factor, so scores stay O(1).
  rules.gains.emplace_back("SelfAttention.q", 1 / std::sqrt(double(c.get_int("d_kv"))));
  // Small next to the O(1) scores, so position only nudges attention.
  rules.inits = {{"relative_attention_bias.weight", Init::uniform(0.1)}};
  return rules;
}

// Two residual branches a layer; RMSNorm before each branch and (Qwen3) on q and k keep the
// attention scores O(1) too. The model looks for its key prefix, which follows the architecture.
ReadRules causal_lm_rules(const io::JsonConfig& c, const std::string& prefix) {
  // Mistral3ForConditionalGeneration nests its language model's fields in text_config.
  const io::JsonConfig text =
      c.has("text_config") ? io::JsonConfig(c.json()["text_config"], c.source() + " text_config") : c;
  ReadRules rules = residual({"self_attn.o_proj", "mlp.down_proj"}, 2 * text.get_int("num_hidden_layers"));
  rules.present = {prefix + "embed_tokens.weight"};
  return rules;
}

ReadRules vae_rules(bool flux2) {
  ReadRules rules;
  rules.present = {"encoder.conv_in.weight"};  // the pipelines decode only, but the Hub's files hold the encoder
  // BatchNorm2d's step count (AutoencoderKLFlux2's latent statistics), which no forward reads.
  if (flux2) rules.unread = {{"bn.num_batches_tracked", {}, Init::constant(0), DType::i64}};
  return rules;
}

template <typename Model, typename Config>
Reads reads(std::function<ReadRules(const io::JsonConfig&)> rules) {
  return [rules](const nlohmann::json& c, const std::string& source) {
    return tensors_read_by<Model, Config>(c, rules(io::JsonConfig(c, source)), source);
  };
}

const std::map<std::string, Reads>& classes() {
  using Clip = ClipTextModel::Config;
  using T5 = T5EncoderModel::Config;
  static const Reads clip = reads<ClipTextModel, Clip>([](const io::JsonConfig& c) {
    return residual({"self_attn.out_proj", "mlp.fc2"}, 2 * c.get_int("num_hidden_layers"));
  });
  static const std::map<std::string, Reads> table = {
      {"FluxTransformer2DModel",
       reads<FluxTransformer2DModel, FluxTransformerConfig>([](const io::JsonConfig& c) {
         return flux_rules(c, {"attn.to_out.0", "attn.to_add_out", "ff.net.2", "ff_context.net.2", "proj_out"});
       })},
      {"Flux2Transformer2DModel",
       reads<Flux2Transformer2DModel, Flux2TransformerConfig>([](const io::JsonConfig& c) {
         return flux_rules(c, {"attn.to_out.0", "attn.to_add_out", "ff.linear_out", "ff_context.linear_out",
                               "attn.to_out"});
       })},
      {"SD3Transformer2DModel", reads<SD3Transformer2DModel, SD3TransformerConfig>(sd3_rules)},
      {"CLIPTextModel", clip},
      {"CLIPTextModelWithProjection", clip},  // ClipTextModel reads the projection when the config names it
      {"T5EncoderModel", reads<T5EncoderModel, T5>(t5_rules)},
      {"Qwen3ForCausalLM", reads<CausalLMTextEncoder, DecoderLMConfig>(
                               [](const io::JsonConfig& c) { return causal_lm_rules(c, "model."); })},
      {"Mistral3ForConditionalGeneration",
       reads<CausalLMTextEncoder, DecoderLMConfig>(
           [](const io::JsonConfig& c) { return causal_lm_rules(c, "model.language_model."); })},
      {"AutoencoderKL", reads<AutoencoderKL, VaeConfig>([](const io::JsonConfig&) { return vae_rules(false); })},
      {"AutoencoderKLFlux2", reads<AutoencoderKL, VaeConfig>([](const io::JsonConfig&) { return vae_rules(true); })},
  };
  return table;
}

}  // namespace

std::string config_class(const nlohmann::json& config) {
  if (config.contains("_class_name") && config["_class_name"].is_string()) return config["_class_name"];
  if (!config.contains("architectures")) return "";
  const nlohmann::json& a = config["architectures"];
  return a.is_array() && !a.empty() && a[0].is_string() ? a[0].get<std::string>() : "";
}

std::vector<RandomTensor> component_tensors(const std::string& folder, const nlohmann::json& config) {
  const std::string name = config_class(config);
  const auto it = classes().find(name);
  KILN_CHECK(it != classes().end(), "make-random", folder, "/config.json: kiln has no model class '", name, "'");
  return it->second(config, folder + "/config.json");
}

}  // namespace kiln::random_weights
