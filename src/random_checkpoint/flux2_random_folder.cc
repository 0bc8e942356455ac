#include "random_checkpoint/flux2_random_folder.h"

#include "core/error.h"
#include "random_checkpoint/autoencoder_kl_random.h"

namespace kiln::random_weights {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWhere = "make-random";

void check_options(const Flux2RandomOptions& o) {
  const int64_t d = o.num_layers.value_or(0), s = o.num_single_layers.value_or(0);
  KILN_CHECK(d >= 0 && s >= 0, kWhere, "block counts must be >= 0, got ", d, "+", s);
  KILN_CHECK(d <= kMaxRandomLayers && s <= kMaxRandomLayers, kWhere, "block counts must be at most ", kMaxRandomLayers,
             " each, got ", d, "+", s);
  KILN_CHECK(o.text_encoder_layers.value_or(1) >= 1, kWhere, "the text encoder needs at least 1 layer, got ",
             o.text_encoder_layers.value_or(0));
  KILN_CHECK(o.text_encoder_layers.value_or(1) <= kMaxRandomLayers, kWhere, "text encoder layers must be at most ",
             kMaxRandomLayers, ", got ", o.text_encoder_layers.value_or(0));
  KILN_CHECK(is_floating(o.dtype), kWhere, "weights are f32, bf16 or f16, not ", dtype_name(o.dtype));
}

// [VERIFY] the Diffusers versions the Hub's files were written with (FLUX.2-dev: November 2025,
// klein: January 2026), not read from them.
const char* diffusers_version(Flux2Variant v) { return is_klein(v) ? "0.37.0.dev0" : "0.36.0.dev0"; }

}  // namespace

Flux2TransformerRandomConfig flux2_transformer_random_config(const Flux2RandomOptions& o) {
  Flux2TransformerRandomConfig c = Flux2TransformerRandomConfig::for_variant(o.variant);
  c.num_layers = o.num_layers.value_or(c.num_layers);
  c.num_single_layers = o.num_single_layers.value_or(c.num_single_layers);
  return c;
}

CausalLmRandomConfig flux2_text_encoder_random_config(const Flux2RandomOptions& o) {
  CausalLmRandomConfig c = o.variant == Flux2Variant::klein_4b   ? CausalLmRandomConfig::qwen3_4b()
                           : o.variant == Flux2Variant::klein_9b ? CausalLmRandomConfig::qwen3_8b()
                                                                 : CausalLmRandomConfig::mistral_small_3_2();
  c.num_hidden_layers = o.text_encoder_layers.value_or(c.num_hidden_layers);
  return c;
}

std::vector<RandomComponent> flux2_random_components(const Flux2RandomOptions& o) {
  check_options(o);
  return {causal_lm_random(flux2_text_encoder_random_config(o), o.dtype),
          flux2_transformer_random(flux2_transformer_random_config(o)),
          autoencoder_kl_random(AutoencoderKlRandomConfig::flux2())};
}

nlohmann::json flux2_model_index(Flux2Variant variant) {
  // The Hub's model_index.json, except the tokenizer of dev: the copied folder is a slow
  // LlamaTokenizer's (sentencepiece, its chat template in tokenizer_config.json), not the Hub's
  // PixtralProcessor.
  const bool klein = is_klein(variant);
  nlohmann::json index = {
      {"_class_name", klein ? "Flux2KleinPipeline" : "Flux2Pipeline"},
      {"_diffusers_version", diffusers_version(variant)},
      {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
      {"text_encoder", {"transformers", klein ? "Qwen3ForCausalLM" : "Mistral3ForConditionalGeneration"}},
      {"tokenizer", {"transformers", klein ? "Qwen2TokenizerFast" : "LlamaTokenizer"}},
      {"transformer", {"diffusers", "Flux2Transformer2DModel"}},
      {"vae", {"diffusers", "AutoencoderKLFlux2"}},
  };
  if (klein) index["is_distilled"] = true;  // the released klein 4B / 9B are step-distilled
  return index;
}

nlohmann::json flux2_scheduler_config(Flux2Variant variant) {
  // The Hub's file (FLUX.1-dev's, made explicit by a newer Diffusers); `shift` is unused as the pipeline
  // always passes mu.
  return {
      {"_class_name", "FlowMatchEulerDiscreteScheduler"},
      {"_diffusers_version", diffusers_version(variant)},
      {"base_image_seq_len", 256},
      {"base_shift", 0.5},
      {"invert_sigmas", false},
      {"max_image_seq_len", 4096},
      {"max_shift", 1.15},
      {"num_train_timesteps", 1000},
      {"shift", 3.0},
      {"shift_terminal", nullptr},
      {"stochastic_sampling", false},
      {"time_shift_type", "exponential"},
      {"use_beta_sigmas", false},
      {"use_dynamic_shifting", true},
      {"use_exponential_sigmas", false},
      {"use_karras_sigmas", false},
  };
}

RandomFolderContents flux2_random_contents(const Flux2RandomOptions& options, const fs::path& tokenizers_from) {
  check_options(options);
  RandomFolderContents contents;
  contents.components = flux2_random_components(options);
  contents.dtype = options.dtype;
  contents.seed = options.seed;
  contents.layout_only = options.layout_only;
  contents.copied_folders = {{tokenizers_from / "tokenizer", "tokenizer"}};
  contents.text_files = {{"model_index.json", flux2_model_index(options.variant).dump(2) + "\n"},
                         {"scheduler/scheduler_config.json", flux2_scheduler_config(options.variant).dump(2) + "\n"}};
  return contents;
}

RandomFolder write_flux2_random_folder(const fs::path& dir, const Flux2RandomOptions& options,
                                       const fs::path& tokenizers_from, const RandomFolderProgress& progress) {
  return write_random_folder(dir, flux2_random_contents(options, tokenizers_from), progress);
}

}  // namespace kiln::random_weights
