#include "random_checkpoint/sd3_variant.h"

namespace kiln::random_weights {

const char* sd3_variant_name(Sd3Variant v) { return v == Sd3Variant::sd35_medium ? "sd3.5-medium" : "sd3-medium"; }

std::optional<Sd3Variant> parse_sd3_variant(const std::string& name) {
  if (name == "sd3-medium") return Sd3Variant::sd3_medium;
  if (name == "sd3.5-medium") return Sd3Variant::sd35_medium;
  return std::nullopt;
}

}  // namespace kiln::random_weights
