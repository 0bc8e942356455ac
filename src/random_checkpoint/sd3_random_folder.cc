#include "random_checkpoint/sd3_random_folder.h"

#include <fstream>

#include "core/error.h"
#include "random_checkpoint/autoencoder_kl_random.h"
#include "random_checkpoint/clip_text_random.h"
#include "random_checkpoint/sd3_transformer_random.h"
#include "random_checkpoint/t5_encoder_random.h"

namespace kiln::random_weights {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWhere = "make-random";
constexpr const char* kPad2 = "!";  // tokenizer_2's pad token

void check_options(const Sd3RandomOptions& o) {
  KILN_CHECK(o.num_layers >= 1, kWhere, "SD3 needs at least 1 transformer block, got ", o.num_layers);
  KILN_CHECK(o.num_layers <= kMaxRandomLayers, kWhere, "SD3 transformer blocks must be at most ", kMaxRandomLayers,
             ", got ", o.num_layers);
  KILN_CHECK(o.t5_layers >= 1, kWhere, "T5 needs at least 1 layer (block 0 holds the position bias), got ",
             o.t5_layers);
  KILN_CHECK(o.t5_layers <= kMaxRandomLayers, kWhere, "T5 layers must be at most ", kMaxRandomLayers, ", got ",
             o.t5_layers);
  KILN_CHECK(is_floating(o.dtype), kWhere, "weights are f32, bf16 or f16, not ", dtype_name(o.dtype));
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  KILN_CHECK(in.good(), kWhere, "cannot read ", path.string(),
             " (make-random copies the bundled checkpoint's tokenizers)");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(kWhere, path.string(), ": not JSON: ", e.what());
  }
}

}  // namespace

std::vector<RandomComponent> sd3_random_components(const Sd3RandomOptions& o) {
  return {clip_text_random(ClipTextRandomConfig::sd3_clip_l(), o.dtype),
          clip_text_random(ClipTextRandomConfig::sd3_clip_g(), o.dtype),
          t5_encoder_random(o.t5_layers, o.dtype, "text_encoder_3"), sd3_transformer_random(o.variant, o.num_layers),
          autoencoder_kl_random(AutoencoderKlRandomConfig::sd3())};
}

nlohmann::json sd3_model_index(Sd3Variant variant) {
  // The Hub's model_index.json without the IP-Adapter entries, except tokenizer_3:
  // the copied tokenizer folder is a slow T5Tokenizer's (spiece.model, no tokenizer.json).
  return {
      {"_class_name", "StableDiffusion3Pipeline"},
      {"_diffusers_version", variant == Sd3Variant::sd35_medium ? "0.31.0.dev0" : "0.29.0.dev0"},
      {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
      {"text_encoder", {"transformers", "CLIPTextModelWithProjection"}},
      {"text_encoder_2", {"transformers", "CLIPTextModelWithProjection"}},
      {"text_encoder_3", {"transformers", "T5EncoderModel"}},
      {"tokenizer", {"transformers", "CLIPTokenizer"}},
      {"tokenizer_2", {"transformers", "CLIPTokenizer"}},
      {"tokenizer_3", {"transformers", "T5Tokenizer"}},
      {"transformer", {"diffusers", "SD3Transformer2DModel"}},
      {"vae", {"diffusers", "AutoencoderKL"}},
  };
}

nlohmann::json sd3_scheduler_config(Sd3Variant variant) {
  // The Hub's file sets only these; every other field takes the defaults.
  return {
      {"_class_name", "FlowMatchEulerDiscreteScheduler"},
      {"_diffusers_version", variant == Sd3Variant::sd35_medium ? "0.31.0.dev0" : "0.29.0.dev0"},
      {"num_train_timesteps", 1000},
      {"shift", 3.0},
  };
}

std::vector<std::pair<std::string, std::string>> sd3_tokenizer_2_files(const fs::path& clip_tokenizer) {
  const nlohmann::json vocab = read_json(clip_tokenizer / "vocab.json");
  KILN_CHECK(vocab.is_object() && vocab.contains(kPad2) && vocab[kPad2].is_number_integer(), kWhere,
             (clip_tokenizer / "vocab.json").string(), ": no token \"", kPad2,
             "\", which SD3's tokenizer_2 pads with");
  nlohmann::json special = read_json(clip_tokenizer / "special_tokens_map.json");
  nlohmann::json config = read_json(clip_tokenizer / "tokenizer_config.json");
  KILN_CHECK(special.is_object() && config.is_object(), kWhere, clip_tokenizer.string(),
             ": special_tokens_map.json and tokenizer_config.json must hold JSON objects");
  special["pad_token"] = kPad2;
  config["pad_token"] = kPad2;
  config["added_tokens_decoder"][std::to_string(vocab[kPad2].get<int64_t>())] = {
      {"content", kPad2}, {"lstrip", false}, {"normalized", false},
      {"rstrip", false},  {"single_word", false}, {"special", true}};
  return {{"tokenizer_2/special_tokens_map.json", special.dump(2) + "\n"},
          {"tokenizer_2/tokenizer_config.json", config.dump(2) + "\n"}};
}

RandomFolder write_sd3_random_folder(const fs::path& dir, const Sd3RandomOptions& options,
                                     const fs::path& tokenizers_from, const RandomFolderProgress& progress) {
  check_options(options);
  for (const char* t : {"tokenizer", "tokenizer_2"})
    KILN_CHECK(fs::is_directory(tokenizers_from / t), kWhere, "tokenizer folder ", (tokenizers_from / t).string(),
               " is missing (make-random copies the bundled checkpoint's tokenizers)");
  RandomFolderContents contents;
  contents.components = sd3_random_components(options);
  contents.dtype = options.dtype;
  contents.seed = options.seed;
  contents.layout_only = options.layout_only;
  contents.copied_folders = {{tokenizers_from / "tokenizer", "tokenizer"},
                             {tokenizers_from / "tokenizer", "tokenizer_2"},
                             {tokenizers_from / "tokenizer_2", "tokenizer_3"}};
  contents.text_files = {{"model_index.json", sd3_model_index(options.variant).dump(2) + "\n"},
                         {"scheduler/scheduler_config.json", sd3_scheduler_config(options.variant).dump(2) + "\n"}};
  for (auto& f : sd3_tokenizer_2_files(tokenizers_from / "tokenizer")) contents.text_files.push_back(std::move(f));
  return write_random_folder(dir, contents, progress);
}

}  // namespace kiln::random_weights
