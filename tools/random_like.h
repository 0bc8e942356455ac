// Writing the random folder `--like NAME` asks for (make_random.cc): kiln make-random's work,
// which kiln plan --like reuses to get a layout-only folder of a model it has no weights for.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "core/dtype.h"
#include "random_checkpoint/random_folder.h"

namespace kiln::cli {

struct RandomLike {
  std::filesystem::path dir;
  std::string like;                   // flux1-schnell, sd3.5-medium, flux2-dev, ... (checked by the caller)
  // Depth flags as written ("--blocks" -> "19+38"), read as the recipe says (like_recipe.h).
  std::map<std::string, std::string> depths;
  DType dtype = DType::bf16;
  uint64_t seed = 0;
  bool layout_only = false;
};

// Writes the folder; `what` gets its depths in words, `note` a line to print after the first
// (empty when none is needed).
random_weights::RandomFolder write_random_like(const RandomLike& spec, const random_weights::RandomFolderProgress& progress,
                                               std::string* what, std::string* note);

}  // namespace kiln::cli
