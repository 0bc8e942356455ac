#include "pipelines/stable_diffusion_3_pipeline.h"

#include <array>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "exec/deferred.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "models/clip/clip_text_model.h"
#include "models/sd3/sd3_transformer.h"
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

// StableDiffusion3Pipeline.__call__'s defaults: the call argument table's (pipelines/call_arguments.cc).
const double kDefaultGuidance = call_argument_default("guidance_scale", StableDiffusion3Pipeline::kClassName);
const int64_t kDefaultMaxSequenceLength =
    int64_t(call_argument_default("max_sequence_length", StableDiffusion3Pipeline::kClassName));
constexpr int64_t kMaxSequenceLimit = 512;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The batch a call's transformer runs: 2 (unconditional, conditional) with guidance.
bool guided(const PipelineCallArgs& args) { return args.guidance_scale.value_or(kDefaultGuidance) > 1.0; }

}  // namespace

struct StableDiffusion3Pipeline::Models {
  tokenizers::ClipTokenizer tokenizer, tokenizer_2;
  std::optional<tokenizers::T5Tokenizer> tokenizer_3;
  ClipTextModel text_encoder, text_encoder_2;
  std::optional<T5EncoderModel> text_encoder_3;
  SD3Transformer2DModel transformer;
  AutoencoderKL vae;
  FlowMatchEulerConfig scheduler;
};

StableDiffusion3Pipeline::StableDiffusion3Pipeline(std::unique_ptr<PipelineState> state,
                                                   std::unique_ptr<Models> models)
    : DiffusionPipeline(std::move(state), models->transformer, models->vae), m_(std::move(models)) {}
StableDiffusion3Pipeline::StableDiffusion3Pipeline(StableDiffusion3Pipeline&&) noexcept = default;
StableDiffusion3Pipeline& StableDiffusion3Pipeline::operator=(StableDiffusion3Pipeline&&) noexcept = default;
StableDiffusion3Pipeline::~StableDiffusion3Pipeline() = default;

StableDiffusion3Pipeline StableDiffusion3Pipeline::from_pretrained(const fs::path& model,
                                                                   const PipelineOptions& options) {
  // model_cpu_offload_seq = "text_encoder->text_encoder_2->text_encoder_3->image_encoder->
  // transformer->vae" (image_encoder is IP-Adapter's, not loaded for text-to-image).
  PipelineLoader load(model, options, kClassName,
                      {{"tokenizer", {"CLIPTokenizer", "CLIPTokenizerFast"}},
                       {"tokenizer_2", {"CLIPTokenizer", "CLIPTokenizerFast"}},
                       {"tokenizer_3", {"T5Tokenizer", "T5TokenizerFast"}, /*optional=*/true},
                       {"text_encoder", {"CLIPTextModelWithProjection"}},
                       {"text_encoder_2", {"CLIPTextModelWithProjection"}},
                       {"text_encoder_3", {"T5EncoderModel"}, /*optional=*/true},
                       {"transformer", {"SD3Transformer2DModel"}},
                       {"vae", {"AutoencoderKL"}},
                       {"scheduler", {"FlowMatchEulerDiscreteScheduler"}},
                       {"image_encoder", {}, /*optional=*/true},
                       {"feature_extractor", {}, /*optional=*/true}},
                      {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"});
  const bool t5 = load.has("text_encoder_3");
  KILN_CHECK(t5 == load.has("tokenizer_3"), "pipeline", (load.dir() / "model_index.json").string(),
             ": text_encoder_3 and tokenizer_3 come together (one is listed without the other)");
  const auto clip = [&](const std::string& name) {
    return load.load(name, ClipTextModel::checkpoint_keys_not_loaded(), [&] {
      ClipTextModel m = ClipTextModel::from_pretrained(load.path(name), ClipPooledRule::eos2_argmax, load.dtype(name));
      KILN_CHECK(m.config().with_projection, "pipeline", (load.path(name) / "config.json").string(),
                 ": StableDiffusion3Pipeline needs CLIPTextModelWithProjection (architectures), for text_projection");
      return m;
    });
  };
  auto m = std::unique_ptr<Models>(new Models{
      tokenizers::ClipTokenizer::from_pretrained(load.path("tokenizer")),
      tokenizers::ClipTokenizer::from_pretrained(load.path("tokenizer_2")),
      t5 ? std::optional(tokenizers::T5Tokenizer::from_pretrained(load.path("tokenizer_3"))) : std::nullopt,
      clip("text_encoder"),
      clip("text_encoder_2"),
      t5 ? std::optional(load.load_model<T5EncoderModel>("text_encoder_3")) : std::nullopt,
      load.load_transformer<SD3Transformer2DModel>(),
      load.load_model<AutoencoderKL>("vae"),
      FlowMatchEulerConfig::load(load.path("scheduler") / "scheduler_config.json"),
  });
  KILN_CHECK(!m->scheduler.use_dynamic_shifting, "pipeline",
             (load.dir() / "scheduler" / "scheduler_config.json").string(),
             ": use_dynamic_shifting is not supported by StableDiffusion3Pipeline here (it needs mu per call)");
  const int64_t pooled = m->text_encoder.config().projection_dim + m->text_encoder_2.config().projection_dim;
  const auto& tc = m->transformer.config();
  KILN_CHECK(pooled == tc.pooled_projection_dim, "pipeline", load.dir().string(),
             ": the CLIP projections give ", pooled, " pooled channels but the transformer's pooled_projection_dim is ",
             tc.pooled_projection_dim);
  KILN_CHECK(!m->text_encoder_3 || m->text_encoder_3->config().d_model == tc.joint_attention_dim, "pipeline",
             load.dir().string(), ": T5's d_model (", m->text_encoder_3 ? m->text_encoder_3->config().d_model : 0,
             ") differs from the transformer's joint_attention_dim (", tc.joint_attention_dim, ")");
  return StableDiffusion3Pipeline(load.finish(), std::move(m));
}

SD3Transformer2DModel& StableDiffusion3Pipeline::transformer() { return m_->transformer; }
int64_t StableDiffusion3Pipeline::patch_size() const { return m_->transformer.config().patch_size; }
int64_t StableDiffusion3Pipeline::default_sample_size() const { return m_->transformer.config().sample_size; }
bool StableDiffusion3Pipeline::has_text_encoder_3() const { return m_->text_encoder_3.has_value(); }

void StableDiffusion3Pipeline::warmup_transformer(int64_t h, int64_t w, int64_t max_sequence_length) const {
  for (int64_t batch : {2, 1})
    m_->transformer.warmup(batch, h, w, m_->tokenizer.model_max_length() + max_sequence_length);
}

int64_t StableDiffusion3Pipeline::max_sequence_length(const PipelineCallArgs& args) const {
  const int64_t n = args.max_sequence_length.value_or(kDefaultMaxSequenceLength);
  KILN_CHECK(n >= 1 && n <= kMaxSequenceLimit, "pipeline", "max_sequence_length must be in [1, ", kMaxSequenceLimit,
             "], got ", n);
  return n;
}

StableDiffusion3Pipeline::PromptEmbeds StableDiffusion3Pipeline::encode_prompt(const std::string& prompt,
                                                                               const std::string& prompt_2,
                                                                               const std::string& prompt_3,
                                                                               int64_t max_sequence_length) const {
  return encode_prompts({{prompt, prompt_2, prompt_3}}, max_sequence_length)[0];
}

std::vector<StableDiffusion3Pipeline::PromptEmbeds> StableDiffusion3Pipeline::encode_prompts(
    const std::vector<std::array<std::string, 3>>& prompts, int64_t max_sequence_length) const {
  const CallGuard guard(*this);  // outside a call: the encoders are this caller's, and released after
  return encode_prompts(prompts, max_sequence_length, nullptr);
}

// Each encoder reads every prompt before the next one starts, so under model offload each
// arrives once per call (the prompts run one by one, as Diffusers runs them).
std::vector<StableDiffusion3Pipeline::PromptEmbeds> StableDiffusion3Pipeline::encode_prompts(
    const std::vector<std::array<std::string, 3>>& prompts, int64_t max_sequence_length, Stages* stages,
    const std::vector<int64_t>& clip_skip) const {
  const auto start = [&](const char* component) {
    if (stages) stages->next(component);
    use(component);
  };
  // CLIP: the penultimate layer's hidden states (hidden_states[-2], or hidden_states[-(clip_skip + 2)])
  // and the projected pooled output.
  const auto clip = [&](const char* name, const tokenizers::ClipTokenizer& tok, const ClipTextModel& enc, size_t which) {
    start(name);
    std::vector<std::pair<Tensor, Tensor>> out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::vector<int64_t> ids = tok.encode_padded(prompts[i][which]);
      ClipTextModel::Output o = enc.forward(from_ints(ids, {1, int64_t(ids.size())}), /*output_hidden_states=*/true);
      const size_t skip = i < clip_skip.size() ? size_t(clip_skip[i]) : 0;
      out.emplace_back(o.hidden_states[o.hidden_states.size() - 2 - skip], o.text_embeds);
    }
    return out;
  };
  const auto clip_l = clip("text_encoder", m_->tokenizer, m_->text_encoder, 0);
  const auto clip_g = clip("text_encoder_2", m_->tokenizer_2, m_->text_encoder_2, 1);
  // Both hidden states in CLIP-L's dtype; the pooled outputs keep theirs.
  const DType clip_dtype = m_->text_encoder.dtype();
  std::vector<Tensor> t5;
  if (m_->text_encoder_3) {
    start("text_encoder_3");
    for (const auto& p : prompts) {
      const std::vector<int64_t> ids = m_->tokenizer_3->encode_padded(p[2], max_sequence_length);
      t5.push_back(m_->text_encoder_3->forward(from_ints(ids, {1, int64_t(ids.size())})).last_hidden_state);
    }
  } else {  // Diffusers' stand-in without T5
    t5.assign(prompts.size(), zeros({1, max_sequence_length, m_->transformer.config().joint_attention_dim}, clip_dtype));
  }
  std::vector<PromptEmbeds> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Tensor& hs_g = clip_g[i].first;
    const Tensor clip_embeds = concat({clip_l[i].first, hs_g.dtype() == clip_dtype ? hs_g : cast(hs_g, clip_dtype)}, 2);
    // F.pad(clip, (0, W - clip_width)): zeros on the right, or a cut when T5 is narrower.
    const int64_t cw = clip_embeds.dim(2), tw = t5[i].dim(2);
    Tensor clip_padded = clip_embeds;
    if (tw < cw) clip_padded = slice(clip_embeds, 2, 0, tw);
    if (tw > cw) clip_padded = concat({clip_embeds, zeros({1, clip_embeds.dim(1), tw - cw}, clip_embeds.dtype())}, 2);
    const Tensor t5_in = t5[i].dtype() == clip_padded.dtype() ? t5[i] : cast(t5[i], clip_padded.dtype());
    // torch.cat promotes mixed dtypes (a component given its own, e.g. text_encoder=f32): to f32.
    Tensor pooled_l = clip_l[i].second, pooled_g = clip_g[i].second;
    if (pooled_l.dtype() != pooled_g.dtype()) pooled_l = cast(pooled_l, DType::f32), pooled_g = cast(pooled_g, DType::f32);
    out.push_back({concat({clip_padded, t5_in}, 1), concat({pooled_l, pooled_g}, 1)});
  }
  return out;
}

ComponentActivations StableDiffusion3Pipeline::trace_activations(int64_t h, int64_t w, int64_t max_sequence_length,
                                                                 int64_t vae_tile_size) const {
  const int64_t clip_len = m_->tokenizer.model_max_length();
  const Tensor clip_ids = from_ints(std::vector<int64_t>(size_t(clip_len), 0), {1, clip_len});
  const Tensor t5_ids = from_ints(std::vector<int64_t>(size_t(max_sequence_length), 0), {1, max_sequence_length});
  ComponentActivations act;
  for (const auto& [name, enc] : {std::pair{"text_encoder", &m_->text_encoder}, {"text_encoder_2", &m_->text_encoder_2}})
    act[name] = trace_peak_bytes(name, [&] { return enc->forward(clip_ids, true).text_embeds; });
  if (m_->text_encoder_3)
    act["text_encoder_3"] =
        trace_peak_bytes("text_encoder_3", [&] { return m_->text_encoder_3->forward(t5_ids).last_hidden_state; });
  // The guided batch of two (the default call; a call without guidance needs less).
  act["transformer"] = m_->transformer.activation_bytes(2, h, w, clip_len + max_sequence_length);
  act["vae"] = decode_activation_bytes(h, w, vae_tile_size);
  return act;
}

// Carried from stage to stage (f32 at most): the conditional and unconditional embeddings and
// pooled embeddings, the latents, the guided batch's input and velocities.
size_t StableDiffusion3Pipeline::carried_bytes(const PipelineCallArgs&, int64_t h, int64_t w,
                                               int64_t max_sequence_length) const {
  const auto& tc = m_->transformer.config();
  const int64_t tokens = m_->tokenizer.model_max_length() + max_sequence_length;
  const int64_t carried =
      4 * tokens * tc.joint_attention_dim + 4 * tc.pooled_projection_dim + 6 * tc.in_channels * h * w;
  return size_t(carried) * 4;
}

// The noise (host vector and tensor), latents and the decoded image (f32 and RGB bytes).
double StableDiffusion3Pipeline::host_floor_bytes(int64_t height, int64_t width, int64_t) const {
  const int64_t vsf = vae_scale_factor();
  const double latents = double(m_->transformer.config().in_channels) * double(height / vsf) * double(width / vsf);
  const double pixels = double(height) * double(width);
  return 4.0 * (3 * latents + 3 * pixels) + 3 * pixels;
}

void StableDiffusion3Pipeline::check_call(const PipelineCallArgs& args, int64_t height, int64_t width,
                                          PipelineOutput& out) const {
  const int64_t msl = max_sequence_length(args);
  const double g = args.guidance_scale.value_or(kDefaultGuidance);
  pipeline_checks::finite_scalar("guidance_scale", g, "a finite number (e.g. 7.0)");
  const auto warn = [&](const std::string& w) {
    out.warnings.push_back(w);
    if (args.on_warning) args.on_warning(w);
  };
  // As Diffusers, a prompt longer than a text encoder reads is cut, with a warning naming it.
  const auto cut = [&](const std::string& name, size_t tokens, int64_t limit, const std::string& why) {
    if (int64_t(tokens) <= limit) return;
    warn(name + " is " + std::to_string(tokens) + " tokens but only the first " + std::to_string(limit) +
         " are used (" + why + "); the rest is cut");
  };
  const int64_t clip_limit = m_->tokenizer.model_max_length();
  const std::string clip_why = "CLIP reads " + std::to_string(clip_limit) + " tokens";
  const std::string t5_why = "max_sequence_length is " + std::to_string(msl);
  struct Texts {
    const char *name, *name_2, *name_3;
    std::string p1, p2, p3;
  };
  std::vector<Texts> texts = {{"prompt", "prompt_2", "prompt_3", args.prompt, args.prompt_2.value_or(args.prompt),
                               args.prompt_3.value_or(args.prompt)}};
  if (guided(args)) {
    const std::string n = args.negative_prompt.value_or("");
    texts.push_back({"negative_prompt", "negative_prompt_2", "negative_prompt_3", n,
                     args.negative_prompt_2.value_or(n), args.negative_prompt_3.value_or(n)});
  } else if (args.negative_prompt || args.negative_prompt_2 || args.negative_prompt_3) {
    warn("negative_prompt is not used: guidance_scale " + std::to_string(g) +
         " is not above 1, so there is no classifier-free guidance");
  }
  for (const Texts& t : texts) {
    cut(t.name, m_->tokenizer.encode(t.p1).size(), clip_limit, clip_why);
    cut(t.name_2, m_->tokenizer_2.encode(t.p2).size(), clip_limit, clip_why);
    if (m_->tokenizer_3) cut(t.name_3, m_->tokenizer_3->encode(t.p3).size(), msl, t5_why);
  }
  if (!m_->text_encoder_3 && (args.prompt_3 || args.negative_prompt_3))
    warn("prompt_3 / negative_prompt_3 are not used: this checkpoint has no text_encoder_3 (T5), so its "
         "embeddings are zeros, as in Diffusers");
  const int64_t clip_layers =
      std::min(m_->text_encoder.config().num_hidden_layers, m_->text_encoder_2.config().num_hidden_layers);
  if (args.clip_skip)
    KILN_CHECK(*args.clip_skip >= 0 && *args.clip_skip < clip_layers, "pipeline", "clip_skip is ", *args.clip_skip,
               ", expected 0 to ", clip_layers - 1, " (the CLIP text encoders have ", clip_layers, " layers)");
  const int64_t layers = m_->transformer.config().num_layers;
  for (int64_t l : args.skip_guidance_layers)
    KILN_CHECK(l >= 0 && l < layers, "pipeline", "skip_guidance_layers: layer ", l,
               " is not a transformer block (this transformer has blocks 0..", layers - 1, ")");
  for (const auto& [name, v] : {std::pair{"skip_layer_guidance_scale", args.skip_layer_guidance_scale},
                                {"skip_layer_guidance_start", args.skip_layer_guidance_start},
                                {"skip_layer_guidance_stop", args.skip_layer_guidance_stop}})
    pipeline_checks::finite_scalar(name, v);
  if (!args.skip_guidance_layers.empty() && !guided(args))
    warn("skip_guidance_layers is not used: skip-layer guidance runs only with classifier-free guidance "
         "(guidance_scale > 1)");
  const int64_t vsf = vae_scale_factor();
  const Shape shape{1, m_->transformer.config().in_channels, height / vsf, width / vsf};
  if (args.latents.defined()) {
    KILN_CHECK(args.latents.shape() == shape, "pipeline", "initial latents have shape ",
               to_string(args.latents.shape()), ", expected ", to_string(shape), " for ", height, "x", width);
    pipeline_checks::finite_input("initial latents", args.latents);
  }
}

void StableDiffusion3Pipeline::run(const PipelineCallArgs& args, const Sized& sized, PipelineOutput& out) const {
  const int64_t vsf = vae_scale_factor(), h = sized.height / vsf, w = sized.width / vsf;
  const auto& tcfg = m_->transformer.config();
  const Shape shape{1, tcfg.in_channels, h, w};
  const double guidance_scale = args.guidance_scale.value_or(kDefaultGuidance);
  const bool cfg = guided(args);
  out.guidance_scale = guidance_scale;
  Stages stages(*this);

  // 1. Prompts: the conditional embeddings, and with guidance the negative ones (batch order
  //    negative, then positive).
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::array<std::string, 3>> prompts = {
      {args.prompt, args.prompt_2.value_or(args.prompt), args.prompt_3.value_or(args.prompt)}};
  if (cfg) {
    const std::string n = args.negative_prompt.value_or("");
    prompts.push_back({n, args.negative_prompt_2.value_or(n), args.negative_prompt_3.value_or(n)});
  }
  // clip_skip applies to the prompt's embeddings, not the negative prompt's (as Diffusers).
  const std::vector<PromptEmbeds> encoded =
      encode_prompts(prompts, sized.max_sequence_length, &stages, {args.clip_skip.value_or(0)});
  const PromptEmbeds& pos = encoded[0];
  const PromptEmbeds* neg = cfg ? &encoded[1] : nullptr;
  // The transformer computes in its dtype; its inputs arrive in it.
  const DType dt = m_->transformer.dtype();
  const auto in_dtype = [dt](const Tensor& t) { return t.dtype() == dt ? t : cast(t, dt); };
  const Tensor embeds = in_dtype(cfg ? concat({neg->prompt_embeds, pos.prompt_embeds}, 0) : pos.prompt_embeds);
  const Tensor pooled =
      in_dtype(cfg ? concat({neg->pooled_prompt_embeds, pos.pooled_prompt_embeds}, 0) : pos.pooled_prompt_embeds);
  const Tensor embeds_ok = pipeline_checks::finite_probe(embeds);
  const Tensor pooled_ok = pipeline_checks::finite_probe(pooled);
  wait(embeds);
  pipeline_checks::expect_finite(pooled_ok, "text encoders (CLIP, text_encoder and text_encoder_2)",
                                 dir() / "text_encoder", ClipTextModel::checkpoint_keys_not_loaded(),
                                 "the CLIP text encoders' weights or configs");
  pipeline_checks::expect_finite(embeds_ok, "text encoders (CLIP and T5)", dir() / "text_encoder_3",
                                 T5EncoderModel::checkpoint_keys_not_loaded(), "the text encoders' weights or configs");
  stages.end();
  out.timings.encode = seconds_since(t0);
  if (args.on_stage) args.on_stage("encode", out.timings.encode);

  // 2. Initial latents: the given ones, or fp32 noise rounded to the dtype (Diffusers draws bf16
  //    noise in bf16: pass latents to reproduce a bf16 run's noise exactly).
  Tensor latents = args.latents.defined() ? cast(on_device(args.latents), dt)
                                          : from_vector(TorchGenerator(args.seed).randn(numel(shape)), shape);
  if (latents.dtype() != dt) latents = cast(latents, dt);

  // 3. Schedule: the static shift.
  FlowMatchEulerDiscreteScheduler scheduler(m_->scheduler);
  scheduler.set_timesteps(args.num_inference_steps);
  const Tensor embeds_pos = cfg ? slice(embeds, 0, 1, 2) : embeds;
  const Tensor pooled_pos = cfg ? slice(pooled, 0, 1, 2) : pooled;

  // 4. Denoising loop (see FluxPipeline: the preparation is flushed first so every step's
  //    deferred graph is the same).
  mark_step();
  use("transformer");
  stages.next("transformer");
  const int64_t n = args.num_inference_steps;
  for (int64_t i = 0; i < n; ++i) {
    t0 = std::chrono::steady_clock::now();
    const float t = scheduler.timesteps()[size_t(i)];
    Tensor v;
    if (cfg) {
      const Tensor v2 = m_->transformer.forward(concat({latents, latents}, 0), embeds, pooled,
                                                from_vector({t, t}, {2}));
      const Tensor vu = slice(v2, 0, 0, 1), vc = slice(v2, 0, 1, 2);
      v = vu + (vc - vu) * guidance_scale;
      // Skip-layer guidance on steps strictly inside (n·start, n·stop), the conditional prompt only.
      const bool slg = !args.skip_guidance_layers.empty() && double(i) > double(n) * args.skip_layer_guidance_start &&
                       double(i) < double(n) * args.skip_layer_guidance_stop;
      if (slg) {
        const Tensor vs =
            m_->transformer.forward(latents, embeds_pos, pooled_pos, from_vector({t}, {1}), args.skip_guidance_layers);
        v = v + (vc - vs) * args.skip_layer_guidance_scale;
      }
    } else {
      v = m_->transformer.forward(latents, embeds_pos, pooled_pos, from_vector({t}, {1}));
    }
    latents = scheduler.step(v, latents);
    finish_step(i, latents, t0, args, out);
  }
  out.latents = latents;
  stages.end();

  // 5. Decode: z = latents / scaling_factor + shift_factor, in the latents' dtype.
  decode_image([&] { return latents; }, sized.vae_tile_size, stages, args, out);
}

}  // namespace kiln
