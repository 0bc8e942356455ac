#include "pipelines/diffusion_pipeline.h"

#include <chrono>
#include <optional>

#include "core/error.h"
#include "devices/runtime.h"
#include "exec/ops.h"
#include "exec/deferred.h"
#include "exec/host.h"
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

DiffusionPipeline::DiffusionPipeline(std::unique_ptr<PipelineState> state, nn::DiffusionTransformer& denoiser,
                                     const AutoencoderKL& vae)
    : s_(std::move(state)), denoiser_(&denoiser), vae_(&vae) {}
DiffusionPipeline::DiffusionPipeline(DiffusionPipeline&&) noexcept = default;
DiffusionPipeline& DiffusionPipeline::operator=(DiffusionPipeline&&) noexcept = default;
DiffusionPipeline::~DiffusionPipeline() = default;

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
  if (pipe_.s_->options.on_progress) pipe_.s_->options.on_progress({"run", component, "", -1});
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
