#include "pipelines/call_arguments.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/flag_value.h"
#include "pipelines/pipeline_checks.h"

namespace kiln {

namespace {

using nlohmann::json;
using A = PipelineCallArgs;

// Plain literals: pipelines read their defaults from the table during static initialization.
constexpr const char *kFlux = "FluxPipeline", *kSd3 = "StableDiffusion3Pipeline", *kFlux2 = "Flux2Pipeline",
                     *kKlein = "Flux2KleinPipeline";
constexpr double kNoBound = 0;
constexpr double kLayers = 4096;  // layer indices, far beyond any model's depth

}  // namespace

const std::vector<CallArgument>& call_arguments() {
  using pipeline_checks::kMaxSide;
  using pipeline_checks::kMaxSteps;
  static const std::vector<CallArgument> table = {
      {"prompt", "--prompt", "TEXT", &A::prompt, kNoBound, kNoBound, {}, {}, "required with --model",
       "the prompt of every text encoder without its own"},
      {"prompt_2", "--prompt-2", "TEXT", &A::prompt_2, kNoBound, kNoBound, {kFlux, kSd3}, {}, "--prompt",
       "FLUX: the T5 prompt; SD3: the CLIP-G prompt"},
      {"prompt_3", "--prompt-3", "TEXT", &A::prompt_3, kNoBound, kNoBound, {kSd3}, {}, "--prompt", "SD3: the T5 prompt"},
      {"negative_prompt", "--negative-prompt", "TEXT", &A::negative_prompt, kNoBound, kNoBound, {kFlux, kSd3}, {},
       "\"\"",
       "the unconditional prompt of classifier-free guidance (SD3 with --guidance above 1; FLUX.1 with "
       "--true-cfg-scale above 1)"},
      {"negative_prompt_2", "--negative-prompt-2", "TEXT", &A::negative_prompt_2, kNoBound, kNoBound, {kFlux, kSd3}, {},
       "--negative-prompt", "FLUX.1: T5's negative prompt; SD3: CLIP-G's"},
      {"negative_prompt_3", "--negative-prompt-3", "TEXT", &A::negative_prompt_3, kNoBound, kNoBound, {kSd3}, {},
       "--negative-prompt", "SD3: T5's negative prompt"},
      {"height", "--height", "H", &A::height, 16, double(kMaxSide), {}, {}, "1024 (128 x vae_scale_factor)",
       "image height; not a multiple of 16: rounded down (FLUX) or refused (SD3)", false},
      {"width", "--width", "W", &A::width, 16, double(kMaxSide), {}, {}, "1024 (128 x vae_scale_factor)",
       "image width; as --height", false},
      {"num_inference_steps", "--steps", "N", &A::num_inference_steps, 1, double(kMaxSteps), {}, {},
       "28 (4 for the bundled checkpoint)", "denoising steps (use 4 for schnell)"},
      {"guidance_scale", "--guidance", "G", &A::guidance_scale, 0, 100, {},
       {{kFlux, 3.5}, {kSd3, 7.0}, {kFlux2, 4.0}, {kKlein, 4.0}}, "FLUX 3.5, SD3 7.0, FLUX.2 4.0",
       "FLUX.1/FLUX.2-dev: guidance-distilled checkpoints only; SD3 and FLUX.2 klein base: classifier-free "
       "guidance, on above 1 (two transformer passes per step); distilled klein ignores it"},
      {"true_cfg_scale", "--true-cfg-scale", "G", &A::true_cfg_scale, 0, 100, {kFlux}, {{kFlux, 1.0}}, "1.0",
       "FLUX.1: real classifier-free guidance with --negative-prompt, on above 1 (two transformer passes per step)"},
      {"max_sequence_length", "--max-sequence-length", "N", &A::max_sequence_length, 1, 512, {},
       {{kFlux, 512}, {kSd3, 256}, {kFlux2, 512}, {kKlein, 512}},
       "FLUX 512, SD3 256, FLUX.2 512 (32 for the bundled checkpoint)",
       "T5 (FLUX.2: chat-template) tokens; a longer prompt is cut with a warning"},
      {"clip_skip", "--clip-skip", "N", &A::clip_skip, 0, kLayers, {kSd3}, {}, "0",
       "SD3: CLIP layers skipped from the end for the prompt's embeddings (hidden_states[-(N + 2)])"},
      {"skip_guidance_layers", "--slg-layers", "I,J,...", &A::skip_guidance_layers, 0, kLayers, {kSd3}, {}, "off",
       "SD3 skip-layer guidance: blocks skipped in a third pass (SD3.5 Medium: 7,8,9)"},
      {"skip_layer_guidance_scale", "--slg-scale", "S", &A::skip_layer_guidance_scale, 0, 100, {kSd3}, {}, "2.8",
       "SD3: the skip-layer guidance scale"},
      {"skip_layer_guidance_start", "--slg-start", "F", &A::skip_layer_guidance_start, 0, 1, {kSd3}, {}, "0.01",
       "SD3: skip-layer guidance starts at this fraction of the steps"},
      {"skip_layer_guidance_stop", "--slg-stop", "F", &A::skip_layer_guidance_stop, 0, 1, {kSd3}, {}, "0.2",
       "SD3: and stops at this one"},
      {"text_encoder_out_layers", "--text-encoder-out-layers", "I,J,K", &A::text_encoder_out_layers, 0, kLayers,
       {kFlux2, kKlein}, {}, "FLUX.2-dev 10,20,30; klein 9,18,27",
       "FLUX.2: the text encoder's hidden_states concatenated per token; only the layers they need are loaded"},
      {"seed", "--seed", "S", &A::seed, 0, kNoBound, {}, {}, "0",
       "noise of torch.Generator(\"cpu\").manual_seed(S) + torch.randn"},
      {"vae_tiling", "--vae-tiling", "auto|on|off", &A::vae_tiling, kNoBound, kNoBound, {}, {}, "auto",
       "decode the image in overlapping tiles with blended seams (Diffusers' vae.enable_tiling()); auto: only when "
       "the untiled decode would not fit in memory",
       false},
      {"vae_tile_size", "--vae-tile-size", "PIXELS", &A::vae_tile_size, 1, double(kMaxSide), {}, {},
       "the VAE's sample_size (1024)",
       "image pixels per tile side (Diffusers' tile_sample_min_size): a multiple of 4 latent pixels (32 for an 8x "
       "VAE)",
       false},
  };
  return table;
}

const CallArgument* call_argument_named(const std::string& name) {
  for (const CallArgument& a : call_arguments())
    if (name == a.name) return &a;
  return nullptr;
}

const std::vector<CallArgumentAlias>& call_argument_aliases() {
  static const std::vector<CallArgumentAlias> aliases = {
      {"-p", "prompt"},
      {"-n", "negative_prompt"},
      {"-H", "height"},
      {"-W", "width"},
      {"-s", "seed"},
      {"--num-inference-steps", "num_inference_steps"},
      {"--guidance-scale", "guidance_scale"},
      {"--cfg-scale", "guidance_scale"},
  };
  return aliases;
}

const CallArgument* call_argument_of_flag(const std::string& flag) {
  for (const CallArgument& a : call_arguments())
    if (flag == a.flag) return &a;
  for (const CallArgumentAlias& a : call_argument_aliases())
    if (flag == a.flag) return call_argument_named(a.name);
  return nullptr;
}

double call_argument_default(const std::string& name, const std::string& class_name) {
  const CallArgument* a = call_argument_named(name);
  KILN_CHECK(a, "internal", "no call argument '", name, "'");
  const auto it = a->defaults.find(class_name);
  KILN_CHECK(it != a->defaults.end(), "internal", "the call argument table states no default of ", name, " for ",
             class_name);
  return it->second;
}

bool is_set(const PipelineCallArgs& args, const CallArgument& a) {
  static const PipelineCallArgs defaults;
  return std::visit(
      [&](auto member) {
        using T = std::decay_t<decltype(args.*member)>;
        if constexpr (std::is_same_v<T, std::vector<int64_t>>) return !(args.*member).empty();
        else return !(args.*member == defaults.*member);
      },
      a.field);
}

bool takes(const CallArgument& a, const std::string& class_name) {
  if (a.pipelines.empty()) return true;
  for (const std::string& c : a.pipelines)
    if (c == class_name) return true;
  return false;
}

void check_arguments_taken(const PipelineCallArgs& args, const std::string& class_name) {
  for (const CallArgument& a : call_arguments()) {
    if (takes(a, class_name) || !is_set(args, a)) continue;
    std::string who;
    for (size_t i = 0; i < a.pipelines.size(); ++i) {
      if (i > 0) who.append(i + 1 == a.pipelines.size() ? " and " : ", ");
      who.append(a.pipelines[i]);
    }
    fail("pipeline", a.name, " (", a.flag, ") is not an argument of ", class_name, "; ", who,
         a.pipelines.size() == 1 ? " takes it" : " take it");
  }
}

namespace {

// A bound as written: whole numbers without a fraction.
std::string number(double v) {
  return v == std::floor(v) && std::fabs(v) < 1e15 ? std::to_string(int64_t(v)) : json(v).dump();
}

// A range as text: "[lo, hi]".
std::string range(double lo, double hi) {
  std::string r = "[";  // appended (GCC 12 warns falsely on "[" + std::string)
  r.append(number(lo)).append(", ").append(number(hi)).append("]");
  return r;
}
std::string range(const CallArgument& a) { return range(a.lo, a.hi); }

double number_from_text(const CallArgument& a, const std::string& v) {
  const std::optional<double> x = whole_number(v);
  KILN_CHECK(x && std::isfinite(*x) && *x >= a.lo && *x <= a.hi, "cli", "flag ", a.flag, " expects a number in ",
             range(a), ", got '", v, "'");
  return *x;
}

VaeTilingMode tiling_from_text(const std::string& v, const std::string& who) {
  if (v == "auto") return VaeTilingMode::kAuto;
  if (v == "on") return VaeTilingMode::kOn;
  if (v == "off") return VaeTilingMode::kOff;
  fail("cli", who, " ", v, ": expected auto (tiles only when the untiled decode would not fit in memory), on or off");
}

const char* tiling_name(VaeTilingMode m) {
  return m == VaeTilingMode::kAuto ? "auto" : m == VaeTilingMode::kOn ? "on" : "off";
}

// "a string", "a number", ... for messages.
const char* type_name(const json& v) {
  return v.is_string() ? "a string" : v.is_boolean() ? "a boolean" : v.is_number() ? "a number"
         : v.is_array()  ? "an array"
         : v.is_object() ? "an object"
                         : "null";
}

[[noreturn]] void refuse(const CallArgument& a, const std::string& expected, const json& got) {
  fail("pipeline", a.name, ": expected ", expected, ", got ",
       got.is_number() || got.is_string() ? got.dump().substr(0, 64) : type_name(got));
}

int64_t int_from_json(const CallArgument& a, const json& v, double lo, double hi) {
  const std::string expected = "an integer in " + range(lo, hi);
  if (!v.is_number_integer()) refuse(a, expected, v);
  // Unsigned values beyond int64 fail the range check as the minimum.
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())
                        ? std::numeric_limits<int64_t>::min()
                        : v.get<int64_t>();
  if (double(x) < lo || double(x) > hi) refuse(a, expected, v);
  return x;
}

}  // namespace

void set_from_text(PipelineCallArgs& args, const CallArgument& a, const std::string& text) {
  std::visit(
      [&](auto member) {
        using T = std::decay_t<decltype(args.*member)>;
        if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::optional<std::string>>) {
          args.*member = text;
        } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, std::optional<int64_t>>) {
          const int64_t x = parse_int(a.flag, text);
          pipeline_checks::check_bounds("cli", a.flag, x, int64_t(a.lo), int64_t(a.hi));
          args.*member = x;
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          const std::optional<uint64_t> x = whole_uint(text);
          KILN_CHECK(x.has_value(), "cli", "flag ", a.flag, " expects an integer from 0 to 18446744073709551615, got '",
                     text, "'");
          args.*member = *x;
        } else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, std::optional<double>>) {
          args.*member = number_from_text(a, text);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          const std::vector<int64_t> values = parse_int_list(a.flag, text);
          for (int64_t x : values) pipeline_checks::check_bounds("cli", a.flag, x, int64_t(a.lo), int64_t(a.hi));
          args.*member = values;
        } else {
          static_assert(std::is_same_v<T, VaeTilingMode>);
          args.*member = tiling_from_text(text, a.flag);
        }
      },
      a.field);
}

void set_from_json(PipelineCallArgs& args, const CallArgument& a, const json& v) {
  std::visit(
      [&](auto member) {
        using T = std::decay_t<decltype(args.*member)>;
        if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::optional<std::string>>) {
          if (!v.is_string()) refuse(a, "a string", v);
          args.*member = v.get<std::string>();
        } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, std::optional<int64_t>>) {
          args.*member = int_from_json(a, v, a.lo, a.hi);
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          if (!v.is_number_unsigned()) refuse(a, "an integer in [0, 18446744073709551615]", v);
          args.*member = v.get<uint64_t>();
        } else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, std::optional<double>>) {
          if (!v.is_number()) refuse(a, "a number", v);
          const double x = v.get<double>();
          if (!std::isfinite(x) || x < a.lo || x > a.hi) refuse(a, "a number in " + range(a), v);
          args.*member = x;
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          if (!v.is_array() || v.size() > 256) refuse(a, "an array of at most 256 integers", v);
          std::vector<int64_t> out;
          for (const json& e : v) out.push_back(int_from_json(a, e, a.lo, a.hi));
          args.*member = out;
        } else {
          static_assert(std::is_same_v<T, VaeTilingMode>);
          const std::string s = v.is_string() ? v.get<std::string>() : "";
          if (s == "auto") args.*member = VaeTilingMode::kAuto;
          else if (s == "on") args.*member = VaeTilingMode::kOn;
          else if (s == "off") args.*member = VaeTilingMode::kOff;
          else refuse(a, "\"auto\", \"on\" or \"off\"", v);
        }
      },
      a.field);
}

json call_args_to_json(const PipelineCallArgs& args) {
  KILN_CHECK(!args.latents.defined(), "pipeline", "call arguments with explicit latents cannot be sent as JSON");
  json j = json::object();
  for (const CallArgument& a : call_arguments())
    std::visit(
        [&](auto member) {
          using T = std::decay_t<decltype(args.*member)>;
          const T& v = args.*member;
          if constexpr (std::is_same_v<T, VaeTilingMode>) j[a.name] = tiling_name(v);
          else if constexpr (std::is_same_v<T, std::optional<std::string>> || std::is_same_v<T, std::optional<int64_t>> ||
                             std::is_same_v<T, std::optional<double>>) {
            if (v) j[a.name] = *v;
          } else j[a.name] = v;
        },
        a.field);
  return j;
}

PipelineCallArgs call_args_from_json(const json& j) {
  KILN_CHECK(j.is_object(), "pipeline", "call arguments: expected a JSON object, got ", j.type_name());
  PipelineCallArgs args;
  for (const CallArgument& a : call_arguments()) {
    const bool optional = std::visit(
        [](auto member) {
          using T = std::decay_t<decltype(PipelineCallArgs{}.*member)>;
          return std::is_same_v<T, std::optional<std::string>> || std::is_same_v<T, std::optional<int64_t>> ||
                 std::is_same_v<T, std::optional<double>>;
        },
        a.field);
    const auto it = j.find(a.name);
    if (it == j.end()) {
      KILN_CHECK(optional, "pipeline", "call arguments: field '", a.name, "' is missing");
      continue;
    }
    try {
      set_from_json(args, a, *it);
    } catch (const Error& e) {
      const std::string m = e.what();  // "[pipeline] NAME: expected ..."
      fail("pipeline", "call arguments: field '", a.name, "': ", m.substr(m.find(": ") + 2));
    }
  }
  return args;
}

}  // namespace kiln
