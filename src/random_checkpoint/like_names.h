// The checkpoints make-random imitates (--like NAME), listed once, by family, from the variants'
// own names (flux1_variant.h, sd3_variant.h, flux2_variant.h): make-random's and plan's parsers,
// their errors and --help read them here, so a new variant is named in one place.
#pragma once
#include <string>
#include <vector>

namespace kiln::random_weights {

struct LikeFamily {
  const char* family;               // "FLUX.1"
  std::vector<std::string> names;  // "flux1-schnell", "flux1-dev"
};
const std::vector<LikeFamily>& like_families();

bool is_like_name(const std::string& name);
// Every name joined by `separator` ("flux1-schnell|flux1-dev|...": --help's value).
std::string like_names_joined(const std::string& separator);
// "flux1-schnell or flux1-dev (FLUX.1), sd3-medium or sd3.5-medium (Stable Diffusion 3), ...":
// what an error expects.
std::string like_names_by_family();

}  // namespace kiln::random_weights
