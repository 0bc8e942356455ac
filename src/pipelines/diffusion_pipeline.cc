#include "pipelines/diffusion_pipeline.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>

#include "core/env.h"
#include "core/error.h"
#include "devices/runtime.h"
#include "exec/ops.h"
#include "exec/capture.h"
#include "exec/deferred.h"
#include "exec/host.h"
#include "exec/memory_plan.h"
#include "exec/profile.h"
#include "models/vae/autoencoder_kl.h"
#include "pipelines/image_processor.h"
#include "pipelines/pipeline_checks.h"
#include "pipelines/pipeline_state.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

DiffusionPipeline::DiffusionPipeline(std::unique_ptr<PipelineState> state) : s_(std::move(state)) {}
DiffusionPipeline::DiffusionPipeline(DiffusionPipeline&&) noexcept = default;
DiffusionPipeline& DiffusionPipeline::operator=(DiffusionPipeline&&) noexcept = default;
DiffusionPipeline::~DiffusionPipeline() = default;

// ---- placement ----

void DiffusionPipeline::onload(size_t i) const {
  PipelineComponent& c = s_->components[i];
  if (c.weights.resident()) return;
  const auto t0 = std::chrono::steady_clock::now();
  c.weights.onload(s_->device, s_->placement == Placement::model_offload);
  s_->events.push_back({c.name, "onload", c.weights.bytes(), seconds_since(t0),
                        runtime(s_->device).memory().in_use_bytes});
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

std::vector<std::pair<std::string, DType>> DiffusionPipeline::dtypes() const {
  std::vector<std::pair<std::string, DType>> out;
  for (const PipelineComponent& c : s_->components) out.emplace_back(c.name, c.dtype);
  return out;
}

std::vector<DiffusionPipeline::WeightBytes> DiffusionPipeline::weight_bytes() const {
  std::vector<WeightBytes> out;
  for (const PipelineComponent& c : s_->components) {
    ComponentWeights::Bytes b = c.weights.bytes_by();
    out.push_back({c.name, std::move(b.by_dtype), std::move(b.by_place)});
  }
  return out;
}

double DiffusionPipeline::load_seconds() const { return s_->load_seconds; }
const fs::path& DiffusionPipeline::model_dir() const { return s_->dir; }
const fs::path& DiffusionPipeline::dir() const { return s_->dir; }
int64_t DiffusionPipeline::vae_scale_factor() const { return vae().config().vae_scale_factor(); }

// ---- memory ----

size_t DiffusionPipeline::physical_available() const {
  return env::choice("KILN_HOST_MEMORY_CHECK").value_or("1") == "1" ? runtime(s_->device).physical_available_bytes()
                                                                    : 0;
}

// The memory a call may use on the device: its capacity or, without one, what the device can
// still get beyond what it holds (the host's, on the CPU; KILN_HOST_MEMORY_CHECK=0: no limit).
// 0: no limit known.
size_t DiffusionPipeline::memory_limit() const {
  const MemoryStats mem = runtime(s_->device).memory();
  if (mem.capacity_bytes) return mem.capacity_bytes;
  const size_t physical = physical_available();
  return physical ? physical + mem.in_use_bytes : 0;
}

size_t DiffusionPipeline::trace_peak_bytes(const char* what, const std::function<Tensor()>& f) {
  return unfused_peak_bytes_on(detail::capture(what, [&] { return std::vector<Tensor>{f()}; }).recorded,
                               default_device());
}

// Traced once per size (nothing runs), then remembered, since every call checks its memory first.
ComponentActivations DiffusionPipeline::activations(int64_t h, int64_t w, int64_t max_sequence_length,
                                                    int64_t vae_tile_size) const {
  std::lock_guard<std::mutex> lock(s_->activations_mu);
  const auto key = std::make_tuple(h, w, max_sequence_length, vae_tile_size);
  if (const auto it = s_->traced_activations.find(key); it != s_->traced_activations.end()) return it->second;
  DeviceRuntime& rt = runtime(s_->device);
  // The traces upload their small inputs (token ids, position tables) as real tensors. They
  // must not count against the capacity being checked, or a capacity too small even for them
  // would fail in the allocator instead of with the estimate's numbers. The capacity is the
  // device's, so lifts are serialised process-wide: two overlapping ones could otherwise
  // restore each other's 0. (Another thread allocating during a lift is not capped.)
  static std::mutex lift_mu;
  std::lock_guard<std::mutex> lift_lock(lift_mu);
  struct CapacityLifted {
    DeviceRuntime& rt;
    size_t capacity;
    ~CapacityLifted() { rt.set_memory_capacity(capacity); }
  } lifted{rt, rt.memory().capacity_bytes};
  rt.set_memory_capacity(0);
  // Traced where the weights are now, so the trace's own inputs sit beside them: the device once
  // placed there, else host memory, where the traces' placeholders (exec/capture.h) live too.
  const Device host = placeholder_tensor({}, DType::f32).device();
  const DefaultDeviceGuard beside_weights(s_->placement == Placement::device ? s_->device : host);
  return s_->traced_activations[key] = trace_activations(h, w, max_sequence_length, vae_tile_size);
}

// Tiles of 4 latent pixels' multiples are the ones whose seams keep the image's size: Diffusers'
// tiled decode steps 3/4 of a tile, keeps a tile less its blended quarter, and has no final crop,
// so any other tile repeats pixels (16-pixel tiles turn a 64x64 image into 92x92). Refused rather
// than cropped: a crop would keep the repeated pixels, an image Diffusers never makes either.
int64_t DiffusionPipeline::vae_tile_multiple() const { return 4 * vae_scale_factor(); }

void DiffusionPipeline::check_vae_tile_size(int64_t tile) const {
  const int64_t multiple = vae_tile_multiple();
  KILN_CHECK(tile >= multiple && tile <= pipeline_checks::kMaxSide && tile % multiple == 0, "pipeline",
             "vae_tile_size (--vae-tile-size) is ", tile, " image pixels; expected a multiple of ", multiple, " from ",
             multiple, " to ", pipeline_checks::kMaxSide,
             " (4 latent pixels of this VAE: other tiles change the decoded image's size)");
}

int64_t DiffusionPipeline::requested_vae_tile(const PipelineCallArgs& args) const {
  if (args.vae_tile_size) {
    check_vae_tile_size(*args.vae_tile_size);
    return *args.vae_tile_size;
  }
  const int64_t tile = vae().config().sample_size, multiple = vae_tile_multiple();
  KILN_CHECK(tile >= multiple && tile % multiple == 0, "pipeline", "the VAE's sample_size (",
             (dir() / "vae" / "config.json").string(), ") is ", tile,
             ", which cannot be its decode's tile (expected a multiple of ", multiple,
             "); give vae_tile_size (--vae-tile-size) or --vae-tiling off");
  return tile;
}

size_t DiffusionPipeline::decode_activation_bytes(int64_t h, int64_t w, int64_t vae_tile_size,
                                                  int64_t traced_tiles) const {
  const AutoencoderKL& v = vae();
  // The VAE's input only needs its shape (nothing runs): host memory, not the device's budget.
  const auto latents = [&](int64_t lh, int64_t lw) {
    return placeholder_tensor({1, v.config().latent_channels, lh, lw}, DType::f32);
  };
  const auto whole = [&] {
    const Tensor z = latents(h, w);
    return trace_peak_bytes("vae", [&] { return decode(z, vae_tile_size); });
  };
  if (vae_tile_size == 0) return whole();
  const VaeTileGrid grid = v.tile_grid(h, w, VaeTiling{vae_tile_size});
  // A trace records every tile's ops: quick for a few tiles (and what the tests measure against),
  // minutes and gigabytes for the 390,000 tiles of 30000x30000 in 64-pixel tiles.
  if (grid.whole || grid.count() <= traced_tiles) return whole();
  DeviceRuntime& rt = runtime(default_device());
  const auto allocation_size = [&rt](size_t bytes) { return rt.allocation_size(bytes); };
  // One tile of each shape, decoded after a largest one whose output is kept (as the tiled decode
  // keeps every tile's), so what that one's last ops still hold is counted; its output is not.
  const int64_t lh = grid.rows.front().first, lw = grid.cols.front().first;
  const size_t largest_output =
      allocation_size(size_t(lh * lw) * size_t(v.config().vae_scale_factor() * v.config().vae_scale_factor()) *
                      size_t(v.config().out_channels) * dtype_size(v.dtype()));
  std::map<std::pair<int64_t, int64_t>, size_t> peaks;
  const auto tile_peak = [&](int64_t th, int64_t tw) {
    const auto [it, added] = peaks.try_emplace({th, tw}, 0);
    if (added) {
      const Tensor first = latents(lh, lw), next = latents(th, tw);
      const Graph g = detail::capture("vae", [&] {
                        return std::vector<Tensor>{v.decode(first), v.decode(next)};
                      }).recorded;
      it->second = unfused_peak_bytes_on(g, default_device()) - largest_output;
    }
    return it->second;
  };
  // In flight as unfused_peak_bytes_on counts it: the queued items, the one running and the one
  // being enqueued.
  return v.tiled_decode_peak_bound(grid, tile_peak, allocation_size, rt.max_in_flight() + 2, rt.max_in_flight_bytes());
}

Tensor DiffusionPipeline::decode(const Tensor& z, int64_t vae_tile_size) const {
  return vae_tile_size ? vae().tiled_decode(z, VaeTiling{vae_tile_size}) : vae().decode(z);
}

std::pair<int64_t, int64_t> DiffusionPipeline::requested_size(const PipelineCallArgs& args) const {
  const int64_t side = default_sample_size() * vae_scale_factor();
  return {args.height.value_or(side), args.width.value_or(side)};
}

std::pair<int64_t, int64_t> DiffusionPipeline::rounded_size(const PipelineCallArgs& args) const {
  const int64_t multiple = size_multiple();
  const auto [height, width] = requested_size(args);
  return {height / multiple * multiple, width / multiple * multiple};
}

MemoryEstimate DiffusionPipeline::estimate_memory(const PipelineCallArgs& args) const {
  const int64_t vsf = vae_scale_factor();
  if (args.vae_tile_size) check_vae_tile_size(*args.vae_tile_size);  // whether or not the plan tiles
  switch (args.vae_tiling) {
    case VaeTilingMode::kOff: return estimate_memory(args, 0);
    case VaeTilingMode::kOn: return estimate_memory(args, requested_vae_tile(args));
    case VaeTilingMode::kAuto: break;
  }
  // Untiled when that fits; else the given tile, or the largest that fits, halving from the VAE's
  // (a tile as large as the image would decode it whole) in steps of 4 latent pixels, which keep
  // Diffusers' stride and seam whole, down to 128 image pixels (or the VAE's own smaller tile).
  MemoryEstimate e = estimate_memory(args, 0);
  const size_t limit = memory_limit();
  if (limit == 0 || e.required <= limit) return e;
  const int64_t tile = requested_vae_tile(args);
  if (args.vae_tile_size) return estimate_memory(args, tile);
  const int64_t step = 4 * vsf;
  const auto [height, width] = rounded_size(args);
  const auto halve = [step](int64_t t) { return t / 2 / step * step; };
  int64_t t = tile;
  while (t >= std::max(height, width) && halve(t) >= step) t = halve(t);
  for (;; t = halve(t)) {
    e = estimate_memory(args, t);
    if (e.required <= limit || halve(t) < std::max<int64_t>(step, 128)) break;
  }
  return e;  // the smallest tile's plan when none fits (the call then fails with its numbers)
}

MemoryEstimate DiffusionPipeline::estimate_memory(const PipelineCallArgs& args, int64_t vae_tile_size) const {
  const int64_t multiple = size_multiple(), vsf = vae_scale_factor();
  const auto [height, width] = rounded_size(args);
  KILN_CHECK(height >= multiple && width >= multiple, "pipeline", "height and width must be at least ", multiple);
  const int64_t h = height / vsf, w = width / vsf, msl = max_sequence_length(args);
  MemoryEstimate e;
  e.vae_tile_size = vae_tile_size;
  e.capacity = runtime(s_->device).memory().capacity_bytes;
  std::vector<std::string> names;
  for (const auto& c : s_->components) names.push_back(c.name);
  const std::vector<size_t> act = activations_of(names, activations(h, w, msl, vae_tile_size), class_name());
  size_t all_weights = 0, max_act = 0, max_component = 0;
  for (size_t i = 0; i < s_->components.size(); ++i) {
    const size_t wb = s_->components[i].weights.device_bytes(s_->device);
    e.components.push_back({s_->components[i].name, wb, act[i]});
    all_weights += wb;
    max_act = std::max(max_act, act[i]);
    max_component = std::max(max_component, wb + act[i]);
  }
  e.carried_bytes = carried_bytes(h, w, msl);
  switch (s_->placement) {
    case Placement::host: e.placement = "host"; e.required = max_act; break;
    case Placement::device: e.placement = "device"; e.required = all_weights + max_act; break;
    case Placement::model_offload: e.placement = "model offload"; e.required = max_component; break;
  }
  e.required += e.carried_bytes;
  // Pre-packed weights made before a capacity was set stay on the device (compiled mode makes
  // no new ones under a capacity): what they hold is not available to this call.
  e.required += runtime(s_->device).memory().derived_bytes;
  return e;
}

// The fail-fast message: what the call needs, per component, and what would fit instead.
std::string DiffusionPipeline::memory_misfit(const MemoryEstimate& e, const PipelineCallArgs& args) const {
  std::string parts;
  size_t largest = 0;
  for (const ComponentMemory& m : e.components) {
    parts += (parts.empty() ? "" : ", ") + m.name + " " + format_bytes(m.weight_bytes) + " weights + " +
             format_bytes(m.activation_bytes) + " activations";
    largest = std::max(largest, m.weight_bytes + m.activation_bytes);
  }
  largest += e.carried_bytes;
  const std::string where = e.placement == "host"     ? "with the weights read in place from the host"
                            : e.placement == "device" ? "with every component's weights on the device"
                                                      : "with model offload";
  const bool host_limit = e.physical_limit;
  std::string msg = std::to_string(*args.height) + "x" + std::to_string(*args.width) + " " + where + " needs " +
                    format_bytes(e.required) + (host_limit ? " of memory but " : " of device memory but ") +
                    (host_limit ? "this machine has only " + format_bytes(e.capacity) + " available"
                                : "the capacity is " + format_bytes(e.capacity)) +
                    " (" + parts + ", " + format_bytes(e.carried_bytes) + " carried between them)";
  std::vector<std::string> options;
  if (e.placement == "device" && largest <= e.capacity)
    options.push_back("--offload model / enable_model_cpu_offload() needs " + format_bytes(largest));
  // A smaller image under the same placement (the transformer's and VAE's activations shrink).
  const int64_t multiple = size_multiple();
  for (int64_t div = 2; *args.height / div >= multiple && *args.width / div >= multiple; div *= 2) {
    PipelineCallArgs smaller = args;
    smaller.height = *args.height / div / multiple * multiple;
    smaller.width = *args.width / div / multiple * multiple;
    MemoryEstimate s = estimate_memory(smaller);
    s.capacity = e.capacity;
    if (s.fits()) {
      options.push_back(std::to_string(*smaller.height) + "x" + std::to_string(*smaller.width) + " needs " +
                        format_bytes(s.required));
      break;
    }
  }
  msg += options.empty() ? (host_limit ? "; nothing smaller fits either" : "; nothing smaller fits either: raise --device-memory")
                         : "; would fit: ";
  for (size_t i = 0; i < options.size(); ++i) msg += (i ? ", or " : "") + options[i];
  return msg;
}

std::optional<std::string> DiffusionPipeline::host_working_set_misfit(const MemoryEstimate& e,
                                                                      size_t physical_total) const {
  if (e.placement != "host" || physical_total == 0) return std::nullopt;
  const ComponentMemory* worst = nullptr;
  size_t all_weights = 0;
  std::string parts;
  for (const ComponentMemory& m : e.components) {
    all_weights += m.weight_bytes;
    parts += (parts.empty() ? "" : ", ") + m.name + " " + format_bytes(m.weight_bytes);
    if (!worst || m.weight_bytes + m.activation_bytes > worst->weight_bytes + worst->activation_bytes) worst = &m;
  }
  const size_t need = worst ? worst->weight_bytes + worst->activation_bytes + e.carried_bytes : 0;
  if (need <= physical_total) return std::nullopt;
  // Tensor parallelism is the way out: each rank reads about 1/N of the sharded components.
  int64_t ranks = 2;
  while (worst && double(worst->weight_bytes) / double(ranks) + double(worst->activation_bytes + e.carried_bytes) >
                      0.9 * double(physical_total) &&
         ranks < 64)
    ranks *= 2;
  return std::string(class_name()) + " reads its " + worst->name + "'s " + format_bytes(worst->weight_bytes) +
         " of weights while it runs" + (worst->name == "transformer" ? " (at every step)" : "") + ", with " +
         format_bytes(worst->activation_bytes) + " of activations, but this machine has " +
         format_bytes(physical_total) + " of memory in all: its weights would be re-read from disk page by page. " +
         "This checkpoint holds " + format_bytes(all_weights) + " of weights (" + parts +
         "); model offload needs the same " + format_bytes(need) + " for that component. Run it on a machine with " +
         "more than " + format_bytes(need) + " of memory, or over machines with --tp N (each rank reads ~1/N of " +
         "the transformer and text encoder; N = " + std::to_string(ranks) + " or more here), or set " +
         "KILN_HOST_MEMORY_CHECK=0 to run it anyway, paging";
}

// ---- compiled mode ----

void DiffusionPipeline::warmup(int64_t height, int64_t width, std::optional<int64_t> max_sequence_length) const {
  const int64_t multiple = size_multiple();
  KILN_CHECK(height >= multiple && width >= multiple, "pipeline", "warmup: height and width must be at least ",
             multiple, ", got ", height, "x", width);
  KILN_CHECK(height <= pipeline_checks::kMaxSide && width <= pipeline_checks::kMaxSide, "pipeline",
             "warmup: height and width must be at most ", pipeline_checks::kMaxSide, ", got ", height, "x", width);
  PipelineCallArgs args;
  args.height = height;
  args.width = width;
  args.max_sequence_length = max_sequence_length;
  const int64_t msl = this->max_sequence_length(args);
  KILN_CHECK(denoiser().any_compiled(), "pipeline",
             "warmup needs a compiled transformer (compile or compile_repeated_blocks first)");
  const auto [h, w] = rounded_size(args);
  warmup_transformer(h / vae_scale_factor(), w / vae_scale_factor(), msl);
}

// ---- __call__ ----

void DiffusionPipeline::finish_step(int64_t i, const Tensor& latents, std::chrono::steady_clock::time_point t0,
                                    const PipelineCallArgs& args, PipelineOutput& out) const {
  const Tensor latents_ok = pipeline_checks::finite_probe(latents);
  mark_step();
  wait(latents);
  const int64_t n = args.num_inference_steps;
  pipeline_checks::expect_finite(
      latents_ok, "transformer step " + std::to_string(i + 1) + "/" + std::to_string(n), dir() / "transformer", {},
      i == 0 ? "the initial latents, the guidance or the transformer's weights"
             : "the transformer's weights or activations overflowing (values beyond the dtype's range)");
  out.timings.steps.push_back(seconds_since(t0));
  if (args.on_step) args.on_step(i, n, out.timings.steps.back());
  if (args.callback_on_step_end) args.callback_on_step_end(i, latents);
}

void DiffusionPipeline::decode_image(const std::function<Tensor()>& latents, int64_t vae_tile_size, Stages& stages,
                                     const PipelineCallArgs& args, PipelineOutput& out) const {
  const auto t0 = std::chrono::steady_clock::now();
  stages.next("vae");
  const auto& vcfg = vae().config();
  const Tensor z = latents() / vcfg.scaling_factor + vcfg.shift_factor;
  use("vae");
  const Tensor image = decode(z, vae_tile_size);
  pipeline_checks::expect_finite(pipeline_checks::finite_probe(image), "VAE decode", dir() / "vae",
                                 AutoencoderKL::checkpoint_keys_not_loaded(),
                                 "the VAE's weights or its config (scaling_factor, shift_factor)");
  out.image = image_processor::to_uint8_hwc(image);
  out.height = image.dim(2);
  out.width = image.dim(3);
  out.timings.decode = seconds_since(t0);
  if (args.on_stage) args.on_stage("decode", out.timings.decode);
}

struct DiffusionPipeline::Stages::Scope {
  std::optional<ProfileScope> profile;
};

DiffusionPipeline::Stages::Stages(const DiffusionPipeline& pipe) : pipe_(pipe), scope_(std::make_unique<Scope>()) {}
DiffusionPipeline::Stages::~Stages() = default;

void DiffusionPipeline::Stages::next(const char* component) {
  if (scope_->profile && profiling()) mark_step();
  // The blocks the allocator keeps for the finished component's activations have other sizes
  // than the next one's: returned to the system, the process holds one component's activations
  // at a time, as the memory plan counts them.
  if (scope_->profile) runtime(pipe_.s_->device).release_cached_memory();
  scope_->profile.emplace(component);
}

void DiffusionPipeline::Stages::end() { scope_->profile.reset(); }

Tensor DiffusionPipeline::on_device(const Tensor& t) const { return kiln::to(t, s_->device); }

DiffusionPipeline::CallGuard::CallGuard(const DiffusionPipeline& pipe)
    : pipe_(pipe), lock_(pipe.s_->call_mu), on_device_(pipe.s_->device) {}

DiffusionPipeline::CallGuard::~CallGuard() {
  try {
    pipe_.free_all();
  } catch (...) {
  }
}

PipelineOutput DiffusionPipeline::operator()(const PipelineCallArgs& args) const {
  const CallGuard guard(*this);
  const auto t_start = std::chrono::steady_clock::now();
  PipelineOutput out;
  check_arguments_taken(args, class_name());
  pipeline_checks::check_bounds("pipeline", "num_inference_steps", args.num_inference_steps, 1,
                                pipeline_checks::kMaxSteps);
  if (args.vae_tile_size) check_vae_tile_size(*args.vae_tile_size);
  const int64_t msl = max_sequence_length(args);
  const int64_t multiple = size_multiple();
  auto [height, width] = requested_size(args);
  KILN_CHECK(height >= multiple && width >= multiple, "pipeline", "height and width must be at least ", multiple,
             ", got ", height, "x", width);
  constexpr int64_t kMaxSide = pipeline_checks::kMaxSide;  // keeps every size computation far from overflow
  KILN_CHECK(height <= kMaxSide && width <= kMaxSide, "pipeline", "height and width must be at most ", kMaxSide,
             ", got ", height, "x", width);
  if (height % multiple || width % multiple) {
    KILN_CHECK(rounds_sizes(), "pipeline", "height and width have to be divisible by ", multiple, " but are ",
               height, " and ", width, " (", class_name(), " does not round them, as in Diffusers)");
    out.warnings.push_back("height and width must be divisible by " + std::to_string(multiple) + "; " +
                           std::to_string(height) + "x" + std::to_string(width) + " is rounded down to " +
                           std::to_string(height / multiple * multiple) + "x" +
                           std::to_string(width / multiple * multiple));
    height = height / multiple * multiple;
    width = width / multiple * multiple;
    if (args.on_warning) args.on_warning(out.warnings.back());
  }
  out.max_sequence_length = msl;
  check_call(args, height, width, out);

  // Fail fast: check what this call needs under the current placement before
  // any work, against the device's capacity or, without one, the memory the device can still get
  // (the host's, on the CPU), and say what would fit instead.
  const MemoryStats mem = runtime(s_->device).memory();
  const size_t physical = physical_available();  // KILN_HOST_MEMORY_CHECK=0: no check
  const size_t limit = memory_limit();
  if (physical != 0) {
    // A floor of host memory first, in closed form, so an absurd size fails before the estimate
    // itself allocates.
    const double floor = host_floor_bytes(height, width, msl);
    KILN_CHECK(floor <= double(physical), "memory", height, "x", width, " needs at least ",
               format_bytes(size_t(floor)), " of memory for its noise, latents, position tables and image alone, but ",
               "this machine has only ", format_bytes(physical), " available; choose a smaller --height/--width");
  }
  // The decode this call runs: the plan's choice, or without a limit to plan against, tiles only
  // when asked for.
  PipelineCallArgs sized = args;
  sized.height = height;
  sized.width = width;
  int64_t vae_tile_size = 0;
  if (limit != 0) {
    MemoryEstimate e = estimate_memory(sized);
    e.capacity = limit;
    e.physical_limit = mem.capacity_bytes == 0;
    if (!e.fits()) fail("memory", memory_misfit(e, sized));
    if (physical != 0)
      if (const auto misfit = host_working_set_misfit(e, runtime(s_->device).physical_total_bytes()))
        fail("memory", *misfit);
    vae_tile_size = e.vae_tile_size;
  } else if (args.vae_tiling == VaeTilingMode::kOn) {
    vae_tile_size = requested_vae_tile(args);
  }
  out.vae_tile_size = vae_tile_size;
  if (args.on_checked) args.on_checked();
  run(args, Sized{height, width, msl, vae_tile_size}, out);
  out.timings.total = seconds_since(t_start);
  return out;
}

const nn::NamedParameters& DiffusionPipeline::transformer_parameters() const { return denoiser().named_parameters(); }

void DiffusionPipeline::compile_transformer(CompileScope scope, const CompileOptions& options) {
  if (scope == CompileScope::kRepeatedBlocks) denoiser().compile_repeated_blocks(options);
  else denoiser().compile(options);
}

}  // namespace kiln
