// The FLUX.2 checkpoints kiln make-random imitates (--like): black-forest-labs/FLUX.2-dev
// (Mistral Small 3.2 text encoder, guidance embedder, 8+48 blocks of 6144) and FLUX.2 [klein]
// 4B / 9B (Qwen3-4B / Qwen3-8B text encoder, no guidance embedder, 5+20 blocks of 3072 / 8+24
// of 4096).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::random_weights {

enum class Flux2Variant { dev, klein_4b, klein_9b };

// "flux2-dev" / "flux2-klein-4b" / "flux2-klein-9b".
const char* flux2_variant_name(Flux2Variant v);
// The variant a --like value names, or nullopt.
std::optional<Flux2Variant> parse_flux2_variant(const std::string& name);

bool is_klein(Flux2Variant v);
// The pipeline's default text_encoder_out_layers (dev 10, 20, 30; klein 9, 18, 27) and the
// decoder layers they need (their largest: 30, 27). A folder with fewer text encoder layers
// loads only with other out layers (PipelineOptions::text_encoder_out_layers, generate's
// --text-encoder-out-layers).
std::vector<int64_t> flux2_default_out_layers(Flux2Variant v);
int64_t flux2_text_encoder_layers_needed(Flux2Variant v);

}  // namespace kiln::random_weights
