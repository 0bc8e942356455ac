// The Stable Diffusion 3 checkpoints kiln make-random imitates (--like):
// stabilityai/stable-diffusion-3-medium-diffusers and stabilityai/stable-diffusion-3.5-medium
// differ only in the transformer: 3.5 Medium adds MMDiT-X dual attention in
// blocks 0-12, QK RMSNorm, and a 384 x 384 positional table (3.0: 192 x 192).
#pragma once
#include <optional>
#include <string>

namespace kiln::random_weights {

enum class Sd3Variant { sd3_medium, sd35_medium };

// "sd3-medium" / "sd3.5-medium".
const char* sd3_variant_name(Sd3Variant v);
// The variant a --like value names, or nullopt.
std::optional<Sd3Variant> parse_sd3_variant(const std::string& name);

}  // namespace kiln::random_weights
