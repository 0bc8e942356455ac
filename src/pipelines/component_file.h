// A component's weights from one file whatever layout it uses (--transformer FILE, --vae FILE,
// ...): the families' key maps (models/*/..._original_keys.h) put behind nn::KeyMappedSource.
// Lives with the pipelines because it knows every model family; nn and io know none.
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "io/key_map.h"
#include "nn/weight_source.h"

namespace kiln {

// The key map of an original layout (not diffusers).
const io::KeyMap& original_key_map(io::Layout layout);

// Opens `file` (nn::open_checkpoint: safetensors or GGUF), detects its layout for `component`
// ("transformer", "vae", "text_encoder", ...) and returns a KeyMappedSource over it, or the
// file's own source when its keys are Diffusers names already. While a CheckpointAudit is active
// the returned source is the one it audits (unread tensors in the file's original names).
std::shared_ptr<const nn::WeightSource> open_component_file(const std::filesystem::path& file,
                                                            const std::string& component);

}  // namespace kiln
