// What DiffusionPipeline holds for every pipeline: the folder, the options, each model
// component's weights and dtype in model_cpu_offload_seq order, where the weights are now, and
// the per-size activation traces the memory checks reuse. Built by PipelineLoader.
#pragma once
#include <array>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "exec/residency.h"
#include "pipelines/diffusion_pipeline.h"

namespace kiln {

enum class Placement { host, device, model_offload };

struct PipelineComponent {
  std::string name;  // "text_encoder", "transformer", ...
  ComponentWeights weights;
  DType dtype = DType::f32;  // torch_dtype it was loaded in
  std::filesystem::path dir;  // its folder (error messages name it)
};

struct PipelineState {
  std::filesystem::path dir;
  PipelineOptions options;
  double load_seconds = 0;
  std::vector<PipelineComponent> components;  // model_cpu_offload_seq order
  Placement placement = Placement::host;
  Device device = default_device();
  std::vector<OffloadEvent> events;
  // One call at a time: a call moves weights (offload) that another call's kernels may be using.
  std::mutex call_mu;
  std::mutex activations_mu;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, ComponentActivations> traced_activations;
};

}  // namespace kiln
