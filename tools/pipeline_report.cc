// What a run's report says of the loaded pipeline: the dtype each component computes in, the
// bytes its weights hold (by dtype and by where they live), and the memory estimate of the call.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pipelines/diffusion_pipeline.h"

namespace kiln::cli {

nlohmann::json dtype_report(const DiffusionPipeline& pipe) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [component, dtype] : pipe.dtypes()) out[component] = dtype_name(dtype);
  return out;
}

nlohmann::json quantization_report(const PipelineOptions& options) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [component, type] : options.quantize) out[component]["quantize"] = dtype_name(type);
  for (const auto& [component, file] : options.component_files) out[component]["file"] = file.string();
  return out;
}

nlohmann::json weight_bytes_report(const DiffusionPipeline& pipe) {
  nlohmann::json components = nlohmann::json::object();
  std::map<std::string, size_t> by_dtype, by_place;
  size_t total = 0;
  for (const DiffusionPipeline::WeightBytes& w : pipe.weight_bytes()) {
    size_t mine = 0;
    for (const auto& [k, v] : w.by_dtype) by_dtype[k] += v, mine += v;
    for (const auto& [k, v] : w.by_place) by_place[k] += v;
    components[w.component] = {{"total", mine}, {"by_dtype", w.by_dtype}, {"by_place", w.by_place}};
    total += mine;
  }
  return {{"total", total}, {"by_dtype", by_dtype}, {"by_place", by_place}, {"components", components}};
}

nlohmann::json estimate_report(const DiffusionPipeline& pipe, const PipelineCallArgs& call, const PipelineOutput& result) {
  PipelineCallArgs sized = call;
  sized.height = result.height;
  sized.width = result.width;
  // The plan of the decode the call ran (untiled or tiled: the call's memory plan chose).
  const MemoryEstimate e = pipe.estimate_memory(sized, result.vae_tile_size);
  nlohmann::json components = nlohmann::json::object();
  size_t largest_activations = 0;
  for (const ComponentMemory& m : e.components) {
    components[m.name] = {{"weight_bytes", m.weight_bytes}, {"activation_bytes", m.activation_bytes}};
    largest_activations = std::max(largest_activations, m.activation_bytes);
  }
  // The process's memory at its peak, as the plan sees it: the weights held in host memory
  // plus what the call needs on the device, which for the CPU device is host memory too. Copies
  // converted at load stay; mapped checkpoint pages count only while kernels read them in place
  // (a device copy's source pages leave the resident set as it is made: exec/residency.h).
  size_t host_weights = 0;
  for (const DiffusionPipeline::WeightBytes& w : pipe.weight_bytes())
    for (const auto& [place, bytes] : w.by_place)
      if (place == "host_copy" || (place == "mapped_file" && e.placement == "host")) host_weights += bytes;
  return {{"placement", e.placement},
          {"required_bytes", e.required},
          {"host_peak_bytes", host_weights + e.required},
          {"largest_activation_bytes", largest_activations},
          {"carried_bytes", e.carried_bytes},
          {"vae_tile_size", e.vae_tile_size},
          {"components", components}};
}

}  // namespace kiln::cli
