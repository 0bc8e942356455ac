#include "random_checkpoint/flux2_variant.h"

namespace kiln::random_weights {

const char* flux2_variant_name(Flux2Variant v) {
  switch (v) {
    case Flux2Variant::klein_4b: return "flux2-klein-4b";
    case Flux2Variant::klein_9b: return "flux2-klein-9b";
    default: return "flux2-dev";
  }
}

std::optional<Flux2Variant> parse_flux2_variant(const std::string& name) {
  if (name == "flux2-dev") return Flux2Variant::dev;
  if (name == "flux2-klein-4b") return Flux2Variant::klein_4b;
  if (name == "flux2-klein-9b") return Flux2Variant::klein_9b;
  return std::nullopt;
}

bool is_klein(Flux2Variant v) { return v != Flux2Variant::dev; }

std::vector<int64_t> flux2_default_out_layers(Flux2Variant v) {
  return is_klein(v) ? std::vector<int64_t>{9, 18, 27} : std::vector<int64_t>{10, 20, 30};
}

int64_t flux2_text_encoder_layers_needed(Flux2Variant v) { return flux2_default_out_layers(v).back(); }

}  // namespace kiln::random_weights
