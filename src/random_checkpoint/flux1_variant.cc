#include "random_checkpoint/flux1_variant.h"

namespace kiln::random_weights {

const char* flux1_variant_name(Flux1Variant v) { return v == Flux1Variant::dev ? "flux1-dev" : "flux1-schnell"; }

std::optional<Flux1Variant> parse_flux1_variant(const std::string& name) {
  if (name == "flux1-schnell") return Flux1Variant::schnell;
  if (name == "flux1-dev") return Flux1Variant::dev;
  return std::nullopt;
}

}  // namespace kiln::random_weights
