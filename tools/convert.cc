// kiln convert: a pipeline's transformer written as one file, quantized as --quantize would hold
// it (the same nn::Weights path), so a later run reads it in place with --transformer FILE.
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "core/error.h"
#include "exec/host.h"
#include "io/gguf_writer.h"
#include "io/safetensors.h"
#include "pipelines/diffusion_pipeline.h"

namespace kiln::cli {

namespace fs = std::filesystem;

int convert(const std::vector<std::string>& args) {
  std::string model;
  fs::path out;
  PipelineOptions options;
  bool quantize_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    KILN_CHECK(i + 1 < args.size(), "cli", "flag ", flag, " expects a value");
    const std::string& value = args[++i];
    if (flag == "--model") model = parse_model(value);
    else if (flag == "--out") out = value;
    else if (flag == "--dtype") parse_dtype(value, options);
    else if (flag == "--quantize") parse_quantize(value, options), quantize_given = true;
    else fail("cli", "unknown flag '", flag, "' for convert (see kiln convert --help)");
  }
  KILN_CHECK(!model.empty(), "cli", "convert needs --model DIR (a Diffusers folder)");
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

  std::fprintf(stderr, "kiln: loading %s with the transformer quantized to %s\n", model.c_str(), dtype_name(type));
  const std::unique_ptr<DiffusionPipeline> pipe = DiffusionPipeline::from_pretrained(model, options);
  const nn::NamedParameters& params = pipe->transformer_parameters();
  uint64_t bytes = 0;
  if (ext == ".gguf") {
    io::GgufWriter writer(out);
    writer.set_metadata("general.architecture", io::GgufValue{std::string("kiln")});
    writer.set_metadata("kiln.pipeline_class", io::GgufValue{std::string(pipe->class_name())});
    writer.set_metadata("kiln.component", io::GgufValue{std::string("transformer")});
    writer.set_metadata("kiln.quantization", io::GgufValue{std::string(dtype_name(type))});
    writer.set_metadata("kiln.layout", io::GgufValue{std::string("diffusers")});
    for (const auto& [key, t] : params) {
      wait(t);
      writer.add_tensor(key, t);
    }
    bytes = writer.write();
  } else {
    io::save_safetensors(out, params);
    bytes = fs::file_size(out);
  }
  size_t quantized = 0;
  for (const auto& [key, t] : params) quantized += t.dtype() == type ? 1 : 0;
  std::fprintf(stderr, "kiln: wrote %s: %zu tensors (%zu in %s), %.2f GB\n", out.string().c_str(), params.size(),
               quantized, dtype_name(type), double(bytes) / 1e9);
  return 0;
}

}  // namespace kiln::cli
