// Subcommands of the `kiln` CLI. Each takes its arguments (after the subcommand name) and
// returns the process exit code; errors are thrown as kiln::Error and printed by main.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/device.h"
#include "core/flag_value.h"  // parse_int, parse_int_list
#include "io/png.h"
#include "pipelines/call_arguments.h"

namespace kiln {
class DiffusionPipeline;
struct PipelineOptions;
struct PipelineCallArgs;
struct PipelineOutput;
struct PipelineProgress;
}

namespace kiln::cli {

// The bundled checkpoint's defaults are its Diffusers fixture's call (tests/fixtures/
// flux1_tiny_arch/manifest.json), so the bundled run writes Diffusers' image: 128x128, 4 steps,
// 32 T5 tokens.
constexpr int64_t kBundledSize = 128, kBundledSteps = 4, kBundledMaxSequenceLength = 32;

int inspect(const std::vector<std::string>& args);
int generate(const std::vector<std::string>& args);
int warmup(const std::vector<std::string>& args);
int compare(const std::vector<std::string>& args);
int make_random(const std::vector<std::string>& args);  // make_random.cc
int plan(const std::vector<std::string>& args);         // plan.cc
int convert(const std::vector<std::string>& args);      // convert.cc
int list(const std::vector<std::string>& args);         // list.cc

// Shared by generate and warmup (generate.cc).
struct ImageSize {
  int64_t height = 0, width = 0;
};
// "512x512,1024x768" (HEIGHTxWIDTH, each side at least 16): warmup's --sizes, serve's --warmup.
std::vector<ImageSize> parse_sizes(const std::string& flag, const std::string& value);  // warmup.cc
// --threads N (generate, serve, convert): at most N threads per parallel region, 1 to 1024.
void parse_threads(const std::string& value);
std::string parse_model(const std::string& value);  // --model: not "" (no --model = bundled)
// The component a checkpoint-file flag names ("--text-encoder-2" -> "text_encoder_2"); "" for other flags.
std::string component_file_flag(const std::string& flag);
size_t parse_bytes(const std::string& flag, const std::string& value);  // "6GiB", "512MiB", "2GB", bytes
void check_compile_flag(const std::string& value);                      // "full" or "blocks"
// Before anything loads, the launch must match --tp N (0: not given): no model offload, and N
// processes under mpirun, or, with `in_process` (the first device of a device whose ranks are
// threads, DeviceRuntime::runs_ranks_in_process), one process and N devices from that one.
// `command` names the subcommand in the error.
void check_tensor_parallel_launch(const std::string& command, int64_t tp, const std::string& offload,
                                  const Device* in_process = nullptr);
// --dtype auto|bf16|f16|f32[,COMPONENT=DTYPE...] into options.dtype / options.component_dtype.
void parse_dtype(const std::string& value, PipelineOptions& options);
// --quantize TYPE|COMPONENT=TYPE[,...] into options.quantize (a bare TYPE is the transformer's).
void parse_quantize(const std::string& value, PipelineOptions& options);
// The report's engine.dtype (per component) and memory.weights_bytes of a loaded pipeline.
nlohmann::json dtype_report(const DiffusionPipeline& pipe);
nlohmann::json weight_bytes_report(const DiffusionPipeline& pipe);
// The report's engine.quantization: per component, --quantize's type and the checkpoint file
// that replaced its weights (memory.weights_bytes.by_dtype counts the formats loaded).
nlohmann::json quantization_report(const PipelineOptions& options);
// The fail-fast estimate of a call that ran (memory.estimate): per component weights and traced
// activations, and what its placement needs, to read beside the measured peaks.
nlohmann::json estimate_report(const DiffusionPipeline& pipe, const PipelineCallArgs& call, const PipelineOutput& result);
void compile_transformer(DiffusionPipeline& pipe, const std::string& how, bool prepack_weights = true);   // --compile full|blocks
// A line as a phase PipelineOptions::on_progress names starts or ends (generate.cc).
void print_progress(const PipelineProgress& p);
// The name an image's metadata and the server give a model: its folder's name, a hub snapshot's
// repository id ("org/name"), a repo id as given, or the bundled checkpoint's id
// (kBundledModelName) — never a path on this machine, which would travel with every image.
std::string model_name(const std::filesystem::path& model, bool bundled);
constexpr const char* kBundledModelName = "kiln-bundled-flux1-tiny";

// The PNG text of an image (generate and serve write the same; image_metadata.cc): prompt, seed
// (as given), steps, size "HxW", model (model_name) and the software; "parameters" as AUTOMATIC1111
// writes it (read by other tools); and "kiln", the JSON that makes the image again (--from-png):
// the pipeline class, the model's name, every call argument after the pipeline's defaults, and the
// load options that change the image (dtype, quantization, component files by file name).
io::PngText image_metadata(const PipelineCallArgs& call, const std::string& seed, const PipelineOutput& result,
                           const std::string& model, const std::string& pipeline_class,
                           const PipelineOptions& options, const std::string& latents_file = "");

// What --from-png FILE recorded, to start a generate call from.
struct ImageRecipe {
  std::string model;  // model_name's; kBundledModelName for the bundled checkpoint
  PipelineCallArgs call;
  std::string dtype, quantize;                         // --dtype and --quantize values ("" for none)
  std::map<std::string, std::string> component_files;  // component -> the file's name
  std::string latents_file;                            // the --latents file's name, "" for the seed's noise
};
// Reads FILE's "kiln" chunk; errors ("cli") name the flag, the file and what is wrong.
ImageRecipe read_image_recipe(const std::filesystem::path& png);

int serve(const std::vector<std::string>& args);        // serve.cc

}  // namespace kiln::cli
