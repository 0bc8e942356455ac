#include "pipelines/component_file.h"

#include "models/transformer_families.h"
#include "nn/key_mapped_source.h"

namespace kiln {

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
  const io::DetectedLayout layout = detect_original_layout(*source, component);
  if (layout.layout != io::Layout::diffusers)
    source = std::make_shared<const nn::KeyMappedSource>(std::move(source), original_key_map(layout.layout), layout.prefix);
  if (audit) audit->opened(source);
  return source;
}

}  // namespace kiln
