// A complete Diffusers FLUX.1 folder with deterministic random weights (kiln make-random): real
// widths, chosen depths, weights in a chosen dtype, so speed and memory can be measured at real
// size without the 30 GB download. model_index.json, scheduler/scheduler_config.json and every
// component's config.json are the Hub's (black-forest-labs/FLUX.1-schnell or FLUX.1-dev) with
// the depths replaced; the tokenizers are copied from a folder given (kiln's bundled fixture);
// the weights are streamed to disk, sharded as the Hub's save_pretrained would (one file per
// component unless it passes 10 GB for Diffusers components, 5 GB for transformers ones).
//
// The folder is written as a hidden temporary next to DIR and renamed onto it at the end, so a
// failed run leaves no DIR (a killed run leaves the temporary, which the next run removes): see
// random_folder.h.
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "random_checkpoint/flux1_variant.h"
#include "random_checkpoint/random_component.h"
#include "random_checkpoint/random_folder.h"

namespace kiln::random_weights {

struct Flux1RandomOptions {
  Flux1Variant variant = Flux1Variant::schnell;
  int64_t num_layers = 19;         // double-stream transformer blocks
  int64_t num_single_layers = 38;  // single-stream transformer blocks
  int64_t t5_layers = 24;
  DType dtype = DType::bf16;
  uint64_t seed = 0;
  bool layout_only = false;  // RandomFolderContents::layout_only
};

// The weight components in the order they are written: text_encoder, text_encoder_2,
// transformer, vae.
std::vector<RandomComponent> flux1_random_components(const Flux1RandomOptions& options);
nlohmann::json flux1_model_index();
nlohmann::json flux1_scheduler_config(Flux1Variant variant);

using Flux1RandomProgress = RandomFolderProgress;
using Flux1RandomFolder = RandomFolder;  // components as flux1_random_components orders them

// Writes the folder (see above). Before any work it checks, with errors naming what is wrong:
// the options; `tokenizers_from` holding tokenizer/ and tokenizer_2/; DIR not existing or being
// an empty folder (missing parents are created, and removed again on failure); and enough free
// space for every file.
Flux1RandomFolder write_flux1_random_folder(const std::filesystem::path& dir, const Flux1RandomOptions& options,
                                            const std::filesystem::path& tokenizers_from,
                                            const Flux1RandomProgress& progress = {});

}  // namespace kiln::random_weights
