// A complete Diffusers Stable Diffusion 3 / 3.5 Medium folder with deterministic random weights
// (kiln make-random --like sd3-medium|sd3.5-medium): real widths, a chosen transformer and T5
// depth, weights in a chosen dtype, to measure speed and memory at real size without the
// download. The layout:
//   model_index.json            StableDiffusion3Pipeline (tokenizer_3: T5Tokenizer, see below)
//   scheduler/                  FlowMatchEulerDiscreteScheduler, shift 3.0
//   text_encoder/               CLIP-L/14 with projection (clip_text_random.h)
//   text_encoder_2/             OpenCLIP bigG/14 with projection
//   text_encoder_3/             T5 v1.1 XXL encoder (t5_encoder_random.h)
//   tokenizer/, tokenizer_2/    the bundled checkpoint's CLIP tokenizer; tokenizer_2's
//                               special_tokens_map.json and tokenizer_config.json say pad "!"
//                               (SD3's CLIP-G pads with "!")
//   tokenizer_3/                the bundled checkpoint's T5 tokenizer (a slow T5Tokenizer folder:
//                               spiece.model, no tokenizer.json)
//   transformer/                SD3Transformer2DModel (sd3_transformer_random.h)
//   vae/                        AutoencoderKL with SD3's scaling 1.5305 / shift 0.0609
// The weights are streamed to disk and sharded as save_pretrained would (random_folder.h); the
// folder appears at DIR only once complete.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "random_checkpoint/random_component.h"
#include "random_checkpoint/random_folder.h"
#include "random_checkpoint/sd3_variant.h"

namespace kiln::random_weights {

struct Sd3RandomOptions {
  Sd3Variant variant = Sd3Variant::sd35_medium;
  int64_t num_layers = 24;  // transformer blocks
  int64_t t5_layers = 24;
  DType dtype = DType::bf16;
  uint64_t seed = 0;
  bool layout_only = false;  // RandomFolderContents::layout_only
};

// The weight components in the order they are written: text_encoder, text_encoder_2,
// text_encoder_3, transformer, vae.
std::vector<RandomComponent> sd3_random_components(const Sd3RandomOptions& options);
nlohmann::json sd3_model_index(Sd3Variant variant);
nlohmann::json sd3_scheduler_config(Sd3Variant variant);
// tokenizer_2's special_tokens_map.json and tokenizer_config.json: those of the CLIP tokenizer
// folder `clip_tokenizer` with pad_token "!" (and "!" listed in added_tokens_decoder with its
// vocabulary id, as in SD3's file). Errors when "!" is not in its vocab.json.
std::vector<std::pair<std::string, std::string>> sd3_tokenizer_2_files(const std::filesystem::path& clip_tokenizer);

// Writes the folder (see above) from the tokenizers in `tokenizers_from` (kiln's bundled FLUX.1
// checkpoint: tokenizer/ is CLIP's, tokenizer_2/ T5's). Before any work it checks, with errors
// naming what is wrong: the options; the tokenizer folders; DIR not existing or being an empty
// folder (missing parents are created, and removed again on failure); and enough free space.
RandomFolder write_sd3_random_folder(const std::filesystem::path& dir, const Sd3RandomOptions& options,
                                     const std::filesystem::path& tokenizers_from,
                                     const RandomFolderProgress& progress = {});

}  // namespace kiln::random_weights
