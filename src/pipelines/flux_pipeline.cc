#include "pipelines/flux_pipeline.h"

#include <chrono>

#include "core/error.h"
#include "exec/deferred.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "models/clip/clip_text_model.h"
#include "models/flux/flux_transformer.h"
#include "models/t5/t5_encoder.h"
#include "models/vae/autoencoder_kl.h"
#include "pipelines/image_processor.h"
#include "pipelines/pipeline_checks.h"
#include "pipelines/pipeline_loader.h"
#include "pipelines/torch_generator.h"
#include "schedulers/flow_match_euler.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

// The defaults of the call argument table (pipelines/call_arguments.cc).
const double kDefaultGuidance = call_argument_default("guidance_scale", FluxPipeline::kClassName);
const double kDefaultTrueCfgScale = call_argument_default("true_cfg_scale", FluxPipeline::kClassName);
const int64_t kDefaultMaxSequenceLength = int64_t(call_argument_default("max_sequence_length", FluxPipeline::kClassName));

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Real classifier-free guidance (Diffusers' do_true_cfg): a negative_prompt and true_cfg_scale > 1.
bool true_cfg_on(const PipelineCallArgs& args) {
  return args.negative_prompt && args.true_cfg_scale.value_or(kDefaultTrueCfgScale) > 1.0;
}

// The value `v` has once stored in dtype `t` (a host scalar rounded as a device tensor would be).
float rounded_to(DType t, float v) {
  char bytes[8];
  store_from_double(bytes, t, 0, double(v));
  return float(load_as_double(bytes, t, 0));
}

}  // namespace

struct FluxPipeline::Models {
  tokenizers::ClipTokenizer tokenizer;
  tokenizers::T5Tokenizer tokenizer_2;
  ClipTextModel text_encoder;
  T5EncoderModel text_encoder_2;
  FluxTransformer2DModel transformer;
  AutoencoderKL vae;
  FlowMatchEulerConfig scheduler;
};

FluxPipeline::FluxPipeline(std::unique_ptr<PipelineState> state, std::unique_ptr<Models> models)
    : DiffusionPipeline(std::move(state), models->transformer, models->vae), m_(std::move(models)) {}
FluxPipeline::FluxPipeline(FluxPipeline&&) noexcept = default;
FluxPipeline& FluxPipeline::operator=(FluxPipeline&&) noexcept = default;
FluxPipeline::~FluxPipeline() = default;

FluxPipeline FluxPipeline::from_pretrained(const fs::path& model, const PipelineOptions& options) {
  // model_cpu_offload_seq = "text_encoder->text_encoder_2->transformer->vae" (FLUX.1 has no
  // image_encoder).
  PipelineLoader load(model, options, kClassName,
                      {{"tokenizer", {"CLIPTokenizer", "CLIPTokenizerFast"}},
                       {"tokenizer_2", {"T5Tokenizer", "T5TokenizerFast"}},
                       {"text_encoder", {"CLIPTextModel"}},
                       {"text_encoder_2", {"T5EncoderModel"}},
                       {"transformer", {"FluxTransformer2DModel"}},
                       {"vae", {"AutoencoderKL"}},
                       {"scheduler", {"FlowMatchEulerDiscreteScheduler"}}},
                      {"text_encoder", "text_encoder_2", "transformer", "vae"});
  auto m = std::unique_ptr<Models>(new Models{
      tokenizers::ClipTokenizer::from_pretrained(load.path("tokenizer")),
      tokenizers::T5Tokenizer::from_pretrained(load.path("tokenizer_2")),
      load.load("text_encoder", ClipTextModel::checkpoint_keys_not_loaded(),
                [&] {
                  return ClipTextModel::from_pretrained(load.path("text_encoder"), ClipPooledRule::eos2_argmax,
                                                        load.dtype("text_encoder"));
                }),
      load.load_model<T5EncoderModel>("text_encoder_2"),
      load.load_transformer<FluxTransformer2DModel>(),
      load.load_model<AutoencoderKL>("vae"),
      FlowMatchEulerConfig::load(load.path("scheduler") / "scheduler_config.json"),
  });
  return FluxPipeline(load.finish(), std::move(m));
}

FluxTransformer2DModel& FluxPipeline::transformer() { return m_->transformer; }

void FluxPipeline::warmup_transformer(int64_t h, int64_t w, int64_t max_sequence_length) const {
  m_->transformer.warmup(1, (h / 2) * (w / 2), max_sequence_length);
}

int64_t FluxPipeline::max_sequence_length(const PipelineCallArgs& args) const {
  const int64_t n = args.max_sequence_length.value_or(kDefaultMaxSequenceLength);
  KILN_CHECK(n >= 1 && n <= 512, "pipeline", "max_sequence_length must be in [1, 512], got ", n);
  return n;
}

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

ComponentActivations FluxPipeline::trace_activations(int64_t h, int64_t w, int64_t max_sequence_length,
                                                     int64_t vae_tile_size) const {
  const Tensor clip_ids = from_ints(std::vector<int64_t>(size_t(m_->tokenizer.model_max_length()), 0),
                                    {1, m_->tokenizer.model_max_length()});
  const Tensor t5_ids = from_ints(std::vector<int64_t>(size_t(max_sequence_length), 0), {1, max_sequence_length});
  return {
      {"text_encoder", trace_peak_bytes("text_encoder", [&] { return m_->text_encoder.forward(clip_ids).pooler_output; })},
      {"text_encoder_2",
       trace_peak_bytes("text_encoder_2", [&] { return m_->text_encoder_2.forward(t5_ids).last_hidden_state; })},
      {"transformer", m_->transformer.activation_bytes(1, (h / 2) * (w / 2), max_sequence_length)},
      {"vae", decode_activation_bytes(h, w, vae_tile_size)},
  };
}

// Carried from stage to stage (f32): prompt embeddings, pooled embedding, latents and the
// step's velocity, text/image ids, and the RoPE tables (cos, sin).
size_t FluxPipeline::carried_bytes(const PipelineCallArgs& args, int64_t h, int64_t w,
                                   int64_t max_sequence_length) const {
  const auto& tc = m_->transformer.config();
  const int64_t l_img = (h / 2) * (w / 2), S = max_sequence_length + l_img;
  const int64_t prompts = true_cfg_on(args) ? 2 : 1;  // the negative prompt's embeddings under true CFG
  const int64_t carried = prompts * (max_sequence_length * tc.joint_attention_dim + tc.pooled_projection_dim) +
                          2 * l_img * tc.in_channels + 3 * S + 2 * S * tc.attention_head_dim;
  return size_t(carried) * 4;
}

// The noise (host vector and tensor), image ids, RoPE tables, latents, and the decoded image
// (f32 and RGB bytes).
double FluxPipeline::host_floor_bytes(int64_t height, int64_t width, int64_t max_sequence_length) const {
  const int64_t vsf = vae_scale_factor(), h = height / vsf, w = width / vsf;
  const double channels = double(m_->transformer.config().in_channels / 4);
  const double pixels = double(height) * double(width), tokens = double(h / 2) * double(w / 2);
  return 4.0 * (2 * channels * double(h) * double(w) + 2 * 3 * tokens + 2 * channels * 4 * tokens +
                2 * (tokens + double(max_sequence_length)) * double(m_->transformer.config().attention_head_dim) +
                3 * pixels) +
         3 * pixels;
}

void FluxPipeline::check_call(const PipelineCallArgs& args, int64_t height, int64_t width, PipelineOutput& out) const {
  // As Diffusers, a prompt longer than a text encoder reads is cut, with a warning.
  const int64_t msl = max_sequence_length(args);
  const auto warn = [&](const std::string& w) {
    out.warnings.push_back(w);
    if (args.on_warning) args.on_warning(w);
  };
  // `which`: "" or "negative ".
  const auto cut = [&](const std::string& which, const std::string& encoder, size_t tokens, int64_t limit,
                       const std::string& why) {
    if (int64_t(tokens) > limit)
      warn("the " + encoder + " " + which + "prompt is " + std::to_string(tokens) + " tokens but only the first " +
           std::to_string(limit) + " are used (" + why + "); the rest is cut");
  };
  const auto cut_prompts = [&](const std::string& which, const std::string& clip_prompt, const std::string& t5_prompt) {
    cut(which, "CLIP", m_->tokenizer.encode(clip_prompt).size(), m_->tokenizer.model_max_length(),
        "CLIP reads " + std::to_string(m_->tokenizer.model_max_length()) + " tokens");
    cut(which, "T5", m_->tokenizer_2.encode(t5_prompt).size(), msl, "max_sequence_length is " + std::to_string(msl));
  };
  cut_prompts("", args.prompt, args.prompt_2.value_or(args.prompt));
  // Real classifier-free guidance, as Diffusers' FluxPipeline: on with a negative prompt and
  // true_cfg_scale > 1; either alone is a warning.
  const double true_cfg = args.true_cfg_scale.value_or(kDefaultTrueCfgScale);
  pipeline_checks::finite_scalar("true_cfg_scale", true_cfg, "a finite number (e.g. 4.0)");
  if (true_cfg_on(args))
    cut_prompts("negative ", args.negative_prompt.value_or(""),
                args.negative_prompt_2.value_or(args.negative_prompt.value_or("")));
  else if (args.negative_prompt || args.negative_prompt_2)
    warn("negative_prompt is not used: classifier-free guidance runs only with true_cfg_scale above 1 (it is " +
         std::to_string(true_cfg) + ")");
  else if (true_cfg > 1)
    warn("true_cfg_scale " + std::to_string(true_cfg) +
         " is not used: classifier-free guidance runs only with a negative_prompt");
  const int64_t vsf = vae_scale_factor(), h = height / vsf, w = width / vsf;
  const int64_t channels = m_->transformer.config().in_channels / 4;
  const Shape packed{1, (h / 2) * (w / 2), channels * 4}, unpacked{1, channels, h, w};
  if (args.latents.defined()) {
    KILN_CHECK(args.latents.shape() == packed || args.latents.shape() == unpacked, "pipeline",
               "initial latents have shape ", to_string(args.latents.shape()), ", expected packed ", to_string(packed),
               " or unpacked ", to_string(unpacked), " for ", height, "x", width);
    pipeline_checks::finite_input("initial latents", args.latents);
  }
  if (m_->transformer.config().guidance_embeds)
    pipeline_checks::finite_scalar("guidance_scale", args.guidance_scale.value_or(kDefaultGuidance),
                                   "a finite number (e.g. 3.5)");
}

void FluxPipeline::run(const PipelineCallArgs& args, const Sized& sized, PipelineOutput& out) const {
  const int64_t vsf = vae_scale_factor(), h = sized.height / vsf, w = sized.width / vsf;
  const auto& tcfg = m_->transformer.config();
  const int64_t channels = tcfg.in_channels / 4;
  const Shape unpacked{1, channels, h, w};
  const std::string& prompt_2 = args.prompt_2.value_or(args.prompt);
  // Each component's launches, and the device's idle time from where its stage's clock starts,
  // count for it in the profile (exec/profile.h). In deferred mode a component's recorded ops are
  // launched before the next one starts, so they count for it too.
  Stages stages(*this);
  out.guidance_scale = args.guidance_scale.value_or(kDefaultGuidance);

  // 1. Text: CLIP pooled embedding, T5 sequence embedding, zero text ids; with true CFG the
  // negative prompt's too (each encoder reads both prompts before the next one starts, so under
  // model offload each arrives once).
  auto t0 = std::chrono::steady_clock::now();
  const bool cfg = true_cfg_on(args);
  std::vector<std::pair<std::string, std::string>> prompts = {{args.prompt, prompt_2}};
  if (cfg) prompts.emplace_back(*args.negative_prompt, args.negative_prompt_2.value_or(*args.negative_prompt));
  // The transformer computes in its dtype; its inputs arrive in it (the same as the encoders'
  // unless a component was given another dtype, which torch would refuse to mix).
  const DType dt = m_->transformer.dtype();
  stages.next("text_encoder");
  use("text_encoder");
  std::vector<Tensor> pooled, embeds;
  for (const auto& p : prompts) {
    const auto clip_ids = m_->tokenizer.encode_padded(p.first);  // to model_max_length (77)
    pooled.push_back(m_->text_encoder.pooled_output(from_ints(clip_ids, {1, int64_t(clip_ids.size())})));
  }
  stages.next("text_encoder_2");
  use("text_encoder_2");
  for (const auto& p : prompts) {
    const auto t5_ids = m_->tokenizer_2.encode_padded(p.second, sized.max_sequence_length);
    embeds.push_back(m_->text_encoder_2.forward(from_ints(t5_ids, {1, int64_t(t5_ids.size())})).last_hidden_state);
  }
  const Tensor txt_ids = zeros({sized.max_sequence_length, 3});
  std::vector<Tensor> pooled_in, embeds_in;
  for (size_t i = 0; i < prompts.size(); ++i) {
    pooled_in.push_back(pooled[i].dtype() == dt ? pooled[i] : cast(pooled[i], dt));
    embeds_in.push_back(embeds[i].dtype() == dt ? embeds[i] : cast(embeds[i], dt));
  }
  std::vector<Tensor> pooled_ok, embeds_ok;
  for (size_t i = 0; i < prompts.size(); ++i) {
    pooled_ok.push_back(pipeline_checks::finite_probe(pooled[i]));
    embeds_ok.push_back(pipeline_checks::finite_probe(embeds[i]));
  }
  wait(embeds.back());
  for (size_t i = 0; i < prompts.size(); ++i) {
    pipeline_checks::expect_finite(pooled_ok[i], "text encoder (CLIP, text_encoder)", dir() / "text_encoder",
                                   ClipTextModel::checkpoint_keys_not_loaded(),
                                   "the CLIP text encoder's weights or config");
    pipeline_checks::expect_finite(embeds_ok[i], "text encoder (T5, text_encoder_2)", dir() / "text_encoder_2",
                                   T5EncoderModel::checkpoint_keys_not_loaded(),
                                   "the T5 text encoder's weights or config");
  }
  stages.end();
  out.timings.encode = seconds_since(t0);
  if (args.on_stage) args.on_stage("encode", out.timings.encode);

  // 2. Initial latents (packed) and image ids.
  Tensor latents;
  if (args.latents.defined()) {
    const Tensor given = on_device(args.latents);
    latents = given.rank() == 4 ? pack_latents(given) : given;
    latents = cast(latents, dt);
  } else {
    // fp32 noise, rounded to the dtype (Diffusers draws bf16 noise with another generator path;
    // pass --latents to reproduce a bf16 run's noise exactly).
    latents = pack_latents(from_vector(TorchGenerator(args.seed).randn(numel(unpacked)), unpacked));
    if (dt != DType::f32) latents = cast(latents, dt);
  }
  const Tensor img_ids = image_ids(h, w);

  // 3. Schedule (resolution-dependent shift for dev checkpoints) and guidance.
  FlowMatchEulerDiscreteScheduler scheduler(m_->scheduler);
  const int64_t image_seq_len = (h / 2) * (w / 2);
  scheduler.set_timesteps(args.num_inference_steps, scheduler.calculate_shift(image_seq_len));
  std::optional<Tensor> guidance;
  // Per-call and per-step scalars are uploaded host data (graph inputs), never op attributes,
  // so deferred/compiled graphs do not depend on their values.
  if (tcfg.guidance_embeds) guidance = from_vector({float(args.guidance_scale.value_or(kDefaultGuidance))}, {1});

  // 4. Denoising loop: the step count is a host loop; every step runs the same graph. In
  // deferred mode the preparation above is flushed as its own graph first, so the first step's
  // graph is the same as every later one's (one compile serves any num_inference_steps).
  mark_step();
  use("transformer");  // the transformer arrives once and stays for every step
  stages.next("transformer");
  for (int64_t i = 0; i < args.num_inference_steps; ++i) {
    t0 = std::chrono::steady_clock::now();
    const float t = scheduler.timesteps()[size_t(i)];
    // t in the latents' dtype, divided by 1000 in that dtype.
    const Tensor timestep = from_vector({rounded_to(dt, rounded_to(dt, t) / 1000.0f)}, {1}, dt);
    Tensor v = m_->transformer.forward(latents, embeds_in[0], pooled_in[0], timestep, img_ids, txt_ids, guidance);
    if (cfg) {  // Diffusers: neg + true_cfg_scale * (v - neg)
      const Tensor neg =
          m_->transformer.forward(latents, embeds_in[1], pooled_in[1], timestep, img_ids, txt_ids, guidance);
      v = neg + (v - neg) * *args.true_cfg_scale;
    }
    latents = scheduler.step(v, latents);
    finish_step(i, latents, t0, args, out);
  }
  out.latents = latents;
  stages.end();

  // 5. Decode and postprocess.
  decode_image([&] { return unpack_latents(latents, h, w); }, sized.vae_tile_size, stages, args, out);
}

bool FluxPipeline::step_distilled() const { return !m_->transformer.config().guidance_embeds; }

}  // namespace kiln
