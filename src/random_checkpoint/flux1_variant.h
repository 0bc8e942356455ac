// The FLUX.1 checkpoints kiln make-random imitates (--like): black-forest-labs/FLUX.1-schnell
// and FLUX.1-dev differ in the transformer's guidance embedding and the scheduler's shifting.
#pragma once
#include <optional>
#include <string>

namespace kiln::random_weights {

enum class Flux1Variant { schnell, dev };

// "flux1-schnell" / "flux1-dev".
const char* flux1_variant_name(Flux1Variant v);
// The variant a --like value names, or nullopt.
std::optional<Flux1Variant> parse_flux1_variant(const std::string& name);

}  // namespace kiln::random_weights
