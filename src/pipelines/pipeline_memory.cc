// DiffusionPipeline's memory plan: what a call needs on the device per component (weights exactly,
// activations traced op by op, nothing run), for the placement in force, and the fail-fast
// messages when it does not fit. Split from diffusion_pipeline.cc: the plan is its own concern.
#include <cstdio>
#include <map>
#include <optional>

#include "core/env.h"
#include "core/error.h"
#include "devices/runtime.h"
#include "exec/capture.h"
#include "exec/memory_plan.h"
#include "models/vae/autoencoder_kl.h"
#include "pipelines/diffusion_pipeline.h"
#include "pipelines/pipeline_checks.h"
#include "pipelines/pipeline_state.h"

namespace kiln {

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

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
  e.carried_bytes = carried_bytes(args, h, w, msl);
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

}  // namespace kiln
