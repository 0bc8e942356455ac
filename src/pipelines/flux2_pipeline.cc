#include "pipelines/flux2_pipeline.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "exec/capture.h"
#include "exec/deferred.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "io/json_config.h"
#include "models/flux2/flux2_transformer.h"
#include "models/llm/causal_lm_text_encoder.h"
#include "models/vae/autoencoder_kl.h"
#include "models/vae/flux2_latents.h"
#include "pipelines/pipeline_checks.h"
#include "pipelines/pipeline_loader.h"
#include "pipelines/torch_generator.h"
#include "schedulers/flow_match_euler.h"
#include "tokenizers/chat_template.h"
#include "tokenizers/prompt_tokenizer.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

// Flux2Pipeline's SYSTEM_MESSAGE (diffusers/pipelines/flux2/system_messages.py; note the line break).
constexpr const char* kSystemMessage =
    "You are an AI that reasons about image descriptions. You give structured responses focusing on object "
    "relationships, object\nattribution and actions without speculation.";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The value `v` has once stored in dtype `t` (a host scalar rounded as a device tensor would be).
float rounded_to(DType t, float v) {
  char bytes[8];
  store_from_double(bytes, t, 0, double(v));
  return float(load_as_double(bytes, t, 0));
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

// Image token ids [h·w, 4] = (0, y, x, 0), row-major (y outer), as int64.
Tensor latent_ids(int64_t h, int64_t w) {
  std::vector<int64_t> ids;
  ids.reserve(size_t(h * w * 4));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) ids.insert(ids.end(), {0, y, x, 0});
  return from_ints(ids, {h * w, 4});
}

// Text token ids [L, 4] = (0, 0, 0, l).
Tensor text_ids(int64_t length) {
  std::vector<int64_t> ids;
  ids.reserve(size_t(length * 4));
  for (int64_t l = 0; l < length; ++l) ids.insert(ids.end(), {0, 0, 0, l});
  return from_ints(ids, {length, 4});
}

}  // namespace

// What differs between the two FLUX.2 pipelines is data.
struct Flux2Pipeline::Variant {
  const char* class_name;
  std::vector<std::string> tokenizer_classes, text_encoder_classes;
  std::vector<int64_t> default_out_layers;
  bool system_message;           // dev: [system, user], tokenized without special tokens
  bool reads_is_distilled;       // klein: model_index.json's is_distilled decides real CFG
  bool guidance_embeds_allowed;  // dev: guidance enters through the guidance embedder
};

struct Flux2Pipeline::Models {
  const Variant* variant;
  bool is_distilled;
  tokenizers::PromptTokenizer tokenizer;
  tokenizers::ChatTemplate chat_template;
  std::vector<int64_t> out_layers;  // the default layers of a call
  CausalLMTextEncoder text_encoder;
  Flux2Transformer2DModel transformer;
  AutoencoderKL vae;
  FlowMatchEulerConfig scheduler;
};

namespace {
const Flux2Pipeline::Variant& dev_variant() {
  static const Flux2Pipeline::Variant v{Flux2Pipeline::kClassName,
                                        {"PixtralProcessor", "AutoProcessor", "LlamaTokenizer", "LlamaTokenizerFast",
                                         "PreTrainedTokenizerFast"},
                                        {"Mistral3ForConditionalGeneration"},
                                        {10, 20, 30},
                                        /*system_message=*/true,
                                        /*reads_is_distilled=*/false,
                                        /*guidance_embeds_allowed=*/true};
  return v;
}
const Flux2Pipeline::Variant& klein_variant() {
  static const Flux2Pipeline::Variant v{Flux2KleinPipeline::kClassName,
                                        {"Qwen2TokenizerFast", "Qwen2Tokenizer"},
                                        {"Qwen3ForCausalLM"},
                                        {9, 18, 27},
                                        /*system_message=*/false,
                                        /*reads_is_distilled=*/true,
                                        /*guidance_embeds_allowed=*/false};
  return v;
}
}  // namespace

Flux2Pipeline::Flux2Pipeline(std::unique_ptr<PipelineState> state, std::unique_ptr<Models> models)
    : DiffusionPipeline(std::move(state), models->transformer, models->vae), m_(std::move(models)) {}
Flux2Pipeline::Flux2Pipeline(Flux2Pipeline&&) noexcept = default;
Flux2Pipeline& Flux2Pipeline::operator=(Flux2Pipeline&&) noexcept = default;
Flux2Pipeline::~Flux2Pipeline() = default;

Flux2Pipeline Flux2Pipeline::from_pretrained(const fs::path& dir, const PipelineOptions& options) {
  return load(dir, options, dev_variant());
}

Flux2KleinPipeline Flux2KleinPipeline::from_pretrained(const fs::path& dir, const PipelineOptions& options) {
  return Flux2KleinPipeline(load(dir, options, klein_variant()));
}

Flux2Pipeline Flux2Pipeline::load(const fs::path& dir, const PipelineOptions& options, const Variant& variant) {
  // model_cpu_offload_seq = "text_encoder->transformer->vae".
  PipelineLoader load(dir, options, variant.class_name,
                      {{"tokenizer", variant.tokenizer_classes},
                       {"text_encoder", variant.text_encoder_classes},
                       {"transformer", {"Flux2Transformer2DModel"}},
                       {"vae", {"AutoencoderKLFlux2"}},
                       {"scheduler", {"FlowMatchEulerDiscreteScheduler"}}},
                      {"text_encoder", "transformer", "vae"});
  const io::JsonConfig index(load.dir() / "model_index.json");
  const bool is_distilled = !variant.reads_is_distilled || index.get_bool("is_distilled", false);
  // A slow tokenizer class in model_index.json reads tokenizer.model even where tokenizer.json exists.
  const std::vector<std::string> tokenizer_entry = index.get_string_list("tokenizer", {});
  const bool slow_tokenizer = tokenizer_entry.size() == 2 && tokenizer_entry[1] == "LlamaTokenizer";
  std::vector<int64_t> layers =
      options.text_encoder_out_layers.empty() ? variant.default_out_layers : options.text_encoder_out_layers;
  for (int64_t l : layers)
    KILN_CHECK(l >= 0, "pipeline", "text_encoder_out_layers: ", l, " is not a hidden_states index (0 = embeddings)");
  const int64_t needed = CausalLMTextEncoder::num_layers_needed(layers);
  const fs::path te_dir = load.path("text_encoder");
  auto m = std::unique_ptr<Models>(new Models{
      &variant, is_distilled, tokenizers::PromptTokenizer::from_pretrained(load.path("tokenizer"), slow_tokenizer),
      tokenizers::ChatTemplate::from_pretrained(load.path("tokenizer")), layers,
      load.load("text_encoder", CausalLMTextEncoder::checkpoint_keys_not_loaded(te_dir, needed),
                [&] {
                  return CausalLMTextEncoder::from_pretrained(te_dir, load.dtype("text_encoder"), needed,
                                                              options.tensor_parallel);
                }),
      load.load_transformer<Flux2Transformer2DModel>(),
      load.load_model<AutoencoderKL>("vae"),
      FlowMatchEulerConfig::load(load.path("scheduler") / "scheduler_config.json"),
  });
  KILN_CHECK(m->vae.latent_batch_norm().has_value(), "pipeline", (load.path("vae") / "config.json").string(),
             ": FLUX.2 needs AutoencoderKLFlux2's batch-norm statistics (bn.running_mean, bn.running_var)");
  const auto& tc = m->transformer.config();
  const int64_t joint = int64_t(layers.size()) * m->text_encoder.config().hidden_size;
  KILN_CHECK(tc.joint_attention_dim == joint, "pipeline", "text_encoder_out_layers has ", layers.size(),
             " layers of ", m->text_encoder.config().hidden_size, " features = ", joint,
             " per token, but the transformer's joint_attention_dim is ", tc.joint_attention_dim);
  KILN_CHECK(tc.in_channels == m->vae.config().batch_norm_channels(), "pipeline", "the transformer's in_channels (",
             tc.in_channels, ") must equal the VAE's patchified latent channels (",
             m->vae.config().batch_norm_channels(), ")");
  return Flux2Pipeline(load.finish(), std::move(m));
}

const char* Flux2Pipeline::class_name() const { return m_->variant->class_name; }
Flux2Transformer2DModel& Flux2Pipeline::transformer() { return m_->transformer; }
bool Flux2Pipeline::is_distilled() const { return m_->is_distilled; }
// dev is guidance-distilled (is_distilled: no CFG) but runs its 28 steps; klein's distilled twin is step-distilled.
bool Flux2Pipeline::step_distilled() const { return m_->variant->reads_is_distilled && m_->is_distilled; }
const std::vector<int64_t>& Flux2Pipeline::default_text_encoder_out_layers() const { return m_->out_layers; }

void Flux2Pipeline::warmup_transformer(int64_t h, int64_t w, int64_t max_sequence_length) const {
  m_->transformer.warmup(1, (h / 2) * (w / 2), max_sequence_length, m_->variant->guidance_embeds_allowed);
}

int64_t Flux2Pipeline::max_sequence_length(const PipelineCallArgs& args) const {
  const int64_t n = args.max_sequence_length.value_or(int64_t(call_argument_default("max_sequence_length", class_name())));
  KILN_CHECK(n >= 1, "pipeline", "max_sequence_length must be positive, got ", n);
  return n;
}

double Flux2Pipeline::guidance_scale(const PipelineCallArgs& args) const {
  return args.guidance_scale.value_or(call_argument_default("guidance_scale", class_name()));
}

bool Flux2Pipeline::real_cfg(const PipelineCallArgs& args) const {
  return m_->variant->reads_is_distilled && !m_->is_distilled && guidance_scale(args) > 1.0;
}

const std::vector<int64_t>& Flux2Pipeline::out_layers(const PipelineCallArgs& args) const {
  return args.text_encoder_out_layers.empty() ? m_->out_layers : args.text_encoder_out_layers;
}

double Flux2Pipeline::compute_empirical_mu(int64_t image_seq_len, int64_t num_steps) {
  const double a1 = 8.73809524e-05, b1 = 1.89833333, a2 = 0.00016927, b2 = 0.45666666;
  const double n = double(image_seq_len);
  if (image_seq_len > 4300) return a2 * n + b2;
  const double m_200 = a2 * n + b2, m_10 = a1 * n + b1;
  const double a = (m_200 - m_10) / 190.0, b = m_200 - 200.0 * a;
  return a * double(num_steps) + b;
}

std::string Flux2Pipeline::chat_text(const std::string& prompt) const {
  if (m_->variant->system_message)  // Diffusers' format_input drops literal [IMG] tokens
    return m_->chat_template.render({{"system", kSystemMessage}, {"user", replace_all(prompt, "[IMG]", "")}},
                                    /*add_generation_prompt=*/false);
  return m_->chat_template.render({{"user", prompt}}, /*add_generation_prompt=*/true, /*enable_thinking=*/false);
}

Flux2Pipeline::EncodedPrompt Flux2Pipeline::encode_prompt(const std::string& prompt, int64_t max_sequence_length,
                                                          const std::vector<int64_t>& layers) const {
  EncodedPrompt e;
  e.chat_text = chat_text(prompt);
  // dev: apply_chat_template(tokenize=True) adds no special tokens (the text starts with BOS);
  // klein: tokenizer(text) with its defaults (Qwen adds none either).
  const auto enc = m_->tokenizer.encode_padded(e.chat_text, max_sequence_length,
                                               /*add_special_tokens=*/!m_->variant->system_message);
  e.input_ids = enc.ids;
  e.attention_mask = enc.attention_mask;
  const int64_t L = int64_t(enc.ids.size());
  const std::vector<Tensor> hidden = m_->text_encoder.hidden_states(from_ints(enc.ids, {1, L}),
                                                                    from_ints(enc.attention_mask, {1, L}), layers);
  // stack(dim=1).permute(0, 2, 1, 3).reshape: per token, the layers' states side by side.
  e.prompt_embeds = hidden.size() == 1 ? hidden[0] : concat(hidden, 2);
  e.text_ids = text_ids(L);
  return e;
}

ComponentActivations Flux2Pipeline::trace_activations(int64_t h, int64_t w, int64_t max_sequence_length,
                                                      int64_t vae_tile_size) const {
  const int64_t L = max_sequence_length;
  const Tensor ids = from_ints(std::vector<int64_t>(size_t(L), 0), {1, L});
  const Tensor mask = from_ints(std::vector<int64_t>(size_t(L), 1), {1, L});
  const std::vector<int64_t> layers = m_->out_layers;
  return {
      {"text_encoder",
       trace_peak_bytes("text_encoder", [&] { return concat(m_->text_encoder.hidden_states(ids, mask, layers), 2); })},
      {"transformer", m_->transformer.activation_bytes(1, (h / 2) * (w / 2), L)},
      {"vae", decode_activation_bytes(h, w, vae_tile_size)},
  };
}

// Carried from stage to stage (f32 bound): prompt embeddings (twice with CFG), latents and the
// step's velocities, text/image ids, and the RoPE tables (cos, sin).
size_t Flux2Pipeline::carried_bytes(const PipelineCallArgs& args, int64_t h, int64_t w,
                                    int64_t max_sequence_length) const {
  const auto& tc = m_->transformer.config();
  const int64_t l_img = (h / 2) * (w / 2), S = max_sequence_length + l_img;
  const int64_t prompts = real_cfg(args) ? 2 : 1;
  const int64_t carried = prompts * max_sequence_length * tc.joint_attention_dim + 3 * l_img * tc.in_channels +
                          4 * S * 2 + 2 * 2 * S * tc.attention_head_dim;
  return size_t(carried) * 4;
}

double Flux2Pipeline::host_floor_bytes(int64_t height, int64_t width, int64_t max_sequence_length) const {
  const int64_t vsf = vae_scale_factor(), h = height / vsf, w = width / vsf;
  const double channels = double(m_->transformer.config().in_channels);
  const double pixels = double(height) * double(width), tokens = double(h / 2) * double(w / 2);
  return 4.0 * (3 * channels * tokens + 2 * 4 * tokens +
                2 * (tokens + double(max_sequence_length)) * double(m_->transformer.config().attention_head_dim) +
                3 * pixels) +
         3 * pixels;
}

void Flux2Pipeline::check_call(const PipelineCallArgs& args, int64_t height, int64_t width,
                               PipelineOutput& out) const {
  const std::string cls = class_name();
  const auto warn = [&](const std::string& w) {
    out.warnings.push_back(w);
    if (args.on_warning) args.on_warning(w);
  };
  const double g = guidance_scale(args);
  pipeline_checks::finite_scalar("guidance_scale", g, "a finite number (e.g. 4.0)");
  if (m_->variant->reads_is_distilled && m_->is_distilled && g > 1.0)
    warn("guidance_scale " + std::to_string(g) +
         " is ignored: this checkpoint is step-distilled (model_index.json is_distilled: true) and runs without "
         "classifier-free guidance");
  const std::vector<int64_t>& layers = out_layers(args);
  const int64_t loaded = m_->text_encoder.num_layers_loaded();
  for (int64_t l : layers)
    KILN_CHECK(l >= 0 && (l <= loaded || (l == m_->text_encoder.config().num_hidden_layers && m_->text_encoder.has_final_norm())),
               "pipeline", "text_encoder_out_layers: index ", l, " needs decoder layers the pipeline did not load (",
               loaded, " loaded; pass the layers to from_pretrained too: PipelineOptions::text_encoder_out_layers, "
               "CLI --text-encoder-out-layers)");
  KILN_CHECK(int64_t(layers.size()) * m_->text_encoder.config().hidden_size ==
                 m_->transformer.config().joint_attention_dim,
             "pipeline", "text_encoder_out_layers has ", layers.size(), " layers, but the transformer reads ",
             m_->transformer.config().joint_attention_dim / m_->text_encoder.config().hidden_size);
  // As Diffusers, a chat text longer than max_sequence_length is cut, with a warning here.
  const int64_t msl = max_sequence_length(args);
  const size_t tokens = m_->tokenizer.encode(chat_text(args.prompt), !m_->variant->system_message).size();
  if (int64_t(tokens) > msl)
    warn("the prompt's chat text is " + std::to_string(tokens) + " tokens but only the first " + std::to_string(msl) +
         " are used (max_sequence_length is " + std::to_string(msl) + "); the rest is cut");
  const int64_t vsf = vae_scale_factor(), h = height / vsf / 2, w = width / vsf / 2;
  const int64_t channels = m_->transformer.config().in_channels;
  const Shape packed{1, h * w, channels}, patchified{1, channels, h, w};
  if (args.latents.defined()) {
    KILN_CHECK(args.latents.shape() == packed || args.latents.shape() == patchified, "pipeline",
               "initial latents have shape ", to_string(args.latents.shape()), ", expected patchified ",
               to_string(patchified), " or packed ", to_string(packed), " for ", height, "x", width);
    pipeline_checks::finite_input("initial latents", args.latents);
  }
}

void Flux2Pipeline::run(const PipelineCallArgs& args, const Sized& sized, PipelineOutput& out) const {
  const int64_t vsf = vae_scale_factor(), h = sized.height / vsf / 2, w = sized.width / vsf / 2;
  const auto& tcfg = m_->transformer.config();
  const int64_t channels = tcfg.in_channels;
  const bool cfg = real_cfg(args);
  const double gs = guidance_scale(args);
  const std::vector<int64_t>& layers = out_layers(args);
  Stages stages(*this);
  out.guidance_scale = gs;

  // 1. Text: the prompt's (and with CFG the empty negative prompt's) hidden layers.
  auto t0 = std::chrono::steady_clock::now();
  stages.next("text_encoder");
  use("text_encoder");
  const EncodedPrompt pos = encode_prompt(args.prompt, sized.max_sequence_length, layers);
  std::optional<EncodedPrompt> neg;
  if (cfg) neg = encode_prompt("", sized.max_sequence_length, layers);
  const DType dt = m_->transformer.dtype();
  const auto in_dtype = [&](const Tensor& t) { return t.dtype() == dt ? t : cast(t, dt); };
  const Tensor embeds = in_dtype(pos.prompt_embeds);
  const Tensor neg_embeds = cfg ? in_dtype(neg->prompt_embeds) : Tensor();
  const Tensor embeds_ok = pipeline_checks::finite_probe(cfg ? concat({pos.prompt_embeds, neg->prompt_embeds}, 0)
                                                              : pos.prompt_embeds);
  wait(pos.prompt_embeds);
  pipeline_checks::expect_finite(embeds_ok, "text encoder", dir() / "text_encoder",
                                 m_->text_encoder.checkpoint_keys_not_loaded(),
                                 "the text encoder's weights or config");
  stages.end();
  out.timings.encode = seconds_since(t0);
  if (args.on_stage) args.on_stage("encode", out.timings.encode);

  // 2. Initial latents: noise drawn patchified [1, C·4, h', w'] and packed into tokens.
  const Shape patchified{1, channels, h, w};
  Tensor latents;
  if (args.latents.defined()) {
    const Tensor given = on_device(args.latents);
    latents = given.rank() == 4 ? flux2_latents::pack(given) : given;
    latents = cast(latents, dt);
  } else {
    // fp32 noise, rounded to the dtype (Diffusers draws bf16 noise with another generator path;
    // pass latents to reproduce a bf16 run's noise exactly).
    latents = flux2_latents::pack(from_vector(TorchGenerator(args.seed).randn(numel(patchified)), patchified));
    if (dt != DType::f32) latents = cast(latents, dt);
  }
  const Tensor img_ids = latent_ids(h, w);

  // 3. Schedule: linspace(1, 1/n, n) shifted with the empirical mu; guidance for dev.
  FlowMatchEulerDiscreteScheduler scheduler(m_->scheduler);
  scheduler.set_timesteps(args.num_inference_steps, compute_empirical_mu(h * w, args.num_inference_steps));
  std::optional<Tensor> guidance;
  if (m_->variant->guidance_embeds_allowed && tcfg.guidance_embeds) guidance = from_vector({float(gs)}, {1});

  // 4. Denoising loop (every step runs the same graph; per-step scalars are values).
  mark_step();
  use("transformer");
  stages.next("transformer");
  for (int64_t i = 0; i < args.num_inference_steps; ++i) {
    t0 = std::chrono::steady_clock::now();
    const float t = scheduler.timesteps()[size_t(i)];
    // t in the latents' dtype, divided by 1000 in that dtype.
    const Tensor timestep = from_vector({rounded_to(dt, rounded_to(dt, t) / 1000.0f)}, {1}, dt);
    Tensor v = m_->transformer.forward(latents, embeds, timestep, img_ids, pos.text_ids, guidance);
    if (cfg) {
      const Tensor v_neg = m_->transformer.forward(latents, neg_embeds, timestep, img_ids, neg->text_ids, guidance);
      v = v_neg + gs * (v - v_neg);
    }
    latents = scheduler.step(v, latents);
    finish_step(i, latents, t0, args, out);
  }
  out.latents = latents;
  stages.end();

  // 5. Unpack by ids, de-normalize, unpatchify, decode.
  decode_image(
      [&] {
        return flux2_latents::tokens_to_vae_latents(latents, unsqueeze(img_ids, 0), *m_->vae.latent_batch_norm(),
                                                     m_->vae.patch_size());
      },
      sized.vae_tile_size, stages, args, out);
}

}  // namespace kiln
