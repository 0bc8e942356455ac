#include "pipelines/call_args_json.h"

#include "core/error.h"

namespace kiln {

namespace {

using nlohmann::json;

template <typename T>
void put(json& j, const char* name, const std::optional<T>& v) {
  if (v) j[name] = *v;
}

template <typename T>
void take(const json& j, const char* name, T& v) {
  const auto it = j.find(name);
  KILN_CHECK(it != j.end(), "pipeline", "call arguments: field '", name, "' is missing");
  try {
    v = it->get<T>();
  } catch (const json::exception& e) {
    fail("pipeline", "call arguments: field '", name, "': ", e.what());
  }
}

template <typename T>
void take(const json& j, const char* name, std::optional<T>& v) {
  if (!j.contains(name)) return v.reset();
  T value;
  take(j, name, value);
  v = std::move(value);
}

}  // namespace

json call_args_to_json(const PipelineCallArgs& a) {
  KILN_CHECK(!a.latents.defined(), "pipeline", "call arguments with explicit latents cannot be sent as JSON");
  json j{{"prompt", a.prompt},
         {"num_inference_steps", a.num_inference_steps},
         {"skip_guidance_layers", a.skip_guidance_layers},
         {"skip_layer_guidance_scale", a.skip_layer_guidance_scale},
         {"skip_layer_guidance_start", a.skip_layer_guidance_start},
         {"skip_layer_guidance_stop", a.skip_layer_guidance_stop},
         {"text_encoder_out_layers", a.text_encoder_out_layers},
         {"seed", a.seed},
         {"vae_tiling", int(a.vae_tiling)},
         {"vae_tile_size", a.vae_tile_size}};
  put(j, "prompt_2", a.prompt_2);
  put(j, "prompt_3", a.prompt_3);
  put(j, "negative_prompt", a.negative_prompt);
  put(j, "negative_prompt_2", a.negative_prompt_2);
  put(j, "negative_prompt_3", a.negative_prompt_3);
  put(j, "height", a.height);
  put(j, "width", a.width);
  put(j, "guidance_scale", a.guidance_scale);
  put(j, "max_sequence_length", a.max_sequence_length);
  return j;
}

PipelineCallArgs call_args_from_json(const json& j) {
  KILN_CHECK(j.is_object(), "pipeline", "call arguments: expected a JSON object, got ", j.type_name());
  PipelineCallArgs a;
  take(j, "prompt", a.prompt);
  take(j, "prompt_2", a.prompt_2);
  take(j, "prompt_3", a.prompt_3);
  take(j, "negative_prompt", a.negative_prompt);
  take(j, "negative_prompt_2", a.negative_prompt_2);
  take(j, "negative_prompt_3", a.negative_prompt_3);
  take(j, "height", a.height);
  take(j, "width", a.width);
  take(j, "num_inference_steps", a.num_inference_steps);
  take(j, "guidance_scale", a.guidance_scale);
  take(j, "max_sequence_length", a.max_sequence_length);
  take(j, "skip_guidance_layers", a.skip_guidance_layers);
  take(j, "skip_layer_guidance_scale", a.skip_layer_guidance_scale);
  take(j, "skip_layer_guidance_start", a.skip_layer_guidance_start);
  take(j, "skip_layer_guidance_stop", a.skip_layer_guidance_stop);
  take(j, "text_encoder_out_layers", a.text_encoder_out_layers);
  take(j, "seed", a.seed);
  int tiling = 0;
  take(j, "vae_tiling", tiling);
  KILN_CHECK(tiling >= int(VaeTilingMode::kAuto) && tiling <= int(VaeTilingMode::kOff), "pipeline",
             "call arguments: field 'vae_tiling' is not a tiling mode: ", tiling);
  a.vae_tiling = VaeTilingMode(tiling);
  take(j, "vae_tile_size", a.vae_tile_size);
  return a;
}

}  // namespace kiln
