// Writing the random folder `--like NAME` asks for (make_random.cc): kiln make-random's work,
// which kiln plan --like reuses to get a layout-only folder of a model it has no weights for.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "random_checkpoint/random_folder.h"

namespace kiln::cli {

struct RandomLike {
  std::filesystem::path dir;
  std::string like;                   // flux1-schnell, sd3.5-medium, flux2-dev, ... (checked by the caller)
  std::optional<std::string> blocks;  // --blocks: D+S (FLUX.1, FLUX.2) or N (SD3)
  std::optional<int64_t> t5_layers, text_encoder_layers;
  DType dtype = DType::bf16;
  uint64_t seed = 0;
  bool layout_only = false;
};

// Writes the folder; `what` gets its depths in words, `note` a line to print after the first
// (empty when none is needed).
random_weights::RandomFolder write_random_like(const RandomLike& spec, const random_weights::RandomFolderProgress& progress,
                                               std::string* what, std::string* note);

}  // namespace kiln::cli
