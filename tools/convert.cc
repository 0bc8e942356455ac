// kiln convert: a pipeline's transformer written as one file, quantized as --quantize would hold
// it (the same nn::Weights path), so a later run reads it in place with --transformer FILE.
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "help.h"
#include "core/error.h"
#include "core/terminal.h"
#include "exec/host.h"
#include "io/gguf_writer.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "models/transformer_families.h"
#include "nn/component_load.h"
#include "nn/key_mapped_source.h"
#include "nn/tensor_map_source.h"
#include "nn/weights.h"
#include "pipelines/diffusion_pipeline.h"
#include "pipelines/model_argument.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

// The class of the folder's transformer (its config.json's _class_name), checked before any load.
const TransformerFamily& transformer_family_of(const fs::path& dir) {
  const fs::path config = dir / "transformer" / "config.json";
  const std::string name = io::JsonConfig(config).get_string("_class_name", "");
  const TransformerFamily* family = transformer_family(name);
  KILN_CHECK(family, "cli", config.string(), ": _class_name '", name, "' is not a transformer kiln converts (",
             transformer_class_names(), ")");
  return *family;
}

}  // namespace

int convert(const std::vector<std::string>& args) {
  std::string model;
  fs::path out;
  PipelineOptions options;
  bool quantize_given = false;
  std::string layout = "diffusers";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    KILN_CHECK(i + 1 < args.size(), "cli", "flag ", flag, " expects a value");
    const std::string& value = args[++i];
    if (flag == "--model") model = parse_model(value);
    else if (flag == "--out") out = value;
    else if (flag == "--dtype") parse_dtype(value, options);
    else if (flag == "--quantize") parse_quantize(value, options), quantize_given = true;
    else if (flag == "--threads") parse_threads(value);
    else if (flag == "--layout") layout = value;
    else unknown_flag("convert", flag);
  }
  KILN_CHECK(!model.empty(), "cli", "convert needs --model DIR (a Diffusers folder)");
  KILN_CHECK(!out.empty(), "cli", "convert needs --out FILE (.gguf or .safetensors)");
  KILN_CHECK(layout == "diffusers" || layout == "original", "cli", "--layout ", layout,
             ": expected diffusers (Diffusers' tensor names) or original (the single-file names: BFL, Stability)");
  KILN_CHECK(quantize_given, "cli", "convert needs --quantize TYPE (q8_0, q4_k, q5_k, q4_0, f8_e4m3, f8_e5m2)");
  KILN_CHECK(options.quantize.size() == 1 && options.quantize.count("transformer"), "cli",
             "convert writes the transformer: --quantize takes one TYPE (or transformer=TYPE)");
  const DType type = options.quantize.at("transformer");
  const std::string ext = out.extension().string();
  KILN_CHECK(ext == ".gguf" || ext == ".safetensors", "cli", "--out ", out.string(),
             ": expected a .gguf or .safetensors file");
  KILN_CHECK(ext == ".safetensors" || is_block_quantized(type), "cli", "--out ", out.string(), ": GGUF has no ",
             dtype_name(type), " (fp8 is written as .safetensors)");
  KILN_CHECK(ext == ".gguf" || !is_block_quantized(type), "cli", "--out ", out.string(), ": safetensors has no ",
             dtype_name(type), " (ggml block types are written as .gguf)");

  KILN_CHECK(layout == "diffusers" || ext == ".gguf", "cli", "--layout original writes GGUF (.gguf)");
  const fs::path dir = pipeline_folder(model);
  const TransformerFamily& family = transformer_family_of(dir);
  const auto per = options.component_dtype.find("transformer");
  print_line(stderr, "kiln: loading %s/transformer quantized to %s", model.c_str(), dtype_name(type));
  // Built as a pipeline builds it under --quantize; only this component is loaded.
  const nn::ComponentLoad quantizing(nullptr, type);
  const nn::NamedParameters params =
      family.load(dir / "transformer", per != options.component_dtype.end() ? per->second : options.dtype);
  uint64_t bytes = 0;
  io::GgufMetadata metadata{{"general.architecture", io::GgufValue{std::string("kiln")}},
                            {"kiln.class_name", io::GgufValue{std::string(family.class_name)}},
                            {"kiln.component", io::GgufValue{std::string("transformer")}},
                            {"kiln.quantization", io::GgufValue{std::string(dtype_name(type))}},
                            {"kiln.layout", io::GgufValue{layout}}};
  if (layout == "original") {
    std::map<std::string, Tensor> tensors(params.begin(), params.end());
    bytes = nn::write_original_layout_gguf(nn::TensorMapSource(std::move(tensors)), original_key_map(family.original), out,
                                           metadata);
  } else if (ext == ".gguf") {
    std::vector<std::pair<std::string, Tensor>> tensors(params.begin(), params.end());
    for (const auto& [key, t] : tensors) wait(t);
    bytes = io::write_gguf(out, metadata, tensors);
  } else {
    io::save_safetensors(out, params);
    bytes = fs::file_size(out);
  }
  size_t quantized = 0;
  for (const auto& [key, t] : params) quantized += t.dtype() == type ? 1 : 0;
  print_line(stderr, "kiln: wrote %s: %zu tensors (%zu in %s), %.2f GB", out.string().c_str(), params.size(),
             quantized, dtype_name(type), double(bytes) / 1e9);
  return 0;
}

}  // namespace kiln::cli
