// What a pipeline call needs in memory, per component (DiffusionPipeline::estimate_memory), and
// the moves of model offload, for reports and the fail-fast checks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// One move of a component's weights (model offload), for reports and tests.
struct OffloadEvent {
  std::string component;  // a model component, e.g. "text_encoder", "transformer", "vae"
  std::string action;     // "onload" or "offload"
  size_t bytes = 0;       // the component's weights
  double seconds = 0;     // the copy (onload) or release (offload)
  size_t device_in_use = 0;  // device bytes in use right after it
};

// What one call needs on the device (model offload's fail-fast check).
struct ComponentMemory {
  std::string name;
  size_t weight_bytes = 0;
  size_t activation_bytes = 0;  // peak of its forward run op by op, at the call's sizes
};
struct MemoryEstimate {
  std::vector<ComponentMemory> components;  // in model_cpu_offload_seq order
  std::string placement;                    // "host", "device" or "model offload"
  size_t carried_bytes = 0;  // what the pipeline keeps across components: embeddings, latents, ids, RoPE tables
  size_t required = 0;       // for that placement, carried bytes included
  // The VAE decode the plan is for: untiled (0), or tiles of this many image pixels per side.
  int64_t vae_tile_size = 0;
  size_t capacity = 0;                      // the device's (0 = unlimited)
  bool physical_limit = false;  // capacity is the memory the device can still get (none was set)
  bool fits() const { return capacity == 0 || required <= capacity; }
};

// "1.50 GiB", "312.0 MiB", "4.0 KiB", "12 B".
std::string format_bytes(size_t bytes);

}  // namespace kiln
