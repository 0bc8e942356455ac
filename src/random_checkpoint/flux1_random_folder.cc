#include "random_checkpoint/flux1_random_folder.h"

#include "core/error.h"
#include "random_checkpoint/autoencoder_kl_random.h"
#include "random_checkpoint/clip_text_random.h"
#include "random_checkpoint/flux_transformer_random.h"
#include "random_checkpoint/t5_encoder_random.h"

namespace kiln::random_weights {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWhere = "make-random";

void check_options(const Flux1RandomOptions& o) {
  KILN_CHECK(o.num_layers >= 0 && o.num_single_layers >= 0, kWhere, "block counts must be >= 0, got ", o.num_layers,
             "+", o.num_single_layers);
  KILN_CHECK(o.num_layers <= kMaxRandomLayers && o.num_single_layers <= kMaxRandomLayers, kWhere,
             "block counts must be at most ", kMaxRandomLayers, " each, got ", o.num_layers, "+", o.num_single_layers);
  KILN_CHECK(o.t5_layers >= 1, kWhere, "T5 needs at least 1 layer (block 0 holds the position bias), got ",
             o.t5_layers);
  KILN_CHECK(o.t5_layers <= kMaxRandomLayers, kWhere, "T5 layers must be at most ", kMaxRandomLayers, ", got ",
             o.t5_layers);
  KILN_CHECK(is_floating(o.dtype), kWhere, "weights are f32, bf16 or f16, not ", dtype_name(o.dtype));
}

}  // namespace

std::vector<RandomComponent> flux1_random_components(const Flux1RandomOptions& o) {
  return {clip_text_random(o.dtype), t5_encoder_random(o.t5_layers, o.dtype),
          flux_transformer_random(o.variant, o.num_layers, o.num_single_layers), autoencoder_kl_random()};
}

nlohmann::json flux1_model_index() {
  // The Hub's model_index.json, except tokenizer_2: the copied tokenizer folder is a slow
  // T5Tokenizer's (spiece.model, no tokenizer.json), and says so in its tokenizer_config.json.
  return {
      {"_class_name", "FluxPipeline"},
      {"_diffusers_version", "0.30.0.dev0"},
      {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
      {"text_encoder", {"transformers", "CLIPTextModel"}},
      {"text_encoder_2", {"transformers", "T5EncoderModel"}},
      {"tokenizer", {"transformers", "CLIPTokenizer"}},
      {"tokenizer_2", {"transformers", "T5Tokenizer"}},
      {"transformer", {"diffusers", "FluxTransformer2DModel"}},
      {"vae", {"diffusers", "AutoencoderKL"}},
  };
}

nlohmann::json flux1_scheduler_config(Flux1Variant variant) {
  const bool dev = variant == Flux1Variant::dev;  // dev shifts the schedule by the image size
  return {
      {"_class_name", "FlowMatchEulerDiscreteScheduler"},
      {"_diffusers_version", "0.30.0.dev0"},
      {"base_image_seq_len", 256},
      {"base_shift", 0.5},
      {"max_image_seq_len", 4096},
      {"max_shift", 1.15},
      {"num_train_timesteps", 1000},
      {"shift", dev ? 3.0 : 1.0},
      {"use_dynamic_shifting", dev},
  };
}

Flux1RandomFolder write_flux1_random_folder(const fs::path& dir, const Flux1RandomOptions& options,
                                            const fs::path& tokenizers_from, const Flux1RandomProgress& progress) {
  check_options(options);
  RandomFolderContents contents;
  contents.components = flux1_random_components(options);
  contents.dtype = options.dtype;
  contents.seed = options.seed;
  contents.layout_only = options.layout_only;
  contents.copied_folders = {{tokenizers_from / "tokenizer", "tokenizer"},
                             {tokenizers_from / "tokenizer_2", "tokenizer_2"}};
  contents.text_files = {{"model_index.json", flux1_model_index().dump(2) + "\n"},
                         {"scheduler/scheduler_config.json", flux1_scheduler_config(options.variant).dump(2) + "\n"}};
  return write_random_folder(dir, contents, progress);
}

}  // namespace kiln::random_weights
