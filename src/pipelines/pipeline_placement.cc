// DiffusionPipeline's placement of its components' weights: read in place from the host,
// to(device), or model CPU offload (each component onloaded when it is used, in
// model_cpu_offload_seq order, and released when the next one starts).
#include <chrono>

#include "core/error.h"
#include "devices/runtime.h"
#include "exec/host.h"
#include "pipelines/diffusion_pipeline.h"
#include "pipelines/pipeline_state.h"

namespace kiln {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void DiffusionPipeline::onload(size_t i) const {
  PipelineComponent& c = s_->components[i];
  if (c.weights.resident()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const auto& progress = s_->options.on_progress;
  if (progress) progress({"onload", c.name, "", -1});
  c.weights.onload(s_->device, s_->placement == Placement::model_offload);
  s_->events.push_back({c.name, "onload", c.weights.bytes(), seconds_since(t0),
                        runtime(s_->device).memory().in_use_bytes});
  if (progress) progress({"onload", c.name, "", s_->events.back().seconds});
}

void DiffusionPipeline::offload(size_t i) const {
  PipelineComponent& c = s_->components[i];
  if (!c.weights.resident()) return;
  const auto t0 = std::chrono::steady_clock::now();
  c.weights.offload();
  s_->events.push_back({c.name, "offload", c.weights.bytes(), seconds_since(t0),
                        runtime(s_->device).memory().in_use_bytes});
}

void DiffusionPipeline::use(const std::string& component) const {
  if (s_->placement != Placement::model_offload) return;
  // Any other resident component (left by a call that failed half-way) leaves too, so at most
  // one is ever resident.
  size_t at = s_->components.size();
  for (size_t j = 0; j < s_->components.size(); ++j) {
    if (s_->components[j].name == component) at = j;
    else offload(j);
  }
  KILN_CHECK(at < s_->components.size(), "pipeline", "internal: no model component '", component, "'");
  onload(at);
}

// maybe_free_model_hooks(): the end of a call under offload releases everything.
void DiffusionPipeline::free_all() const {
  if (s_->placement != Placement::model_offload) return;
  for (size_t i = 0; i < s_->components.size(); ++i) offload(i);
}

DiffusionPipeline& DiffusionPipeline::to(const Device& device) {
  runtime(device);  // "[device] ... not available" for a device this build lacks
  size_t total = 0, largest = 0;
  std::string parts;
  for (const PipelineComponent& c : s_->components) {
    const size_t b = c.weights.device_bytes(device);
    total += b;
    largest = std::max(largest, b);
    parts += (parts.empty() ? "" : ", ") + c.name + " " + format_bytes(b);
  }
  const size_t capacity = runtime(device).memory().capacity_bytes;
  // Fail fast, before copying anything (the rest of the device's memory is what activations get).
  KILN_CHECK(capacity == 0 || total <= capacity, "memory", "to(", device.str(), "): the weights need ",
             format_bytes(total), " (", parts, ") but the device's capacity is ", format_bytes(capacity),
             "; enable_model_cpu_offload() (--offload model) keeps one component at a time on the device (the "
             "largest weighs ", format_bytes(largest), ")");
  std::lock_guard<std::mutex> lock(s_->call_mu);
  free_all();
  s_->placement = Placement::device;
  s_->device = device;
  try {
    for (size_t i = 0; i < s_->components.size(); ++i) onload(i);
  } catch (...) {  // nothing half-placed: back to the host
    for (size_t i = 0; i < s_->components.size(); ++i) offload(i);
    s_->placement = Placement::host;
    throw;
  }
  return *this;
}

namespace {

// Model offload holds a component in host memory only while it is not on the device, and then a
// copy made at load has no checkpoint pages to fall back on: its bytes move into a spill file
// (exec/residency.h), so a transformer quantized at load is held once, not twice, and not at
// all while the text encoders run. A folder without room keeps them in memory, with a warning.
void spill_host_copies(PipelineState& s) {
  size_t total = 0;
  for (const PipelineComponent& c : s.components) total += c.weights.host_copy_bytes();
  const std::filesystem::path dir = offload_spill_dir();
  if (total == 0 || dir.empty()) return;
  const auto keep = [&](const std::string& why) {
    if (s.options.on_warning)
      s.options.on_warning("model offload keeps " + format_bytes(total) +
                           " of weights made at load in memory: " + why +
                           " (KILN_SPILL_DIR names a folder on disk for them)");
  };
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const FolderSpace space = folder_space(dir);
  constexpr size_t kLeaveFree = size_t(1) << 30;
  if (space.in_memory) return keep(dir.string() + " is in memory (tmpfs)");
  if (space.free_bytes < total + kLeaveFree)
    return keep(dir.string() + " has " + format_bytes(space.free_bytes) + " free");
  try {
    const std::shared_ptr<SpillFile> file = SpillFile::create(dir);
    for (PipelineComponent& c : s.components) c.weights.spill_host_copies(*file);
  } catch (const Error& e) {  // what was spilled stays spilled; the rest stays in memory
    keep(e.what());
  }
}

}  // namespace

DiffusionPipeline& DiffusionPipeline::enable_model_cpu_offload(const Device& device) {
  std::lock_guard<std::mutex> lock(s_->call_mu);
  runtime(device);
  KILN_CHECK(!s_->options.tensor_parallel, "pipeline",
             "model CPU offload with tensor parallelism is not supported: the sharded "
             "transformer already fits each rank");
  if (s_->placement == Placement::device)  // everything back to the host first
    for (size_t i = 0; i < s_->components.size(); ++i) offload(i);
  s_->placement = Placement::model_offload;
  s_->device = device;
  spill_host_copies(*s_);
  return *this;
}

std::vector<std::string> DiffusionPipeline::model_cpu_offload_seq() const {
  std::vector<std::string> names;
  for (const PipelineComponent& c : s_->components) names.push_back(c.name);
  return names;
}

const std::vector<OffloadEvent>& DiffusionPipeline::offload_events() const { return s_->events; }
void DiffusionPipeline::clear_offload_events() { s_->events.clear(); }

}  // namespace kiln
