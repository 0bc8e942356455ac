#include "random_checkpoint/like_names.h"

#include "random_checkpoint/flux1_variant.h"
#include "random_checkpoint/flux2_variant.h"
#include "random_checkpoint/sd3_variant.h"

namespace kiln::random_weights {

const std::vector<LikeFamily>& like_families() {
  static const std::vector<LikeFamily> families = {
      {"FLUX.1", {flux1_variant_name(Flux1Variant::schnell), flux1_variant_name(Flux1Variant::dev)}},
      {"Stable Diffusion 3", {sd3_variant_name(Sd3Variant::sd3_medium), sd3_variant_name(Sd3Variant::sd35_medium)}},
      {"FLUX.2",
       {flux2_variant_name(Flux2Variant::dev), flux2_variant_name(Flux2Variant::klein_4b),
        flux2_variant_name(Flux2Variant::klein_9b)}},
  };
  return families;
}

bool is_like_name(const std::string& name) {
  for (const LikeFamily& f : like_families())
    for (const std::string& n : f.names)
      if (n == name) return true;
  return false;
}

std::string like_names_joined(const std::string& separator) {
  std::string out;
  for (const LikeFamily& f : like_families())
    for (const std::string& n : f.names) out += (out.empty() ? "" : separator) + n;
  return out;
}

std::string like_names_by_family() {
  std::string out;
  for (const LikeFamily& f : like_families()) {
    if (!out.empty()) out += ", ";
    for (size_t i = 0; i < f.names.size(); ++i)
      out += (i == 0 ? "" : i + 1 == f.names.size() ? " or " : ", ") + f.names[i];
    out += std::string(" (") + f.family + ")";
  }
  return out;
}

}  // namespace kiln::random_weights
