// What an image's PNG says about how it was made, and --from-png reading it back.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "io/hub_cache.h"
#include "pipelines/diffusion_pipeline.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRecipeKey = "kiln";  // the PNG keyword of the JSON

// --dtype's value for `options`: "auto", "bf16", "bf16,vae=f32", "auto,vae=f32".
std::string dtype_text(const PipelineOptions& options) {
  std::string text = options.dtype ? dtype_name(*options.dtype) : "auto";
  for (const auto& [component, dtype] : options.component_dtype)
    text += "," + component + "=" + (dtype ? dtype_name(*dtype) : "auto");
  return text;
}

// --quantize's value: "transformer=q8_0,text_encoder_2=q4_k", "" for none.
std::string quantize_text(const PipelineOptions& options) {
  std::string text;
  for (const auto& [component, type] : options.quantize)
    text += (text.empty() ? "" : ",") + component + "=" + dtype_name(type);
  return text;
}

// The guidance as AUTOMATIC1111's infotext names it: "CFG scale" where it is classifier-free
// guidance, "Distilled CFG Scale" where a guidance-distilled transformer reads it (Forge's name).
std::string a1111_guidance(const std::string& pipeline_class, const PipelineCallArgs& call, double guidance) {
  char text[96];
  if (pipeline_class == "FluxPipeline" || pipeline_class == "Flux2Pipeline")
    std::snprintf(text, sizeof text, "CFG scale: %g, Distilled CFG Scale: %g", call.true_cfg_scale.value_or(1.0),
                  guidance);
  else
    std::snprintf(text, sizeof text, "CFG scale: %g", guidance);
  return text;
}

}  // namespace

std::string model_name(const fs::path& model, bool bundled) {
  if (bundled) return kBundledModelName;
  std::error_code ec;
  if (!fs::exists(model, ec) && io::is_repo_id(model.string())) return model.string();  // a repo id, as given
  fs::path p = model.lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "FLUX.1-schnell/"
  // A hub cache snapshot, .../models--ORG--NAME/snapshots/REV: the repository's id.
  if (p.parent_path().filename() == "snapshots")
    if (std::string id = io::repo_id_of_cache_folder(p.parent_path().parent_path().filename().string()); !id.empty())
      return id;
  return p.filename().string();
}

io::PngText image_metadata(const PipelineCallArgs& call, const std::string& seed, const PipelineOutput& result,
                           const std::string& model, const std::string& pipeline_class,
                           const PipelineOptions& options, const std::string& latents_file) {
  // The call after the pipeline's defaults, so the recipe does not depend on them.
  PipelineCallArgs resolved = call;
  resolved.latents = Tensor();
  resolved.height = result.height;
  resolved.width = result.width;
  resolved.guidance_scale = result.guidance_scale;
  resolved.max_sequence_length = result.max_sequence_length;
  nlohmann::json recipe{{"software", std::string("kiln ") + KILN_VERSION},
                        {"pipeline", pipeline_class},
                        {"model", model},
                        {"call", call_args_to_json(resolved)},
                        {"dtype", dtype_text(options)},
                        {"quantize", quantize_text(options)},
                        {"component_files", nlohmann::json::object()}};
  // File names only: a path of this machine never travels with an image.
  for (const auto& [component, file] : options.component_files)
    recipe["component_files"][component] = file.filename().string();
  if (!latents_file.empty()) recipe["latents"] = fs::path(latents_file).filename().string();

  std::string parameters = call.prompt;
  if (call.negative_prompt) parameters += "\nNegative prompt: " + *call.negative_prompt;
  parameters += "\nSteps: " + std::to_string(call.num_inference_steps) + ", Sampler: Euler, " +
                a1111_guidance(pipeline_class, call, result.guidance_scale) + ", Seed: " + seed +
                ", Size: " + std::to_string(result.width) + "x" + std::to_string(result.height) +  // WxH, as A1111
                ", Model: " + model + ", Version: kiln " + KILN_VERSION;
  return {{"prompt", call.prompt},
          {"seed", seed},
          {"steps", std::to_string(call.num_inference_steps)},
          {"size", std::to_string(result.height) + "x" + std::to_string(result.width)},  // HxW, as every message
          {"model", model},
          {"software", std::string("kiln ") + KILN_VERSION},
          {"parameters", parameters},
          {kRecipeKey, recipe.dump()}};
}

ImageRecipe read_image_recipe(const fs::path& png) {
  const std::string where = "--from-png " + png.string();
  const io::PngImage image = io::read_png(png);
  const std::string* text = nullptr;
  for (const auto& [key, value] : image.text)
    if (key == kRecipeKey) text = &value;
  KILN_CHECK(text, "cli", where, ": the PNG has no '", kRecipeKey,
             "' text chunk (it was not written by kiln generate or kiln serve 0.1.0 or later)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    fail("cli", where, ": its '", kRecipeKey, "' chunk is not JSON (", e.what(), ")");
  }
  ImageRecipe r;
  try {
    r.model = j.at("model").get<std::string>();
    r.dtype = j.at("dtype").get<std::string>();
    r.quantize = j.at("quantize").get<std::string>();
    r.component_files = j.at("component_files").get<std::map<std::string, std::string>>();
    r.latents_file = j.value("latents", "");
  } catch (const nlohmann::json::exception& e) {
    fail("cli", where, ": its '", kRecipeKey, "' chunk: ", e.what());
  }
  KILN_CHECK(j.contains("call"), "cli", where, ": its '", kRecipeKey, "' chunk has no 'call'");
  try {
    r.call = call_args_from_json(j["call"]);
  } catch (const Error& e) {
    fail("cli", where, ": ", e.what());
  }
  return r;
}

}  // namespace kiln::cli
