// A component's weights from one file whatever layout it uses (--transformer FILE, --vae FILE,
// ...): the families' key maps (models/transformer_families.h) put behind nn::KeyMappedSource.
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "io/key_map.h"
#include "nn/weight_source.h"

namespace kiln {

// Opens `file` (nn::open_checkpoint: safetensors or GGUF), detects its layout for `component`
// ("transformer", "vae", "text_encoder", ...) and returns a KeyMappedSource over it, or the
// file's own source when its keys are Diffusers names already. While a CheckpointAudit is active
// the returned source is the one it audits (unread tensors in the file's original names).
std::shared_ptr<const nn::WeightSource> open_component_file(const std::filesystem::path& file,
                                                            const std::string& component);

}  // namespace kiln
