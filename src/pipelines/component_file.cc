#include "pipelines/component_file.h"

#include "core/error.h"
#include "models/flux/flux_original_keys.h"
#include "models/flux2/flux2_original_keys.h"
#include "models/sd3/sd3_original_keys.h"
#include "models/vae/ldm_vae_keys.h"
#include "nn/key_mapped_source.h"

namespace kiln {

// The families' key maps are data beside their models; this is the one place that lists them.
const io::KeyMap& original_key_map(io::Layout layout) {
  switch (layout) {
    case io::Layout::flux1_bfl: return flux1_original_key_map();
    case io::Layout::flux2_bfl: return flux2_original_key_map();
    case io::Layout::sd3_stability: return sd3_original_key_map();
    case io::Layout::ldm_vae: return ldm_vae_key_map();
    case io::Layout::diffusers: break;
  }
  fail("key map", "the Diffusers layout has no key map (its names are read as they are)");
}

std::shared_ptr<const nn::WeightSource> open_component_file(const std::filesystem::path& file,
                                                            const std::string& component) {
  nn::CheckpointAudit* audit = nn::CheckpointAudit::active();
  std::shared_ptr<const nn::WeightSource> source;
  {
    // The file's own source is audited through the view returned (its keys outside the
    // component's prefix belong to other components, not to the unused-tensor check).
    nn::CheckpointAudit inner;
    source = nn::open_checkpoint(file);
  }
  const io::DetectedLayout layout = nn::detect_layout(*source, component);
  if (layout.layout != io::Layout::diffusers)
    source = std::make_shared<const nn::KeyMappedSource>(std::move(source), original_key_map(layout.layout), layout.prefix);
  if (audit) audit->opened(source);
  return source;
}

}  // namespace kiln
