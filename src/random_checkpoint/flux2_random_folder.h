// A complete Diffusers FLUX.2 folder with deterministic random weights (kiln make-random --like
// flux2-dev|flux2-klein-4b|flux2-klein-9b): real widths, chosen depths, weights in a chosen
// dtype, to measure speed and memory at real size without the download. The layout:
//   model_index.json   Flux2Pipeline (dev) or Flux2KleinPipeline with is_distilled true (klein);
//                      the tokenizer entry names the copied folder's class (see below)
//   scheduler/         FlowMatchEulerDiscreteScheduler, dynamic exponential shifting
//   text_encoder/      Mistral3 (dev) or Qwen3 (klein) language model (causal_lm_random.h)
//   tokenizer/         copied from a tokenizer folder given (kiln's bundled FLUX.2 fixtures): dev
//                      a slow LlamaTokenizer (sentencepiece, Mistral chat template; the Hub's is a
//                      PixtralProcessor), klein a Qwen2TokenizerFast with its chat_template.jinja.
//                      Their vocabularies are smaller than the models' (every id is a valid row).
//   transformer/       Flux2Transformer2DModel (flux2_transformer_random.h)
//   vae/               AutoencoderKLFlux2 (autoencoder_kl_random.h)
// The weights are streamed to disk and sharded as save_pretrained would (random_folder.h); the
// folder appears at DIR only once complete.
//
// Depths: the pipeline reads the text encoder's hidden states 10, 20, 30 (dev) or 9, 18, 27
// (klein), so by default it loads 30 / 27 decoder layers; a folder with fewer text encoder layers
// runs only with other text_encoder_out_layers (three of them: the transformer's
// joint_attention_dim is 3 x hidden), e.g. 1,2,3 for 3 layers.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "random_checkpoint/causal_lm_random.h"
#include "random_checkpoint/flux2_transformer_random.h"
#include "random_checkpoint/flux2_variant.h"
#include "random_checkpoint/random_component.h"
#include "random_checkpoint/random_folder.h"

namespace kiln::random_weights {

struct Flux2RandomOptions {
  Flux2Variant variant = Flux2Variant::dev;
  // Transformer blocks (std::nullopt: the variant's, dev 8+48, klein-4b 5+20, klein-9b 8+24).
  std::optional<int64_t> num_layers, num_single_layers;
  // Text encoder decoder layers (std::nullopt: the variant's, dev 40, klein 36).
  std::optional<int64_t> text_encoder_layers;
  DType dtype = DType::bf16;
  uint64_t seed = 0;
  bool layout_only = false;  // RandomFolderContents::layout_only
};

// The variant's architectures with the options' depths.
Flux2TransformerRandomConfig flux2_transformer_random_config(const Flux2RandomOptions& options);
CausalLmRandomConfig flux2_text_encoder_random_config(const Flux2RandomOptions& options);

// The weight components in the order they are written: text_encoder, transformer, vae.
std::vector<RandomComponent> flux2_random_components(const Flux2RandomOptions& options);
nlohmann::json flux2_model_index(Flux2Variant variant);
nlohmann::json flux2_scheduler_config(Flux2Variant variant);

// What write_flux2_random_folder writes: the components, the text files and the tokenizer
// folder `tokenizers_from`/tokenizer copied to tokenizer/. Checks the options.
RandomFolderContents flux2_random_contents(const Flux2RandomOptions& options,
                                           const std::filesystem::path& tokenizers_from);

// Writes the folder (see above), the tokenizer copied from `tokenizers_from`/tokenizer. Before any
// work it checks, with errors naming what is wrong: the options; the tokenizer folder; DIR not
// existing or being an empty folder (missing parents are created, and removed again on
// failure); and enough free space.
RandomFolder write_flux2_random_folder(const std::filesystem::path& dir, const Flux2RandomOptions& options,
                                       const std::filesystem::path& tokenizers_from,
                                       const RandomFolderProgress& progress = {});

}  // namespace kiln::random_weights
