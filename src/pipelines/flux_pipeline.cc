#include "pipelines/flux_pipeline.h"

#include <chrono>

#include "core/error.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "io/json_config.h"
#include "models/clip/clip_text_model.h"
#include "models/flux/flux_transformer.h"
#include "models/t5/t5_encoder.h"
#include "models/vae/autoencoder_kl.h"
#include "pipelines/image_processor.h"
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

// The component folders model_index.json lists, checked before anything is loaded.
fs::path component(const fs::path& dir, const io::JsonConfig& index, const std::string& name) {
  KILN_CHECK(index.has(name), "pipeline", (dir / "model_index.json").string(), ": component '", name,
             "' is not listed");
  const fs::path p = dir / name;
  KILN_CHECK(fs::is_directory(p), "pipeline", "component folder ", p.string(), " is missing (listed in ",
             (dir / "model_index.json").string(), ")");
  return p;
}

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
};

FluxPipeline::FluxPipeline(std::unique_ptr<Components> c) : c_(std::move(c)) {}
FluxPipeline::FluxPipeline(FluxPipeline&&) noexcept = default;
FluxPipeline& FluxPipeline::operator=(FluxPipeline&&) noexcept = default;
FluxPipeline::~FluxPipeline() = default;

FluxPipeline FluxPipeline::from_pretrained(const fs::path& dir, const FluxPipelineOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  KILN_CHECK(fs::is_directory(dir), "pipeline", "model folder ", dir.string(), " does not exist");
  const io::JsonConfig index(dir / "model_index.json");
  const std::string cls = index.get_string("_class_name", "");
  KILN_CHECK(cls.empty() || cls == "FluxPipeline", "pipeline", (dir / "model_index.json").string(), ": _class_name is '",
             cls, "', expected FluxPipeline");
  const fs::path paths[] = {component(dir, index, "tokenizer"),      component(dir, index, "tokenizer_2"),
                            component(dir, index, "text_encoder"),   component(dir, index, "text_encoder_2"),
                            component(dir, index, "transformer"),    component(dir, index, "vae"),
                            component(dir, index, "scheduler")};
  auto c = std::unique_ptr<Components>(new Components{
      dir,
      options,
      0,
      tokenizers::ClipTokenizer::from_pretrained(paths[0]),
      tokenizers::T5Tokenizer::from_pretrained(paths[1]),
      ClipTextModel::from_pretrained(paths[2]),
      T5EncoderModel::from_pretrained(paths[3]),
      FluxTransformer2DModel::from_pretrained(paths[4]),
      AutoencoderKL::from_pretrained(paths[5]),
      FlowMatchEulerConfig::load(paths[6] / "scheduler_config.json"),
  });
  c->load_seconds = seconds_since(t0);
  return FluxPipeline(std::move(c));
}

int64_t FluxPipeline::vae_scale_factor() const { return c_->vae.config().vae_scale_factor(); }
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

FluxOutput FluxPipeline::operator()(const FluxCallArgs& args) const {
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

  const Shape packed{1, (h / 2) * (w / 2), channels * 4}, unpacked{1, channels, h, w};
  if (args.latents.defined())  // checked before any work
    KILN_CHECK(args.latents.shape() == packed || args.latents.shape() == unpacked, "pipeline",
               "initial latents have shape ", to_string(args.latents.shape()), ", expected packed ", to_string(packed),
               " or unpacked ", to_string(unpacked), " for ", height, "x", width);

  // 1. Text: CLIP pooled embedding, T5 sequence embedding, zero text ids.
  auto t0 = std::chrono::steady_clock::now();
  const auto clip_ids = c_->tokenizer.encode_padded(args.prompt);  // to model_max_length (77)
  const auto t5_ids = c_->tokenizer_2.encode_padded(args.prompt_2.value_or(args.prompt), args.max_sequence_length);
  const Tensor pooled =
      c_->text_encoder.forward(from_ints(clip_ids, {1, int64_t(clip_ids.size())})).pooler_output;
  const Tensor prompt_embeds =
      c_->text_encoder_2.forward(from_ints(t5_ids, {1, int64_t(t5_ids.size())})).last_hidden_state;
  const Tensor txt_ids = zeros({int64_t(t5_ids.size()), 3});
  wait(prompt_embeds);
  out.timings.encode = seconds_since(t0);

  // 2. Initial latents (packed) and image ids.
  Tensor latents;
  if (args.latents.defined()) {
    latents = args.latents.rank() == 4 ? pack_latents(args.latents) : args.latents;
    latents = cast(latents, DType::f32);
  } else {
    latents = pack_latents(from_vector(TorchGenerator(args.seed).randn(numel(unpacked)), unpacked));
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
  for (int64_t i = 0; i < args.num_inference_steps; ++i) {
    t0 = std::chrono::steady_clock::now();
    const float t = scheduler.timesteps()[size_t(i)];
    const Tensor timestep = from_vector({t / 1000.0f}, {1});
    const Tensor v = c_->transformer.forward(latents, prompt_embeds, pooled, timestep, img_ids, txt_ids, guidance);
    latents = scheduler.step(v, latents);
    mark_step();     // deferred mode: this step's graph is complete; same fingerprint every step
    wait(latents);   // per-step timing and progress (the next step needs these latents anyway)
    out.timings.steps.push_back(seconds_since(t0));
    if (args.on_step) args.on_step(i, args.num_inference_steps, out.timings.steps.back());
  }
  out.latents = latents;

  // 5. Decode and postprocess.
  t0 = std::chrono::steady_clock::now();
  const auto& vcfg = c_->vae.config();
  const Tensor z = unpack_latents(latents, h, w) / vcfg.scaling_factor + vcfg.shift_factor;
  const Tensor image = c_->vae.decode(z);
  out.image = image_processor::to_uint8_hwc(image);
  out.height = image.dim(2);
  out.width = image.dim(3);
  out.timings.decode = seconds_since(t0);
  out.timings.total = seconds_since(t_start);
  return out;
}

}  // namespace kiln
