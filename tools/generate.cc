// `kiln generate`: text to image with any pipeline class kiln implements (the one the model
// folder's model_index.json names), like diffusers' DiffusionPipeline.from_pretrained(...)(...).
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "help.h"
#include "core/error.h"
#include "core/flag_value.h"
#include "core/terminal.h"
#include "core/thread_count.h"
#include "devices/runtime.h"
#include "distributed/local_ranks.h"
#include "distributed/process_group.h"
#include "distributed/same_arguments.h"
#include "distributed/tensor_parallel.h"
#include "exec/compile.h"
#include "exec/counters.h"
#include "exec/deferred.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "io/input_file.h"
#include "io/kiln_files.h"
#include "io/mapped_file.h"
#include "io/output_file.h"
#include "io/png.h"
#include "io/safetensors.h"
#include "pipelines/diffusion_pipeline.h"
#include "pipelines/pipeline_checks.h"
#include "random_checkpoint/like_recipe.h"
#include "report.h"
#include "exec/profile.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kDefaultPrompt = "A painting of a squirrel eating a burger";

struct Options {
  fs::path model;
  bool bundled = false;
  PipelineCallArgs call;
  fs::path latents_file;
  fs::path out = "out.png";
  fs::path report;
  bool report_given = false;  // --report "" is refused (io/output_file.h), not taken as no report
  bool profile = false;       // --profile: the report gains profile.by_op
  std::string device = "cpu";
  std::string mode = "eager";
  bool mode_given = false;
  std::string compile = "full";  // --mode compile: full (transformer.compile) or blocks (compile_repeated_blocks)
  bool compile_given = false;
  std::string prepack = "on";  // --mode compile: linears read the module's weights pre-packed
  bool prepack_given = false;
  std::string offload;       // "", "none" (pipe.to(device)) or "model" (enable_model_cpu_offload)
  int64_t tp = 0;  // --tp N: tensor parallel over N processes (mpirun -np N), or N devices of one process
  size_t device_memory = 0;  // --device-memory: the device allocator's capacity (0 = unlimited)
  bool strict = false;       // --strict: unused checkpoint tensors are errors
  bool verbose = false;      // --verbose: the phases' progress also when stderr is no terminal
  PipelineOptions dtypes;  // --dtype (parse_dtype): its dtype and component_dtype
  bool steps_given = false;  // --steps (or --from-png): else a step-distilled checkpoint runs kDistilledSteps
};

// --seed random: a seed drawn from the system's entropy, printed and recorded in the PNG like any
// other, so the image can be made again.
std::string random_seed() {
  std::random_device device;
  const uint64_t seed = (uint64_t(device()) << 32 | device()) & ((uint64_t(1) << 53) - 1);  // exact in JSON numbers
  std::fprintf(stderr, "kiln: --seed random: %llu\n", static_cast<unsigned long long>(seed));
  return std::to_string(seed);
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  o.call.prompt = kDefaultPrompt;
  bool prompt_given = false, length_given = false;
  // --from-png FILE: the call and load options the image recorded first; every other flag, before
  // or after it, overrides them.
  std::optional<ImageRecipe> recipe;
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--from-png") recipe = read_image_recipe(args[i + 1]);
  if (recipe) {
    o.call = recipe->call;
    if (recipe->model != kBundledModelName) o.model = parse_model(recipe->model);
    parse_dtype(recipe->dtype, o.dtypes);
    if (!recipe->quantize.empty()) parse_quantize(recipe->quantize, o.dtypes);
    for (const auto& [component, file] : recipe->component_files) o.dtypes.component_files[component] = file;
    o.steps_given = prompt_given = length_given = true;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&]() -> std::string {
      KILN_CHECK(i + 1 < args.size(), "cli", "flag ", flag, " needs a value");
      return args[++i];
    };
    if (flag == "--model") o.model = parse_model(value());
    else if (flag == "--from-png") value();  // read above
    // The pipeline call's arguments (pipelines/call_arguments.h), each checked against its bounds here,
    // before minutes of model loading.
    else if (const CallArgument* a = call_argument_of_flag(flag)) {
      std::string v = value();
      if (a->name == std::string("seed") && v == "random") v = random_seed();
      set_from_text(o.call, *a, v);
      const std::string name = a->name;
      prompt_given |= name == "prompt";
      o.steps_given |= name == "num_inference_steps";
      length_given |= name == "max_sequence_length";
    }
    else if (flag == "--latents") o.latents_file = value();
    else if (flag == "-o" || flag == "--output" || flag == "--out") o.out = value();
    else if (flag == "--report") o.report = value(), o.report_given = true;
    else if (flag == "--profile") o.profile = true;
    else if (flag == "--device") o.device = value();
    // The plugin a pjrt device loads, read where the device starts (devices/pjrt).
    else if (flag == "--pjrt-plugin") ::setenv("KILN_PJRT_PLUGIN", value().c_str(), 1);
    else if (flag == "--mode") o.mode = value(), o.mode_given = true;
    else if (flag == "--compile") o.compile = value(), o.compile_given = true;
    else if (flag == "--prepack") o.prepack = value(), o.prepack_given = true;
    else if (flag == "--offload") o.offload = value();
    else if (flag == "--tp") {
      o.tp = parse_int(flag, value());
      KILN_CHECK(o.tp >= 1, "cli", "--tp must be at least 1, got ", o.tp);
    }
    else if (flag == "--device-memory") o.device_memory = parse_bytes(flag, value());
    else if (flag == "--strict") o.strict = true;
    else if (flag == "--verbose") o.verbose = true;
    else if (flag == "--dtype") parse_dtype(value(), o.dtypes);  // before any model is loaded
    else if (flag == "--quantize") parse_quantize(value(), o.dtypes);
    else if (flag == "--threads") parse_threads(value());
    else if (const std::string c = component_file_flag(flag); !c.empty()) o.dtypes.component_files[c] = value();
    else unknown_flag("generate", flag);
  }
  const Device device = Device::parse(o.device);
  runtime(device);  // "[device] cuda:0 is not available: ..." where the build or the machine lacks it
  const bool in_process = runtime(device).runs_ranks_in_process();
  KILN_CHECK(o.tp <= 1 || runtime(device).is_host() || in_process, "cli", "--tp with --device ", o.device,
             " is not supported yet (the CUDA device has no NCCL collectives)");
  KILN_CHECK(o.mode == "eager" || o.mode == "defer" || o.mode == "compile", "cli", "--mode ", o.mode,
             ": expected eager (strict, one kernel per op), defer (deferred-and-fused) or compile (compiled "
             "transformer)");
  check_compile_flag(o.compile);
  KILN_CHECK(o.offload.empty() || o.offload == "none" || o.offload == "model", "cli", "--offload ", o.offload,
             ": expected none (every component's weights on the device) or model (one component at a time)");
  check_tensor_parallel_launch("generate", o.tp, o.offload, in_process ? &device : nullptr);
  KILN_CHECK(!o.compile_given || o.mode == "compile", "cli", "--compile ", o.compile, " needs --mode compile");
  KILN_CHECK(o.prepack == "on" || o.prepack == "off", "cli", "--prepack ", o.prepack,
             ": expected on (compiled linears read their weights pre-packed, one more copy of them in device "
             "memory) or off");
  KILN_CHECK(!o.prepack_given || o.mode == "compile", "cli", "--prepack ", o.prepack, " needs --mode compile");
  KILN_CHECK(!o.call.vae_tile_size || o.call.vae_tiling != VaeTilingMode::kOff, "cli",
             "--vae-tile-size has no effect with --vae-tiling off");
  KILN_CHECK(!o.profile || o.report_given, "cli", "--profile adds to the report: it needs --report FILE");
  // stable-diffusion.cpp's tile size counts latent pixels; kiln's counts image pixels.
  if (o.call.vae_tile_size && *o.call.vae_tile_size < 128)
    print_line(stderr, "kiln: warning: --vae-tile-size %lld is in image pixels (%lld latent pixels): tiles this small "
               "decode slowly, each with its overlap; stable-diffusion.cpp's tile size counts latent pixels, 8 "
               "image pixels each", static_cast<long long>(*o.call.vae_tile_size),
               static_cast<long long>(*o.call.vae_tile_size / 8));
  KILN_CHECK(o.model.empty() || prompt_given, "cli", "--prompt is required with --model");
  KILN_CHECK(!recipe || recipe->latents_file.empty() || !o.latents_file.empty(), "cli",
             "--from-png: the image was made from the noise of --latents ", recipe ? recipe->latents_file : "",
             "; pass that file with --latents");
  if (o.model.empty()) {
    o.model = io::bundled_model_dir();
    o.bundled = true;
    // The bundled checkpoint is a toy: its default run is its fixture's call (commands.h).
    if (!o.call.height) o.call.height = kBundledSize;
    if (!o.call.width) o.call.width = kBundledSize;
    if (!o.steps_given) o.call.num_inference_steps = kBundledSteps;  // a schnell-style checkpoint
    if (!length_given) o.call.max_sequence_length = kBundledMaxSequenceLength;
    std::fprintf(stderr, "kiln: no --model given, using the bundled tiny FLUX.1 checkpoint (%s)\n", o.model.c_str());
  }
  return o;
}

}  // namespace

std::string component_file_flag(const std::string& flag) {
  for (const char* c : {"transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"}) {
    std::string f = std::string("--") + c;
    for (char& ch : f)
      if (ch == '_') ch = '-';
    if (flag == f) return c;
  }
  return "";
}

void parse_threads(const std::string& v) {
  const int64_t n = parse_int("--threads", v);
  KILN_CHECK(n >= 1 && n <= 1024, "cli", "--threads must be in [1, 1024], got ", v);
  set_thread_count(int(n));
}

std::string parse_model(const std::string& v) {
  KILN_CHECK(!v.empty(), "cli", "--model \"\": expected a model folder (leave --model out for the bundled checkpoint)");
  // A short name (flux1-schnell, sd3.5-medium, flux2-klein-4b, ...) that names no folder here: the
  // Hub repo it stands for, looked up in the Hugging Face cache as a repo id is.
  std::error_code ec;
  if (fs::exists(v, ec)) return v;
  try {
    if (const std::string repo = random_weights::like_hub_repo(v); !repo.empty()) return repo;
  } catch (const Error&) {
    // kiln's data folder cannot be read: no short names; the model's own error follows.
  }
  return v;
}

size_t parse_bytes(const std::string& flag, const std::string& v) {
  const auto [x, used] = leading_number(v);
  const std::string unit = v.substr(std::min(used, v.size()));
  const std::pair<const char*, double> units[] = {{"", 1},         {"B", 1},         {"KiB", 1024.0},
                                                  {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"KB", 1e3},
                                                  {"MB", 1e6},     {"GB", 1e9}};
  for (const auto& [name, scale] : units)
    if (used > 0 && unit == name && x * scale >= 1 && x * scale < 9.0e18) return size_t(x * scale);
  fail("cli", "flag ", flag, " expects a size such as 6GiB, 512MiB or 2GB, got '", v, "'");
}

void check_tensor_parallel_launch(const std::string& command, int64_t tp, const std::string& offload,
                                  const Device* in_process) {
  const int world = ProcessGroup::world()->size();
  KILN_CHECK(tp >= 0, "cli", "--tp must be at least 1, got ", tp);
  KILN_CHECK(tp <= 1 || offload != "model", "cli", "--offload model with --tp is not supported");
  if (in_process && tp > 1) {
    KILN_CHECK(world == 1, "cli", "--tp ", tp, " with --device ", in_process->str(), " runs its ", tp,
               " ranks in this process, one device each: launch it without mpirun");
    const Device last{in_process->type, in_process->index + int(tp) - 1};
    try {
      runtime(last);
    } catch (const Error& e) {
      fail("cli", "--tp ", tp, " runs one rank on each of ", in_process->str(), " to ", last.str(), ", but ",
           e.what());
    }
    return;
  }
  KILN_CHECK(tp == 0 || tp == world, "cli", "--tp ", tp, " needs ", tp, " processes (mpirun -np ", tp, " kiln ",
             command, " --tp ", tp, " ...), but this job has ", world);
  KILN_CHECK(tp != 0 || world == 1, "cli", "launched as ", world, " processes: pass --tp ", world,
             " to shard the transformer over them");
}

void check_compile_flag(const std::string& v) {
  KILN_CHECK(v == "full" || v == "blocks", "cli", "--compile ", v,
             ": expected full (the whole transformer, one executable per size) or blocks (compile_repeated_blocks: "
             "one executable per block class and size)");
}

// A line as each phase that can take seconds starts and ends (the transformer's run has its
// steps' progress instead).
void print_progress(const PipelineProgress& p) {
  const bool start = p.seconds < 0;
  const std::string detail = p.detail.empty() ? "" : " (" + p.detail + ")";
  if (p.phase == "load" && start) print_line(stderr, "kiln: loading %s%s", p.component.c_str(), detail.c_str());
  else if (p.phase == "load") print_line(stderr, "kiln: loaded %s in %.2f s", p.component.c_str(), p.seconds);
  else if (p.phase == "onload" && start) print_line(stderr, "kiln: onloading %s", p.component.c_str());
  else if (p.phase == "onload") print_line(stderr, "kiln: onloaded %s in %.2f s", p.component.c_str(), p.seconds);
  else if (p.phase == "run" && p.component != "transformer")
    print_line(stderr, "kiln: %s with %s", p.component == "vae" ? "decoding" : "encoding", p.component.c_str());
}

void compile_transformer(DiffusionPipeline& pipe, const std::string& how, bool prepack_weights) {
  CompileOptions options;
  options.fullgraph = true;  // the transformers' forwards have no graph break; any would be a bug worth an error
  options.prepack_weights = prepack_weights;
  pipe.compile_transformer(how == "blocks" ? CompileScope::kRepeatedBlocks : CompileScope::kFull, options);
}

namespace {

// --latents FILE[:TENSOR]: the tensor TENSOR, else 'latents', else the file's only tensor.
Tensor load_latents(const fs::path& spec) {
  fs::path file = spec;
  std::string name;
  const std::string text = spec.string();
  std::error_code ec;
  if (const size_t colon = text.rfind(':'); colon != std::string::npos && !fs::exists(spec, ec)) {
    file = text.substr(0, colon);
    name = text.substr(colon + 1);
  }
  // A FIFO, socket, device or folder is refused naming the flag, never opened (io/input_file.h);
  // a missing file is the reader's "cannot open".
  if (fs::exists(file, ec))
    io::check_input_file("cli", "--latents " + file.string(), file, "a safetensors file holding the latents");
  const io::SafetensorsFile f(file);
  const auto names = f.names();
  if (name.empty()) name = f.contains("latents") ? "latents" : (names.size() == 1 ? names[0] : "");
  std::string list;
  for (size_t i = 0; i < names.size() && i < 12; ++i) list += (i ? ", " : "") + names[i];
  KILN_CHECK(!name.empty(), "cli", "--latents ", file.string(), ": expected a tensor named 'latents', a single tensor, "
                                                                 "or FILE:TENSOR with one of ", list);
  KILN_CHECK(f.contains(name), "cli", "--latents ", file.string(), ": no tensor '", name, "' (it has ", list, ")");
  KILN_CHECK(f.info(name).dtype && is_floating(*f.info(name).dtype), "cli", "--latents ", file.string(), ": tensor '",
             name, "' is ", f.info(name).dtype_string, ", expected a floating-point tensor");
  return f.load(name, DType::f32);
}

// "step 3/28  1.52 s/step  ETA 38 s" on a terminal (one updating line), plain lines otherwise.
void progress(int64_t i, int64_t n, double step_seconds, double& total) {
  total += step_seconds;
  const double per = total / double(i + 1), eta = per * double(n - i - 1);
  if (::isatty(STDERR_FILENO)) {
    const int width = 24, done = int(width * (i + 1) / n);
    std::fprintf(stderr, "\r[%s%s] step %lld/%lld  %.2f s/step  ETA %.0f s ", std::string(size_t(done), '#').c_str(),
                 std::string(size_t(width - done), '.').c_str(), static_cast<long long>(i + 1),
                 static_cast<long long>(n), per, eta);
    if (i + 1 == n) std::fprintf(stderr, "\n");
  } else {
    std::fprintf(stderr, "step %lld/%lld %.3f s\n", static_cast<long long>(i + 1), static_cast<long long>(n),
                 step_seconds);
  }
}

// One rank's run (the only one without --tp): load, place, call, and on rank 0 write the image
// and the report.
int generate_rank(Options o) {
  const std::shared_ptr<ProcessGroup> world = ProcessGroup::world();
  const bool writer = world->rank() == 0;  // under --tp only rank 0 writes the image and report
  const Device device = Device::parse(o.device);
  if (o.device_memory) runtime(device).set_memory_capacity(o.device_memory);
  PipelineOptions pipe_options;
  if (o.tp > 1) pipe_options.tensor_parallel = TensorParallelConfig{DeviceMesh(world)};
  pipe_options.strict = o.strict;
  pipe_options.text_encoder_out_layers = o.call.text_encoder_out_layers;  // only the layers they need are loaded
  pipe_options.dtype = o.dtypes.dtype;
  pipe_options.component_dtype = o.dtypes.component_dtype;
  pipe_options.quantize = o.dtypes.quantize;
  pipe_options.component_files = o.dtypes.component_files;
  const auto warn = [writer](const std::string& w) {
    if (writer) print_line(stderr, "kiln: warning: %s", w.c_str());
  };
  pipe_options.on_warning = warn;
  if (writer && (o.verbose || ::isatty(STDERR_FILENO))) pipe_options.on_progress = print_progress;
  if (writer) print_line(stderr, "kiln: loading %s", o.model.c_str());
  const std::unique_ptr<DiffusionPipeline> loaded = DiffusionPipeline::from_pretrained(o.model, pipe_options);
  DiffusionPipeline& pipe = *loaded;
  if (writer) std::fprintf(stderr, "kiln: loaded in %.2f s\n", pipe.load_seconds());
  for (const auto& [component, dtype] : pipe.dtypes())
    if (dtype == DType::f16 && !runtime(device).computes_fast(DType::f16)) {
      warn(component + " computes in f16, which " + device.str() +
           " has no arithmetic of its own for (the CPU lacks AVX512-FP16): bf16 holds the same bytes and runs "
           "faster here (--dtype bf16)");
      break;
    }
  if (!o.steps_given && !o.bundled && pipe.step_distilled()) {
    o.call.num_inference_steps = DiffusionPipeline::kDistilledSteps;
    if (writer)
      print_line(stderr, "kiln: a step-distilled checkpoint: %lld steps (--steps N to choose)",
                 static_cast<long long>(o.call.num_inference_steps));
  }
  // On a device with memory of its own the weights must be there: every one (pipe.to) unless
  // model offload moves one component at a time. The CPU reads them in place by default.
  if (o.offload == "none" || (o.offload.empty() && !runtime(device).is_host())) pipe.to(device);
  if (o.offload == "model") pipe.enable_model_cpu_offload(device);
  if (o.mode == "compile") compile_transformer(pipe, o.compile, o.prepack == "on");
  double step_total = 0;
  o.call.on_step = [&](int64_t i, int64_t n, double s) {
    if (writer) progress(i, n, s, step_total);
  };
  o.call.on_warning = warn;
  o.call.on_stage = [writer](const std::string& stage, double seconds) {
    if (!writer) return;
    if (stage == "encode") std::fprintf(stderr, "kiln: encoded the prompts in %.2f s\n", seconds);
    else std::fprintf(stderr, "kiln: %s in %.2f s\n", stage == "decode" ? "decoded the image" : stage.c_str(), seconds);
  };
  reset_profile();
  set_profiling(o.profile);
  const PipelineOutput result = pipe(o.call);
  set_profiling(false);

  const io::PngText meta = image_metadata(
      o.call, o.latents_file.empty() ? std::to_string(o.call.seed) : "latents from " + o.latents_file.string(), result,
      model_name(o.model, o.bundled), pipe.class_name(), pipe_options, o.latents_file.string());
  // Per-rank figures for the report (every rank takes part in the gather).
  struct RankFigures {
    uint64_t bytes_read, device_peak, host_rss;
  };
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  // In-process ranks share the process: each counts what its own thread read.
  const bool threads = world->in_process() && world->size() > 1;
  const RankFigures mine{threads ? io::bytes_read_by_this_thread() : io::bytes_read(),
                         runtime(device).memory().peak_bytes, uint64_t(usage.ru_maxrss) * 1024};
  std::vector<RankFigures> ranks(size_t(world->size()));
  synchronize(device);  // no graph collective may still be queued when the host issues one
  world->all_gather(&mine, ranks.data(), sizeof(RankFigures));
  if (!writer) return 0;
  io::write_png(o.out, result.image.data(), result.height, result.width, meta);
  print_line(stderr, "kiln: wrote %s (%lldx%lld, %lld steps, %.2f s)", o.out.c_str(),
               static_cast<long long>(result.height), static_cast<long long>(result.width),
               static_cast<long long>(o.call.num_inference_steps), result.timings.total + pipe.load_seconds());

  if (!o.report.empty()) {
    nlohmann::json inputs{{"command", "generate"},
                          {"model", o.model.string()},
                          {"prompt", o.call.prompt},
                          {"prompt_2", o.call.prompt_2.value_or(o.call.prompt)},
                          {"pipeline", pipe.class_name()},
                          {"prompt_3", o.call.prompt_3 ? nlohmann::json(*o.call.prompt_3) : nlohmann::json()},
                          {"negative_prompt", o.call.negative_prompt ? nlohmann::json(*o.call.negative_prompt)
                                                                     : nlohmann::json()},
                          {"skip_guidance_layers", o.call.skip_guidance_layers},
                          {"text_encoder_out_layers", o.call.text_encoder_out_layers},
                          {"skip_layer_guidance_scale", o.call.skip_layer_guidance_scale},
                          {"skip_layer_guidance_start", o.call.skip_layer_guidance_start},
                          {"skip_layer_guidance_stop", o.call.skip_layer_guidance_stop},
                          {"height", o.call.height ? nlohmann::json(*o.call.height) : nlohmann::json()},
                          {"width", o.call.width ? nlohmann::json(*o.call.width) : nlohmann::json()},
                          {"output_height", result.height},
                          {"output_width", result.width},
                          {"steps", o.call.num_inference_steps},
                          {"guidance", result.guidance_scale},
                          {"max_sequence_length", result.max_sequence_length},
                          {"seed", o.call.seed},
                          {"latents", o.latents_file.string()},
                          {"vae_tiling", o.call.vae_tiling == VaeTilingMode::kAuto ? "auto"
                                         : o.call.vae_tiling == VaeTilingMode::kOn ? "on"
                                                                                   : "off"},
                          {"out", o.out.string()}};
    nlohmann::json timings{{"load", pipe.load_seconds()},
                           {"encode", result.timings.encode},
                           {"steps", result.timings.steps},
                           {"decode", result.timings.decode},
                           {"decode_vae_tile_size", result.vae_tile_size},
                           {"total", pipe.load_seconds() + result.timings.total}};
    nlohmann::json engine{{"version", KILN_VERSION},
                          {"device", device.str()},
                          {"threads", threads_in_use()},
                          {"mode", o.mode == "compile" ? std::string("compile") : eager_mode_name(eager_mode())},
                          {"eager_mode", eager_mode_name(eager_mode())},
                          {"compile", o.mode == "compile" ? o.compile : "none"},
                          {"prepack", o.mode == "compile" ? o.prepack : "none"},
                          {"dtype", dtype_report(pipe)},
                          {"quantization", quantization_report(pipe_options)}};
    nlohmann::json events = nlohmann::json::array();
    for (const OffloadEvent& e : pipe.offload_events())
      events.push_back({{"component", e.component},
                        {"action", e.action},
                        {"bytes", e.bytes},
                        {"seconds", e.seconds},
                        {"device_in_use_bytes", e.device_in_use}});
    nlohmann::json offload{{"placement", o.offload == "model"                                       ? "model offload"
                                         : o.offload == "none" || !runtime(device).is_host() ? "device"
                                                                                              : "host"},
                           {"device_capacity_bytes", o.device_memory},
                           {"events", events}};
    nlohmann::json per_rank = nlohmann::json::array();
    for (size_t r = 0; r < ranks.size(); ++r)
      per_rank.push_back({{"rank", r},
                          {"bytes_read", ranks[r].bytes_read},
                          {"device_peak_bytes", ranks[r].device_peak},
                          {"host_peak_rss_bytes", ranks[r].host_rss}});
    nlohmann::json tp{{"world_size", world->size()}, {"ranks", per_rank}};
    write_report(o.report, std::move(inputs), std::move(timings),
                 {{"engine", std::move(engine)},
                  {"memory", {{"weights_bytes", weight_bytes_report(pipe)}, {"estimate", estimate_report(pipe, o.call, result)}}},
                  {"compiled", compile_report()},
                  {"offload", std::move(offload)},
                  {"tensor_parallel", std::move(tp)},
                  {"profile", o.profile ? profile_report() : nlohmann::json()}},
                 device);
  }
  return 0;
}

}  // namespace

int generate(const std::vector<std::string>& args) {
  // Under mpirun every rank must hold rank 0's command line, before anything else
  // (distributed/same_arguments.h); a no-op for one process.
  check_same_arguments(*ProcessGroup::world(), "generate", args, {"--device-memory"});
  Options o = parse(args);
  // The output rule (io/output_file.h, docs/outputs.md), before any work: rank 0 writes.
  if (ProcessGroup::world()->rank() == 0) {
    io::resolve_output("--out", o.out);
    if (o.report_given) {
      io::resolve_output("--report", o.report);
      KILN_CHECK(!io::same_output_file(o.out, o.report), "output", "--out ", o.out.string(), " and --report ",
                 o.report.string(), " name the same file; expected two different files");
    }
  }
  if (!o.latents_file.empty()) o.call.latents = load_latents(o.latents_file);
  // --mode overrides KILN_DEFER_AND_FUSE; without it the environment's default stands.
  if (o.mode_given) set_default_eager_mode(o.mode == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
  reset_counters();
  reset_deferred_stats();
  reset_compile_stats();
  io::reset_bytes_read();
  const Device device = Device::parse(o.device);
  if (o.tp > 1 && runtime(device).runs_ranks_in_process()) {
    // A device whose ranks are threads (PJRT): rank r on the r-th device from --device.
    run_local_ranks(int(o.tp), [&](int rank) {
      Options mine = o;
      mine.device = Device{device.type, device.index + rank}.str();
      generate_rank(std::move(mine));
    });
    return 0;
  }
  return generate_rank(std::move(o));
}

}  // namespace kiln::cli
