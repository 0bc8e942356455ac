// The __call__ arguments of every pipeline, declared once: the values a call carries
// (PipelineCallArgs) and a table that says, for each, its Diffusers name (kiln serve's request
// key and the JSON the ranks exchange under --tp), generate's flag, its type and bounds, which
// pipeline classes take it and their defaults, and its help line. The CLI parser and --help,
// kiln serve's request parser, the ranks' JSON and the "not an argument of this pipeline"
// refusal are generic code over the table.
//
// A new argument: a field below, a row in call_arguments.cc, and the pipeline code that reads it.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace kiln {

// Tiled VAE decoding (Diffusers' pipe.vae.enable_tiling(), AutoencoderKL.tiled_decode).
enum class VaeTilingMode {
  kAuto,  // tiled only when the call's memory plan says the untiled decode does not fit
  kOn,    // always (latents larger than one tile)
  kOff,   // never
};

// The values of one call, by their Diffusers names. std::nullopt (or an empty list) takes the
// pipeline's default; an argument a pipeline does not take is an error naming it when set.
struct PipelineCallArgs {
  std::string prompt;
  std::optional<std::string> prompt_2;  // FLUX: T5's prompt; SD3: CLIP-G's. Default: prompt
  std::optional<std::string> prompt_3;  // SD3: T5's prompt. Default: prompt
  // Classifier-free guidance's unconditional prompts: default "" and, for _2/_3, negative_prompt.
  std::optional<std::string> negative_prompt, negative_prompt_2, negative_prompt_3;
  std::optional<int64_t> height, width;  // default: default_sample_size * vae_scale_factor
  int64_t num_inference_steps = 28;
  // FLUX: used only by guidance-distilled (dev) checkpoints. SD3: classifier-free guidance, on
  // when > 1.
  std::optional<double> guidance_scale;
  // FLUX.1: real classifier-free guidance, on when > 1 and a negative prompt is given.
  std::optional<double> true_cfg_scale;
  std::optional<int64_t> max_sequence_length;  // T5 tokens
  // SD3: CLIP layers skipped from the end: the prompt embeddings are hidden_states[-(clip_skip + 2)].
  std::optional<int64_t> clip_skip;
  // SD3 skip-layer guidance (Diffusers' skip_guidance_layers, skip_layer_guidance_scale, _start,
  // _stop): empty = off.
  std::vector<int64_t> skip_guidance_layers;
  double skip_layer_guidance_scale = 2.8;
  double skip_layer_guidance_start = 0.01;
  double skip_layer_guidance_stop = 0.2;
  // FLUX.2: the text encoder's hidden_states indices concatenated per token (empty: the
  // pipeline's default, dev (10, 20, 30), klein (9, 18, 27)).
  std::vector<int64_t> text_encoder_out_layers;
  uint64_t seed = 0;  // torch.Generator("cpu").manual_seed(seed) noise, unless latents are given
  VaeTilingMode vae_tiling = VaeTilingMode::kAuto;
  // Diffusers' vae.tile_sample_min_size: image pixels per tile side (default: the VAE's
  // sample_size). kAuto starts from it and halves it until the plan fits.
  std::optional<int64_t> vae_tile_size;

  // Not in the table (they do not travel as text or JSON):
  // Explicit initial noise (parity tests): [1, C, h, w], or FLUX's packed [1, L_img, 4C].
  Tensor latents;
  // Called after every denoising step with (step index from 0, total steps, seconds of that step).
  std::function<void(int64_t, int64_t, double)> on_step;
  // Diffusers' callback_on_step_end: called after every denoising step with (step index from 0,
  // the latents that step produced: FLUX's packed, SD3's [1, C, h, w]).
  std::function<void(int64_t, const Tensor&)> callback_on_step_end;
  // Called at once with each warning (e.g. a size rounded down, a prompt cut), before the work starts.
  std::function<void(const std::string&)> on_warning;
  // Called when a stage other than the steps ends: ("encode" | "decode", seconds).
  std::function<void(const std::string&, double)> on_stage;
  // Called once the argument and memory checks have passed, before any work; throwing stops the
  // call there (kiln serve under --tp: every rank's checks must pass before any rank starts).
  std::function<void()> on_checked;
};

// One row of the table.
struct CallArgument {
  using Field = std::variant<std::string PipelineCallArgs::*, std::optional<std::string> PipelineCallArgs::*,
                             int64_t PipelineCallArgs::*, std::optional<int64_t> PipelineCallArgs::*,
                             uint64_t PipelineCallArgs::*, double PipelineCallArgs::*,
                             std::optional<double> PipelineCallArgs::*, std::vector<int64_t> PipelineCallArgs::*,
                             VaeTilingMode PipelineCallArgs::*>;
  const char* name;     // Diffusers' name: the request key and the ranks' JSON key
  const char* flag;     // kiln generate's flag
  const char* metavar;  // its value in --help
  Field field;
  double lo, hi;  // the accepted range of a number, or of each element of a list
  // The classes that take it (empty: every pipeline).
  std::vector<std::string> pipelines;
  // Each class's default, where it has one the table states (a class not listed: see `shown_default`).
  std::map<std::string, double> defaults;
  const char* shown_default;  // the default as --help shows it
  const char* help;
  bool in_requests = true;  // kiln serve's request body takes it under `name`
};

const std::vector<CallArgument>& call_arguments();
// The row of `name` (a Diffusers name) or of `flag` (generate's); nullptr when there is none.
const CallArgument* call_argument_named(const std::string& name);
// `flag` is the row's flag or one of its aliases.
const CallArgument* call_argument_of_flag(const std::string& flag);

// Other spellings of generate's flags, as users bring them from other tools (stable-diffusion.cpp's
// short flags, Diffusers' argument names): {alias, the Diffusers name of the row}.
struct CallArgumentAlias {
  const char* flag;  // "-p"
  const char* name;  // "prompt"
};
const std::vector<CallArgumentAlias>& call_argument_aliases();

// `class_name`'s default for the argument `name` (its row's `defaults`); an internal error when
// the table states none.
double call_argument_default(const std::string& name, const std::string& class_name);

// Whether `args` sets the argument (an optional given, a list not empty, a value away from
// PipelineCallArgs{}'s).
bool is_set(const PipelineCallArgs& args, const CallArgument& a);
// Whether `class_name` takes the argument.
bool takes(const CallArgument& a, const std::string& class_name);
// Every argument `args` sets that `class_name` does not take is an error naming the first one
// and the classes that take it.
void check_arguments_taken(const PipelineCallArgs& args, const std::string& class_name);

// Sets the argument from generate's flag value (`text`): an error ("cli") naming the flag and
// what it expects otherwise.
void set_from_text(PipelineCallArgs& args, const CallArgument& a, const std::string& text);
// Sets the argument from a JSON value: an error naming `a.name` and what was expected otherwise
// (the message starts with "<name>: ").
void set_from_json(PipelineCallArgs& args, const CallArgument& a, const nlohmann::json& value);

// The call's values as JSON, every table argument (unset optionals left out), and back: what
// kiln serve's rank 0 sends the other ranks under --tp. Callbacks stay behind; explicit latents
// are refused (a request cannot set them). From JSON, an argument that is not optional must be
// there; any error names the field.
nlohmann::json call_args_to_json(const PipelineCallArgs& args);
PipelineCallArgs call_args_from_json(const nlohmann::json& j);

}  // namespace kiln
