#include "pipelines/flux_pipeline.h"

#include <array>
#include <chrono>
#include <map>
#include <tuple>
#include <mutex>

#include "core/env.h"
#include "core/error.h"
#include "devices/runtime.h"
#include "exec/capture.h"
#include "exec/memory_plan.h"
#include "exec/residency.h"
#include "exec/host.h"
#include "exec/profile.h"
#include "exec/ops.h"
#include "io/json_config.h"
#include "nn/weight_source.h"
#include "io/model_folder.h"
#include "io/relative_name.h"
#include "models/clip/clip_text_model.h"
#include "models/flux/flux_transformer.h"
#include "models/t5/t5_encoder.h"
#include "models/vae/autoencoder_kl.h"
#include "pipelines/image_processor.h"
#include "pipelines/pipeline_checks.h"
#include "pipelines/torch_generator.h"
#include "schedulers/flow_match_euler.h"
#include "exec/deferred.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The component folders model_index.json lists, checked before anything is loaded; names
// follow io/relative_name.h (from_pretrained checks every listed name first).
fs::path component(const fs::path& dir, const io::JsonConfig& index, const std::string& name) {
  KILN_CHECK(index.has(name), "pipeline", (dir / "model_index.json").string(), ": component '", name,
             "' is not listed");
  io::check_relative_name("pipeline", dir / "model_index.json", "component", name,
                          "a component folder inside " + dir.string());
  const fs::path p = dir / name;
  KILN_CHECK(fs::is_directory(p), "pipeline", "component folder ", p.string(), " is missing (listed in ",
             (dir / "model_index.json").string(), ")");
  return p;
}

// "1.50 GiB", "312.0 MiB", "4.0 KiB", "12 B".
std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

// The classes model_index.json may name for each component FluxPipeline loads: another class
// under a known folder name (AutoencoderTiny as vae, say) is refused, not loaded as this one.
struct ComponentClass {
  const char* component;
  std::vector<const char*> classes;
};
const std::vector<ComponentClass>& component_classes() {
  static const std::vector<ComponentClass> table = {
      {"tokenizer", {"CLIPTokenizer", "CLIPTokenizerFast"}},
      {"tokenizer_2", {"T5Tokenizer", "T5TokenizerFast"}},
      {"text_encoder", {"CLIPTextModel"}},
      {"text_encoder_2", {"T5EncoderModel"}},
      {"transformer", {"FluxTransformer2DModel"}},
      {"vae", {"AutoencoderKL"}},
      {"scheduler", {"FlowMatchEulerDiscreteScheduler"}},
  };
  return table;
}

void check_component_classes(const io::JsonConfig& index, const fs::path& file) {
  for (const ComponentClass& c : component_classes()) {
    if (!index.has(c.component)) continue;  // component() names a missing entry
    const nlohmann::json& entry = index.json()[c.component];
    const std::string cls = entry.is_array() && entry.size() == 2 && entry[1].is_string() ? entry[1].get<std::string>()
                                                                                             : entry.dump();
    std::string expected;
    bool known = false;
    for (const char* k : c.classes) {
      known = known || cls == k;
      expected += (expected.empty() ? "" : " or ") + std::string(k);
    }
    KILN_CHECK(known, "pipeline", file.string(), ": component '", c.component, "' is ", cls,
               ", which kiln's FluxPipeline does not implement (expected ", expected, ")");
  }
}

// Builds a model while collecting the weights it loads into `weights`, then checks that it read
// every tensor of its checkpoint but those it skips on purpose (`not_loaded`): like Diffusers, a
// warning naming the others; an error with options.strict.
template <typename F>
auto collected(ComponentWeights& weights, const std::vector<std::string>& not_loaded,
               const FluxPipelineOptions& options, F&& build) {
  WeightCollector collect(weights);
  nn::CheckpointAudit audit;
  auto model = build();
  for (const std::string& unused : audit.unused(not_loaded)) {
    const std::string msg = weights.name() + " does not use these checkpoint tensors: " + unused;
    KILN_CHECK(!options.strict, "weights", msg, " (--strict refuses them)");
    if (options.on_warning) options.on_warning(msg);
  }
  return model;
}

// The components whose dtype a caller may choose, in model_cpu_offload_seq order.
constexpr const char* kModelComponents[] = {"text_encoder", "text_encoder_2", "transformer", "vae"};

// torch_dtype of one component: its own choice, else the pipeline's (std::nullopt: "auto",
// resolved by the model's loader from the checkpoint it opens).
std::optional<DType> component_dtype(const FluxPipelineOptions& options, const std::string& name) {
  std::optional<DType> want = options.dtype;
  if (const auto it = options.component_dtype.find(name); it != options.component_dtype.end()) want = it->second;
  KILN_CHECK(!want || is_floating(*want), "pipeline", "dtype for ", name, " must be bf16, f16 or f32, got ",
             dtype_name(*want));
  return want;
}

void check_component_dtype_names(const FluxPipelineOptions& options) {
  for (const auto& [name, dtype] : options.component_dtype) {
    bool known = false;
    for (const char* c : kModelComponents) known = known || name == c;
    KILN_CHECK(known, "pipeline", "dtype given for unknown component '", name,
               "' (FluxPipeline's are text_encoder, text_encoder_2, transformer, vae)");
  }
}

// The value `v` has once stored in dtype `t` (a host scalar rounded as a device tensor would be).
float rounded_to(DType t, float v) {
  char bytes[8];
  store_from_double(bytes, t, 0, double(v));
  return float(load_as_double(bytes, t, 0));
}

enum class Placement { host, device, model_offload };

}  // namespace

struct FluxPipeline::Components {
  fs::path dir;
  FluxPipelineOptions options;
  double load_seconds = 0;
  tokenizers::ClipTokenizer tokenizer;
  tokenizers::T5Tokenizer tokenizer_2;
  ClipTextModel text_encoder;
  T5EncoderModel text_encoder_2;
  FluxTransformer2DModel transformer;
  AutoencoderKL vae;
  FlowMatchEulerConfig scheduler;
  // The models' weights in model_cpu_offload_seq order: text_encoder, text_encoder_2,
  // transformer, vae (runtime.md §4.1.1; FLUX.1 has no image_encoder).
  std::vector<ComponentWeights> weights;
  Placement placement = Placement::host;
  Device device = Device::cpu();
  std::vector<OffloadEvent> events;
  // One call at a time: a call moves weights (offload) that another call's kernels may be using.
  mutable std::mutex call_mu;
  std::mutex activations_mu;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::array<size_t, 4>> traced_activations;

  void onload(size_t i) {
    if (weights[i].resident()) return;
    const auto t0 = std::chrono::steady_clock::now();
    weights[i].onload(device, placement == Placement::model_offload);
    events.push_back({weights[i].name(), "onload", weights[i].bytes(), seconds_since(t0),
                      runtime(device).memory().in_use_bytes});
  }
  void offload(size_t i) {
    if (!weights[i].resident()) return;
    const auto t0 = std::chrono::steady_clock::now();
    weights[i].offload();
    events.push_back({weights[i].name(), "offload", weights[i].bytes(), seconds_since(t0),
                      runtime(device).memory().in_use_bytes});
  }
  // The offload hook before component i runs (§4.1.3): the component before it in the chain
  // leaves the device, then it arrives (if not there already). Any other resident component
  // (left by a call that failed half-way) leaves too, so at most one is ever resident.
  void use(size_t i) {
    if (placement != Placement::model_offload) return;
    for (size_t j = 0; j < weights.size(); ++j)
      if (j != i) offload(j);
    onload(i);
  }
  // The memory a call may use on the device: its capacity or, without one, what the device can
  // still get beyond what it holds (the host's, on the CPU; KILN_HOST_MEMORY_CHECK=0: no limit).
  // 0: no limit known.
  size_t memory_limit() const {
    const MemoryStats mem = runtime(device).memory();
    if (mem.capacity_bytes) return mem.capacity_bytes;
    const size_t physical = physical_available();
    return physical ? physical + mem.in_use_bytes : 0;
  }
  size_t physical_available() const {
    return env::choice("KILN_HOST_MEMORY_CHECK").value_or("1") == "1" ? runtime(device).physical_available_bytes() : 0;
  }
  // The peak activation bytes of each component's forward at these sizes, in
  // model_cpu_offload_seq order: traced once per size (nothing runs), then remembered, since
  // every call checks its memory first. vae_tile_size: the VAE decodes in tiles of that many
  // image pixels (0: untiled).
  std::array<size_t, 4> activations(int64_t h, int64_t w, int64_t max_sequence_length, int64_t vae_tile_size) {
    std::lock_guard<std::mutex> lock(activations_mu);
    const auto key = std::make_tuple(h, w, max_sequence_length, vae_tile_size);
    if (const auto it = traced_activations.find(key); it != traced_activations.end()) return it->second;
    DeviceRuntime& rt = runtime(device);
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
    auto traced = [](const char* what, const std::function<Tensor()>& f) {
      return unfused_peak_bytes_on(detail::capture(what, [&] { return std::vector<Tensor>{f()}; }).recorded,
                                   Device::cpu());
    };
    const Tensor clip_ids = from_ints(std::vector<int64_t>(size_t(tokenizer.model_max_length()), 0),
                                      {1, tokenizer.model_max_length()});
    const Tensor t5_ids = from_ints(std::vector<int64_t>(size_t(max_sequence_length), 0), {1, max_sequence_length});
    const int64_t latent_channels = vae.config().latent_channels;
    // The VAE's input only needs its shape (nothing runs): host memory, not the device's budget.
    const Tensor z = Tensor::view_of(host_allocate(size_t(latent_channels * h * w) * 4), {1, latent_channels, h, w},
                                     DType::f32);
    const std::array<size_t, 4> act = {
        traced("text_encoder", [&] { return text_encoder.forward(clip_ids).pooler_output; }),
        traced("text_encoder_2", [&] { return text_encoder_2.forward(t5_ids).last_hidden_state; }),
        transformer.activation_bytes(1, (h / 2) * (w / 2), max_sequence_length),
        traced("vae", [&] { return decode(z, vae_tile_size); }),
    };
    return traced_activations[key] = act;
  }

  // The tile a call asks for (vae_tile_size, else the VAE's sample_size), in image pixels.
  int64_t requested_vae_tile(const FluxCallArgs& args) const {
    const int64_t vsf = vae.config().vae_scale_factor();
    const int64_t tile = args.vae_tile_size ? args.vae_tile_size : vae.config().sample_size;
    KILN_CHECK(tile >= 2 * vsf, "pipeline", "vae_tile_size must be at least ", 2 * vsf, " image pixels, got ", tile);
    return tile;
  }

  Tensor decode(const Tensor& z, int64_t vae_tile_size) const {
    return vae_tile_size ? vae.tiled_decode(z, VaeTiling{vae_tile_size}) : vae.decode(z);
  }

  // maybe_free_model_hooks(): the end of a call under offload releases everything.
  void free_all() {
    if (placement != Placement::model_offload) return;
    for (size_t i = 0; i < weights.size(); ++i) offload(i);
  }
};

FluxPipeline::FluxPipeline(std::unique_ptr<Components> c) : c_(std::move(c)) {}
FluxPipeline::FluxPipeline(FluxPipeline&&) noexcept = default;
FluxPipeline& FluxPipeline::operator=(FluxPipeline&&) noexcept = default;
FluxPipeline::~FluxPipeline() = default;

FluxPipeline FluxPipeline::from_pretrained(const fs::path& model, const FluxPipelineOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  KILN_CHECK(fs::is_directory(model), "pipeline", "model folder ", model.string(), " does not exist");
  const fs::path dir = io::resolve_model_folder(model);  // a hub cache repo folder: its snapshot
  const io::JsonConfig index(dir / "model_index.json");
  io::model_index_components(index, dir, "pipeline");  // every listed name, before any load
  check_component_classes(index, dir / "model_index.json");
  const std::string cls = index.get_string("_class_name", "");
  KILN_CHECK(cls.empty() || cls == "FluxPipeline", "pipeline", (dir / "model_index.json").string(), ": _class_name is '",
             cls, "', expected FluxPipeline");
  const fs::path paths[] = {component(dir, index, "tokenizer"),      component(dir, index, "tokenizer_2"),
                            component(dir, index, "text_encoder"),   component(dir, index, "text_encoder_2"),
                            component(dir, index, "transformer"),    component(dir, index, "vae"),
                            component(dir, index, "scheduler")};
  check_component_dtype_names(options);
  const std::optional<DType> dtypes[] = {
      component_dtype(options, "text_encoder"), component_dtype(options, "text_encoder_2"),
      component_dtype(options, "transformer"), component_dtype(options, "vae")};
  std::vector<ComponentWeights> weights{ComponentWeights("text_encoder"), ComponentWeights("text_encoder_2"),
                                        ComponentWeights("transformer"), ComponentWeights("vae")};
  auto c = std::unique_ptr<Components>(new Components{
      dir,
      options,
      0,
      tokenizers::ClipTokenizer::from_pretrained(paths[0]),
      tokenizers::T5Tokenizer::from_pretrained(paths[1]),
      collected(weights[0], ClipTextModel::checkpoint_keys_not_loaded(), options,
                [&] { return ClipTextModel::from_pretrained(paths[2], ClipPooledRule::eos2_argmax, dtypes[0]); }),
      collected(weights[1], T5EncoderModel::checkpoint_keys_not_loaded(), options,
                [&] { return T5EncoderModel::from_pretrained(paths[3], dtypes[1]); }),
      collected(weights[2], FluxTransformer2DModel::checkpoint_keys_not_loaded(), options,
                [&] {
                  return options.tensor_parallel
                             ? FluxTransformer2DModel::from_pretrained(paths[4], *options.tensor_parallel, dtypes[2])
                             : FluxTransformer2DModel::from_pretrained(paths[4], dtypes[2]);
                }),
      collected(weights[3], AutoencoderKL::checkpoint_keys_not_loaded(), options,
                [&] { return AutoencoderKL::from_pretrained(paths[5], dtypes[3]); }),
      FlowMatchEulerConfig::load(paths[6] / "scheduler_config.json"),
      std::move(weights),
      Placement::host,
      options.device,
      {},
      {},
      {},
      {},
  });
  c->load_seconds = seconds_since(t0);
  return FluxPipeline(std::move(c));
}

int64_t FluxPipeline::vae_scale_factor() const { return c_->vae.config().vae_scale_factor(); }

std::vector<std::pair<std::string, DType>> FluxPipeline::dtypes() const {
  return {{"text_encoder", c_->text_encoder.dtype()},
          {"text_encoder_2", c_->text_encoder_2.dtype()},
          {"transformer", c_->transformer.dtype()},
          {"vae", c_->vae.dtype()}};
}

std::vector<FluxPipeline::WeightBytes> FluxPipeline::weight_bytes() const {
  std::vector<WeightBytes> out;
  for (const ComponentWeights& w : c_->weights) {
    ComponentWeights::Bytes b = w.bytes_by();
    out.push_back({w.name(), std::move(b.by_dtype), std::move(b.by_place)});
  }
  return out;
}
double FluxPipeline::load_seconds() const { return c_->load_seconds; }
const fs::path& FluxPipeline::model_dir() const { return c_->dir; }

Tensor FluxPipeline::pack_latents(const Tensor& x) {
  const int64_t b = x.dim(0), ch = x.dim(1), h = x.dim(2), w = x.dim(3);
  const Tensor t = permute(reshape(x, {b, ch, h / 2, 2, w / 2, 2}), {0, 2, 4, 1, 3, 5});
  return reshape(t, {b, (h / 2) * (w / 2), ch * 4});
}

Tensor FluxPipeline::unpack_latents(const Tensor& x, int64_t h, int64_t w) {
  const int64_t b = x.dim(0), ch = x.dim(2) / 4;
  const Tensor t = permute(reshape(x, {b, h / 2, w / 2, ch, 2, 2}), {0, 3, 1, 4, 2, 5});
  return reshape(t, {b, ch, h, w});
}

Tensor FluxPipeline::image_ids(int64_t h, int64_t w) {
  std::vector<float> ids;
  ids.reserve(size_t(h / 2 * w / 2 * 3));
  for (int64_t i = 0; i < h / 2; ++i)
    for (int64_t j = 0; j < w / 2; ++j) ids.insert(ids.end(), {0.0f, float(i), float(j)});
  return from_vector(ids, {(h / 2) * (w / 2), 3});
}

FluxTransformer2DModel& FluxPipeline::transformer() { return c_->transformer; }

const std::vector<OffloadEvent>& FluxPipeline::offload_events() const { return c_->events; }
void FluxPipeline::clear_offload_events() { c_->events.clear(); }

FluxPipeline& FluxPipeline::to(const Device& device) {
  runtime(device);  // "[device] ... not available" for a device this build lacks
  size_t total = 0;
  std::string parts;
  for (const ComponentWeights& w : c_->weights) {
    total += w.device_bytes(device);
    parts += (parts.empty() ? "" : ", ") + w.name() + " " + format_bytes(w.device_bytes(device));
  }
  const size_t capacity = runtime(device).memory().capacity_bytes;
  size_t largest = 0;
  for (const ComponentWeights& w : c_->weights) largest = std::max(largest, w.device_bytes(device));
  // Fail fast, before copying anything (the rest of the device's memory is what activations get).
  KILN_CHECK(capacity == 0 || total <= capacity, "memory", "to(", device.str(), "): the weights need ",
             format_bytes(total), " (", parts, ") but the device's capacity is ", format_bytes(capacity),
             "; enable_model_cpu_offload() (--offload model) keeps one component at a time on the device (the "
             "largest weighs ", format_bytes(largest), ")");
  std::lock_guard<std::mutex> lock(c_->call_mu);
  c_->free_all();
  c_->placement = Placement::device;
  c_->device = device;
  try {
    for (size_t i = 0; i < c_->weights.size(); ++i) c_->onload(i);
  } catch (...) {  // nothing half-placed: back to the host
    for (size_t i = 0; i < c_->weights.size(); ++i) c_->offload(i);
    c_->placement = Placement::host;
    throw;
  }
  return *this;
}

FluxPipeline& FluxPipeline::enable_model_cpu_offload(const Device& device) {
  std::lock_guard<std::mutex> lock(c_->call_mu);
  runtime(device);
  KILN_CHECK(!c_->options.tensor_parallel, "pipeline",
             "model CPU offload with tensor parallelism is not supported (runtime.md §4.1.4): the sharded "
             "transformer already fits each rank");
  if (c_->placement == Placement::device)  // §4.1.2 step 4: everything back to the host first
    for (size_t i = 0; i < c_->weights.size(); ++i) c_->offload(i);
  c_->placement = Placement::model_offload;
  c_->device = device;
  return *this;
}

MemoryEstimate FluxPipeline::estimate_memory(const FluxCallArgs& args) const {
  const int64_t vsf = vae_scale_factor();
  const int64_t tile = c_->requested_vae_tile(args);
  switch (args.vae_tiling) {
    case VaeTilingMode::kOff: return estimate_memory(args, 0);
    case VaeTilingMode::kOn: return estimate_memory(args, tile);
    case VaeTilingMode::kAuto: break;
  }
  // Untiled when that fits; else the given tile, or the largest that fits, halving from the VAE's
  // (a tile as large as the image would decode it whole) in steps of 4 latent pixels, which keep
  // Diffusers' stride and seam whole, down to 128 image pixels (or the VAE's own smaller tile).
  MemoryEstimate e = estimate_memory(args, 0);
  const size_t limit = c_->memory_limit();
  if (limit == 0 || e.required <= limit) return e;
  if (args.vae_tile_size) return estimate_memory(args, tile);
  const int64_t step = 4 * vsf, multiple = 2 * vsf;
  const int64_t height = args.height.value_or(default_sample_size() * vsf) / multiple * multiple;
  const int64_t width = args.width.value_or(default_sample_size() * vsf) / multiple * multiple;
  const auto halve = [step](int64_t t) { return t / 2 / step * step; };
  int64_t t = tile;
  while (t >= std::max(height, width) && halve(t) >= step) t = halve(t);
  for (;; t = halve(t)) {
    e = estimate_memory(args, t);
    if (e.required <= limit || halve(t) < std::max<int64_t>(step, 128)) break;
  }
  return e;  // the smallest tile's plan when none fits (the call then fails with its numbers)
}

MemoryEstimate FluxPipeline::estimate_memory(const FluxCallArgs& args, int64_t vae_tile_size) const {
  const int64_t multiple = vae_scale_factor() * 2;
  const int64_t height = args.height.value_or(default_sample_size() * vae_scale_factor()) / multiple * multiple;
  const int64_t width = args.width.value_or(default_sample_size() * vae_scale_factor()) / multiple * multiple;
  KILN_CHECK(height >= multiple && width >= multiple, "pipeline", "height and width must be at least ", multiple);
  const int64_t h = 2 * (height / multiple), w = 2 * (width / multiple), l_img = (h / 2) * (w / 2);
  MemoryEstimate e;
  e.vae_tile_size = vae_tile_size;
  e.capacity = runtime(c_->device).memory().capacity_bytes;
  const std::array<size_t, 4> act = c_->activations(h, w, args.max_sequence_length, vae_tile_size);
  size_t all_weights = 0, max_act = 0, max_component = 0;
  for (size_t i = 0; i < c_->weights.size(); ++i) {
    const size_t wb = c_->weights[i].device_bytes(c_->device);
    e.components.push_back({c_->weights[i].name(), wb, act[i]});
    all_weights += wb;
    max_act = std::max(max_act, act[i]);
    max_component = std::max(max_component, wb + act[i]);
  }
  // Carried from stage to stage (f32): prompt embeddings, pooled embedding, latents and the
  // step's velocity, text/image ids, and the RoPE tables (cos, sin).
  const auto& tc = c_->transformer.config();
  const int64_t L_txt = args.max_sequence_length, S = L_txt + l_img;
  const int64_t carried = L_txt * tc.joint_attention_dim + tc.pooled_projection_dim + 2 * l_img * tc.in_channels +
                          3 * S + 2 * S * tc.attention_head_dim;
  e.carried_bytes = size_t(carried) * 4;
  switch (c_->placement) {
    case Placement::host: e.placement = "host"; e.required = max_act; break;
    case Placement::device: e.placement = "device"; e.required = all_weights + max_act; break;
    case Placement::model_offload: e.placement = "model offload"; e.required = max_component; break;
  }
  e.required += e.carried_bytes;
  // Pre-packed weights made before a capacity was set stay on the device (compiled mode makes
  // no new ones under a capacity): what they hold is not available to this call.
  e.required += runtime(c_->device).memory().derived_bytes;
  return e;
}

void FluxPipeline::warmup(int64_t height, int64_t width, int64_t max_sequence_length) const {
  const int64_t multiple = vae_scale_factor() * 2;
  KILN_CHECK(height >= multiple && width >= multiple, "pipeline", "warmup: height and width must be at least ",
             multiple, ", got ", height, "x", width);
  KILN_CHECK(max_sequence_length >= 1 && max_sequence_length <= 512, "pipeline",
             "max_sequence_length must be in [1, 512], got ", max_sequence_length);
  KILN_CHECK(c_->transformer.is_compiled() || (!c_->transformer.transformer_blocks().empty() &&
                                                c_->transformer.transformer_blocks()[0].is_compiled()) ||
                 (!c_->transformer.single_transformer_blocks().empty() &&
                  c_->transformer.single_transformer_blocks()[0].is_compiled()),
             "pipeline", "warmup needs a compiled transformer (compile or compile_repeated_blocks first)");
  const int64_t h = 2 * (height / multiple), w = 2 * (width / multiple);
  c_->transformer.warmup(1, (h / 2) * (w / 2), max_sequence_length);
}

namespace {

// The fail-fast message: what the call needs, per component, and what would fit instead.
std::string memory_misfit(const FluxPipeline& pipe, const MemoryEstimate& e, const FluxCallArgs& args) {
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
  const int64_t multiple = pipe.vae_scale_factor() * 2;
  for (int64_t div = 2; *args.height / div >= multiple && *args.width / div >= multiple; div *= 2) {
    FluxCallArgs smaller = args;
    smaller.height = *args.height / div / multiple * multiple;
    smaller.width = *args.width / div / multiple * multiple;
    MemoryEstimate s = pipe.estimate_memory(smaller);
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

}  // namespace

FluxOutput FluxPipeline::operator()(const FluxCallArgs& args) const {
  std::lock_guard<std::mutex> lock(c_->call_mu);
  const auto t_start = std::chrono::steady_clock::now();
  FluxOutput out;
  KILN_CHECK(args.num_inference_steps >= 1, "pipeline", "num_inference_steps must be at least 1, got ",
             args.num_inference_steps);
  KILN_CHECK(args.max_sequence_length >= 1 && args.max_sequence_length <= 512, "pipeline",
             "max_sequence_length must be in [1, 512], got ", args.max_sequence_length);
  const int64_t vsf = vae_scale_factor(), multiple = vsf * 2;
  int64_t height = args.height.value_or(default_sample_size() * vsf);
  int64_t width = args.width.value_or(default_sample_size() * vsf);
  KILN_CHECK(height >= multiple && width >= multiple, "pipeline", "height and width must be at least ", multiple,
             ", got ", height, "x", width);
  constexpr int64_t kMaxSide = int64_t(1) << 20;  // keeps every size computation far from overflow
  KILN_CHECK(height <= kMaxSide && width <= kMaxSide, "pipeline", "height and width must be at most ", kMaxSide,
             ", got ", height, "x", width);
  if (height % multiple || width % multiple) {
    out.warnings.push_back("height and width must be divisible by " + std::to_string(multiple) + "; " +
                           std::to_string(height) + "x" + std::to_string(width) + " is rounded down to " +
                           std::to_string(height / multiple * multiple) + "x" +
                           std::to_string(width / multiple * multiple));
    height = height / multiple * multiple;
    width = width / multiple * multiple;
    if (args.on_warning) args.on_warning(out.warnings.back());
  }
  const int64_t h = 2 * (height / multiple), w = 2 * (width / multiple);
  const auto& tcfg = c_->transformer.config();
  const int64_t channels = tcfg.in_channels / 4;
  // As Diffusers, a prompt longer than a text encoder reads is cut, with a warning.
  const std::string& prompt_2 = args.prompt_2.value_or(args.prompt);
  const auto cut = [&](const char* encoder, size_t tokens, int64_t limit, const std::string& why) {
    if (int64_t(tokens) <= limit) return;
    out.warnings.push_back("the " + std::string(encoder) + " prompt is " + std::to_string(tokens) +
                           " tokens but only the first " + std::to_string(limit) + " are used (" + why +
                           "); the rest is cut");
    if (args.on_warning) args.on_warning(out.warnings.back());
  };
  cut("CLIP", c_->tokenizer.encode(args.prompt).size(), c_->tokenizer.model_max_length(),
      "CLIP reads " + std::to_string(c_->tokenizer.model_max_length()) + " tokens");
  cut("T5", c_->tokenizer_2.encode(prompt_2).size(), args.max_sequence_length,
      "max_sequence_length is " + std::to_string(args.max_sequence_length));

  const Shape packed{1, (h / 2) * (w / 2), channels * 4}, unpacked{1, channels, h, w};
  if (args.latents.defined()) {  // checked before any work
    KILN_CHECK(args.latents.shape() == packed || args.latents.shape() == unpacked, "pipeline",
               "initial latents have shape ", to_string(args.latents.shape()), ", expected packed ", to_string(packed),
               " or unpacked ", to_string(unpacked), " for ", height, "x", width);
    pipeline_checks::finite_input("initial latents", args.latents);
  }
  if (tcfg.guidance_embeds)
    pipeline_checks::finite_scalar("guidance_scale", args.guidance_scale, "a finite number (e.g. 3.5)");

  // Fail fast (§4, design.md §4): check what this call needs under the current placement before
  // any work, against the device's capacity or, without one, the memory the device can still get
  // (the host's, on the CPU), and say what would fit instead.
  const MemoryStats mem = runtime(c_->device).memory();
  // KILN_HOST_MEMORY_CHECK=0: no check against the machine's memory (swap, reclaimable caches).
  const size_t physical = c_->physical_available();
  const size_t limit = c_->memory_limit();
  if (physical != 0) {
    // A floor of host memory first, in closed form, so an absurd size fails before the estimate
    // itself allocates: the noise (host vector and tensor), image ids, RoPE tables, latents, and
    // the decoded image (f32 and RGB bytes).
    const double pixels = double(height) * double(width), tokens = double(h / 2) * double(w / 2);
    const double floor = 4.0 * (2 * channels * double(h) * double(w) + 2 * 3 * tokens + 2 * channels * 4 * tokens +
                                2 * (tokens + double(args.max_sequence_length)) * double(tcfg.attention_head_dim) +
                                3 * pixels) +
                         3 * pixels;
    KILN_CHECK(floor <= double(physical), "memory", height, "x", width, " needs at least ",
               format_bytes(size_t(floor)), " of memory for its noise, latents, position tables and image alone, but ",
               "this machine has only ", format_bytes(physical), " available; choose a smaller --height/--width");
  }
  // The decode this call runs: the plan's choice, or without a limit to plan against, tiles only
  // when asked for.
  FluxCallArgs sized = args;
  sized.height = height;
  sized.width = width;
  int64_t vae_tile_size = 0;
  if (limit != 0) {
    MemoryEstimate e = estimate_memory(sized);
    e.capacity = limit;
    e.physical_limit = mem.capacity_bytes == 0;
    if (!e.fits()) fail("memory", memory_misfit(*this, e, sized));
    vae_tile_size = e.vae_tile_size;
  } else if (args.vae_tiling == VaeTilingMode::kOn) {
    vae_tile_size = c_->requested_vae_tile(args);
  }
  out.vae_tile_size = vae_tile_size;
  // Model offload: components are released at the end, also when the call fails.
  struct FreeAtEnd {
    Components& c;
    ~FreeAtEnd() {
      try {
        c.free_all();
      } catch (...) {
      }
    }
  } free_at_end{*c_};

  // Each component's launches, and the device's idle time from where its stage's clock starts,
  // count for it in the profile (exec/profile.h). In deferred mode a component's recorded ops are
  // launched before the next one starts, so they count for it too.
  std::optional<ProfileScope> stage;
  const auto next_stage = [&](const char* component) {
    if (stage && profiling()) mark_step();
    // The blocks the allocator keeps for the finished component's activations have other sizes
    // than the next one's: returned to the system, the process holds one component's activations
    // at a time, as the memory plan counts them.
    if (stage) runtime(c_->device).release_cached_memory();
    stage.emplace(component);
  };

  // 1. Text: CLIP pooled embedding, T5 sequence embedding, zero text ids.
  auto t0 = std::chrono::steady_clock::now();
  next_stage("text_encoder");
  const auto clip_ids = c_->tokenizer.encode_padded(args.prompt);  // to model_max_length (77)
  const auto t5_ids = c_->tokenizer_2.encode_padded(prompt_2, args.max_sequence_length);
  c_->use(0);
  const Tensor pooled =
      c_->text_encoder.forward(from_ints(clip_ids, {1, int64_t(clip_ids.size())})).pooler_output;
  next_stage("text_encoder_2");
  c_->use(1);
  const Tensor prompt_embeds =
      c_->text_encoder_2.forward(from_ints(t5_ids, {1, int64_t(t5_ids.size())})).last_hidden_state;
  const Tensor txt_ids = zeros({int64_t(t5_ids.size()), 3});
  // The transformer computes in its dtype; its inputs arrive in it (the same as the encoders'
  // unless a component was given another dtype, which torch would refuse to mix).
  const DType dt = c_->transformer.dtype();
  const Tensor pooled_in = pooled.dtype() == dt ? pooled : cast(pooled, dt);
  const Tensor embeds_in = prompt_embeds.dtype() == dt ? prompt_embeds : cast(prompt_embeds, dt);
  const Tensor pooled_ok = pipeline_checks::finite_probe(pooled);
  const Tensor embeds_ok = pipeline_checks::finite_probe(prompt_embeds);
  wait(prompt_embeds);
  pipeline_checks::expect_finite(pooled_ok, "text encoder (CLIP, text_encoder)", c_->dir / "text_encoder",
                                 ClipTextModel::checkpoint_keys_not_loaded(),
                                 "the CLIP text encoder's weights or config");
  pipeline_checks::expect_finite(embeds_ok, "text encoder (T5, text_encoder_2)", c_->dir / "text_encoder_2",
                                 T5EncoderModel::checkpoint_keys_not_loaded(),
                                 "the T5 text encoder's weights or config");
  stage.reset();
  out.timings.encode = seconds_since(t0);
  if (args.on_stage) args.on_stage("encode", out.timings.encode);

  // 2. Initial latents (packed) and image ids.
  Tensor latents;
  if (args.latents.defined()) {
    latents = args.latents.rank() == 4 ? pack_latents(args.latents) : args.latents;
    latents = cast(latents, dt);
  } else {
    // fp32 noise, rounded to the dtype (Diffusers draws bf16 noise with another generator path,
    // flux1.md §6.4: pass --latents to reproduce a bf16 run's noise exactly).
    latents = pack_latents(from_vector(TorchGenerator(args.seed).randn(numel(unpacked)), unpacked));
    if (dt != DType::f32) latents = cast(latents, dt);
  }
  const Tensor img_ids = image_ids(h, w);

  // 3. Schedule (resolution-dependent shift for dev checkpoints) and guidance.
  FlowMatchEulerDiscreteScheduler scheduler(c_->scheduler);
  const int64_t image_seq_len = (h / 2) * (w / 2);
  scheduler.set_timesteps(args.num_inference_steps, scheduler.calculate_shift(image_seq_len));
  std::optional<Tensor> guidance;
  // Per-call and per-step scalars are uploaded host data (graph inputs), never op attributes,
  // so deferred/compiled graphs do not depend on their values (runtime.md §2.3.3).
  if (tcfg.guidance_embeds) guidance = from_vector({float(args.guidance_scale)}, {1});

  // 4. Denoising loop: the step count is a host loop; every step runs the same graph. In
  // deferred mode the preparation above is flushed as its own graph first, so the first step's
  // graph is the same as every later one's (one compile serves any num_inference_steps).
  mark_step();
  c_->use(2);  // the transformer arrives once and stays for every step
  next_stage("transformer");
  for (int64_t i = 0; i < args.num_inference_steps; ++i) {
    t0 = std::chrono::steady_clock::now();
    const float t = scheduler.timesteps()[size_t(i)];
    // §6.6: t in the latents' dtype, divided by 1000 in that dtype.
    const Tensor timestep = from_vector({rounded_to(dt, rounded_to(dt, t) / 1000.0f)}, {1}, dt);
    const Tensor v = c_->transformer.forward(latents, embeds_in, pooled_in, timestep, img_ids, txt_ids, guidance);
    latents = scheduler.step(v, latents);
    const Tensor latents_ok = pipeline_checks::finite_probe(latents);
    mark_step();     // deferred mode: this step's graph is complete; same fingerprint every step
    wait(latents);   // per-step timing and progress (the next step needs these latents anyway)
    pipeline_checks::expect_finite(
        latents_ok, "transformer step " + std::to_string(i + 1) + "/" + std::to_string(args.num_inference_steps),
        c_->dir / "transformer", FluxTransformer2DModel::checkpoint_keys_not_loaded(),
        i == 0 ? "the initial latents, the guidance or the transformer's weights"
               : "the transformer's weights or activations overflowing (values beyond the dtype's range)");
    out.timings.steps.push_back(seconds_since(t0));
    if (args.on_step) args.on_step(i, args.num_inference_steps, out.timings.steps.back());
  }
  out.latents = latents;
  stage.reset();

  // 5. Decode and postprocess.
  t0 = std::chrono::steady_clock::now();
  next_stage("vae");
  const auto& vcfg = c_->vae.config();
  const Tensor z = unpack_latents(latents, h, w) / vcfg.scaling_factor + vcfg.shift_factor;
  c_->use(3);
  const Tensor image = c_->decode(z, vae_tile_size);
  pipeline_checks::expect_finite(pipeline_checks::finite_probe(image), "VAE decode", c_->dir / "vae",
                                 AutoencoderKL::checkpoint_keys_not_loaded(),
                                 "the VAE's weights or its config (scaling_factor, shift_factor)");
  out.image = image_processor::to_uint8_hwc(image);
  out.height = image.dim(2);
  out.width = image.dim(3);
  out.timings.decode = seconds_since(t0);
  if (args.on_stage) args.on_stage("decode", out.timings.decode);
  out.timings.total = seconds_since(t_start);
  return out;
}

}  // namespace kiln
