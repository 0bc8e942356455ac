// `kiln plan`: the memory a pipeline call needs on a device, without running it (and without
// reading a single weight: the pipeline is loaded for its shapes, nn/shapes_only_load.h). For the
// local devices the plan is the fail-fast estimate every call makes (weights exactly, activations
// as traced op by op). For `--device tpu --topology T` every component's traced graph is compiled
// ahead of time with libtpu for that topology (devices/aot_target.h), one replica per
// tensor-parallel rank, and XLA's own account of device memory (arguments, outputs, temporaries,
// code) is the figure. `--like NAME` plans a configuration make-random knows from a layout-only
// folder written to a temporary directory (no values, no disk space).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "help.h"
#include "core/error.h"
#include "core/terminal.h"
#include "devices/aot_target.h"
#include "devices/runtime.h"
#include "distributed/process_group.h"
#include "distributed/tensor_parallel.h"
#include "exec/capture_observer.h"
#include "graph/graph.h"
#include "io/mapped_file.h"
#include "io/output_file.h"
#include "nn/shapes_only_load.h"
#include "pipelines/diffusion_pipeline.h"
#include "random_like.h"
#include "random_checkpoint/like_recipe.h"

namespace kiln::cli {

namespace {

namespace fs = std::filesystem;

struct PlanFlags {
  std::optional<std::string> model, like;
  std::optional<int64_t> height, width, max_sequence_length;
  std::string dtype = "bf16";
  std::optional<std::string> quantize;
  std::string offload = "none";
  int64_t tp = 1;
  Device device = Device::cpu();
  std::optional<std::string> topology;
  fs::path report;
  bool report_given = false;
  std::optional<fs::path> dump;  // --dump DIR: the lowered programs, one .mlir per component
  size_t device_memory = 0;      // --device-memory: a local device's capacity to plan against
};

PlanFlags parse_flags(const std::vector<std::string>& args) {
  PlanFlags f;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&]() -> const std::string& {
      KILN_CHECK(i + 1 < args.size(), "cli", "flag ", flag, " needs a value");
      return args[++i];
    };
    if (flag == "--model") f.model = parse_model(value());
    else if (flag == "--like") f.like = value();
    else if (flag == "--height") f.height = parse_int(flag, value());
    else if (flag == "--width") f.width = parse_int(flag, value());
    else if (flag == "--max-sequence-length") f.max_sequence_length = parse_int(flag, value());
    else if (flag == "--dtype") f.dtype = value();
    else if (flag == "--quantize") f.quantize = value();
    else if (flag == "--offload") f.offload = value();
    else if (flag == "--tp") f.tp = parse_int(flag, value());
    else if (flag == "--device") f.device = Device::parse(value());
    else if (flag == "--topology") f.topology = value();
    else if (flag == "--report") f.report = value(), f.report_given = true;
    else if (flag == "--dump") f.dump = fs::path(value());
    else if (flag == "--device-memory") f.device_memory = parse_bytes(flag, value());
    else unknown_flag("plan", flag);
  }
  KILN_CHECK(f.model.has_value() != f.like.has_value(), "cli",
             "plan needs one of --model DIR (a Diffusers folder) or --like NAME (", random_weights::like_names_joined(", "),
             ": no weights needed)");
  KILN_CHECK(!f.like || random_weights::is_like_name(*f.like), "cli", "--like ", *f.like, ": expected ",
             random_weights::like_names_by_family());
  KILN_CHECK(f.offload == "none" || f.offload == "model", "cli", "--offload ", f.offload,
             ": expected none (every component's weights on the device) or model (model CPU offload)");
  KILN_CHECK(f.tp >= 1 && f.tp <= 64, "cli", "--tp ", f.tp, ": expected the tensor-parallel degree, 1 to 64");
  KILN_CHECK(f.tp == 1 || f.offload == "none", "cli", "--tp ", f.tp,
             " with --offload model: tensor parallelism keeps each rank's slices on its device (no offload)");
  const bool tpu = f.device.type == DeviceType::tpu;
  KILN_CHECK(!tpu || f.topology, "cli",
             "--device tpu needs --topology GENERATION:SHAPE, the chips to plan for (e.g. v6e:1x1, v6e:2x2, v5e:2x4)");
  KILN_CHECK(tpu || !f.topology, "cli", "--topology is for --device tpu (the TPU chips to compile for)");
  KILN_CHECK(!tpu || f.device_memory == 0, "cli",
             "--device-memory is for local devices; a TPU topology's memory is its chips' (--topology)");
  KILN_CHECK(tpu || !f.dump, "cli", "--dump writes the programs of --device tpu's compiles");
  KILN_CHECK(!tpu || !f.quantize, "cli", "--quantize ", f.quantize.value_or(""),
             " with --device tpu: quantized weights do not lower to StableHLO yet; plan the TPU in bf16 or f32 "
             "(--dtype), or --quantize for a local device");
  KILN_CHECK(!f.height || *f.height >= 16, "cli", "--height ", f.height.value_or(0), ": expected at least 16");
  KILN_CHECK(!f.width || *f.width >= 16, "cli", "--width ", f.width.value_or(0), ": expected at least 16");
  if (f.report_given) f.report = io::resolve_output("--report", f.report);
  return f;
}

// A temporary folder removed with everything in it when the plan ends.
struct TempFolder {
  fs::path path;
  TempFolder() {
    static std::atomic<int> n{0};
    path = fs::temp_directory_path() / ("kiln-plan." + std::to_string(::getpid()) + "." + std::to_string(n++));
  }
  ~TempFolder() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

DType folder_dtype(const std::string& dtype) {
  if (dtype == "f32") return DType::f32;
  if (dtype == "f16") return DType::f16;
  return DType::bf16;  // "auto", "bf16" and per-component lists: the checkpoints' own dtype
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(int64_t(1) << 30));
  return buf;
}

// How many of each collective a graph holds.
std::map<std::string, int> collectives(const Graph& g) {
  std::map<std::string, int> n;
  for (const GraphNode& node : g.nodes)
    if (node.op == "all_reduce" || node.op == "all_gather") ++n[node.op];
  return n;
}

struct ComponentPlan {
  std::string name;
  int64_t weights = 0, activations = 0;  // per device; activations: the local trace's peak
  std::optional<AotMemory> program;      // the TPU compile
  int replicas = 1;
  std::map<std::string, int> collectives;
  // Device bytes while this component runs, its own weights included. A program the compiler
  // refused as too large for one device counts as the local estimate (and fits nowhere).
  int64_t running() const { return program && !too_large() ? program->total() : weights + activations; }
  bool too_large() const { return program && !program->does_not_fit.empty(); }
};

struct Placement {
  int64_t required = 0;
  bool fits = false;
};

}  // namespace

int plan(const std::vector<std::string>& args) {
  const PlanFlags f = parse_flags(args);
  const bool tpu = f.device.type == DeviceType::tpu;
  // The topology first: a bad one is refused before minutes of loading and tracing.
  std::unique_ptr<AotTarget> target;
  if (tpu) {
    target = AotTarget::open(f.device.type, *f.topology);
    KILN_CHECK(f.tp <= target->devices(), "cli", "--tp ", f.tp, " needs ", f.tp, " devices but topology ",
               *f.topology, " has ", target->devices(), " (", target->describe(),
               "); name a larger topology, e.g. v6e:2x2 (4 chips) or v6e:2x4 (8)");
  }

  const nn::ShapesOnlyLoad shapes_only;  // nothing below reads a weight's values
  std::optional<TempFolder> layout;
  fs::path dir;
  if (f.like) {
    layout.emplace();
    RandomLike spec;
    spec.dir = layout->path;
    spec.like = *f.like;
    spec.dtype = folder_dtype(f.dtype);
    spec.layout_only = true;
    std::string what, note;
    write_random_like(spec, {}, &what, &note);
    dir = layout->path;
  } else {
    dir = *f.model;
  }

  PipelineOptions options;
  options.device = Device::cpu();  // loaded on the host for its shapes: the plan runs nothing
  parse_dtype(f.dtype, options);
  if (f.quantize) parse_quantize(*f.quantize, options);
  if (f.tp > 1) options.tensor_parallel = TensorParallelConfig{DeviceMesh(ProcessGroup::detached(0, int(f.tp)))};
  const std::unique_ptr<DiffusionPipeline> pipe = DiffusionPipeline::from_pretrained(dir, options);

  PipelineCallArgs call;
  call.prompt = "";
  call.max_sequence_length = f.max_sequence_length;
  // The size the call would run at: given, else the pipeline's default, rounded down as it rounds.
  const int64_t side = pipe->default_sample_size() * pipe->vae_scale_factor(), multiple = pipe->size_multiple();
  const int64_t height = f.height.value_or(side) / multiple * multiple, width = f.width.value_or(side) / multiple * multiple;
  KILN_CHECK(height >= multiple && width >= multiple, "cli", "--height and --width must be at least ", multiple);
  call.height = height;
  call.width = width;

  // The estimate traces each component once, in model_cpu_offload_seq order; the TPU plan keeps
  // those graphs to compile them. The VAE decodes untiled (what one program compiles).
  std::vector<Graph> traced;
  MemoryEstimate e;
  {
    const CaptureObserver keep([&](const std::string&, const detail::Captured& c) {
      if (tpu) traced.push_back(c.graph);
    });
    e = pipe->estimate_memory(call, 0);
  }
  KILN_CHECK(!tpu || traced.size() == e.components.size(), "plan", "expected one traced graph per component (",
             e.components.size(), "), got ", traced.size());

  std::vector<ComponentPlan> components;
  double compile_seconds = 0;
  int compiled = 0, from_cache = 0;
  for (size_t i = 0; i < e.components.size(); ++i) {
    ComponentPlan c;
    c.name = e.components[i].name;
    c.weights = int64_t(e.components[i].weight_bytes);
    c.activations = int64_t(e.components[i].activation_bytes);
    if (tpu) {
      const Graph& g = traced[i];
      c.collectives = collectives(g);
      c.replicas = c.collectives.empty() ? 1 : int(f.tp);
      if (f.dump) {
        fs::create_directories(*f.dump);
        const std::string text = target->program_text(g, c.replicas);
        io::write_output_atomically("plan", *f.dump / (c.name + ".mlir"),
                                    [&](std::FILE* out) { std::fwrite(text.data(), 1, text.size(), out); });
      }
      print_line(stderr, "kiln: compiling %s for %s (%d replica%s) ...", c.name.c_str(), f.topology->c_str(),
                 c.replicas, c.replicas == 1 ? "" : "s");
      c.program = target->compile(c.name, g, c.replicas);
      compile_seconds += c.program->compile_seconds;
      ++(c.program->from_cache ? from_cache : compiled);
    }
    components.push_back(c);
  }

  const int64_t carried = int64_t(e.carried_bytes);
  int64_t all_weights = 0;
  for (const ComponentPlan& c : components) all_weights += c.weights;
  Placement on_device, offloaded;
  for (const ComponentPlan& c : components) {
    on_device.required = std::max(on_device.required, all_weights - c.weights + c.running() + carried);
    offloaded.required = std::max(offloaded.required, c.running() + carried);
  }
  int64_t capacity = tpu ? target->memory_per_device()
                         : int64_t(f.device_memory ? f.device_memory : runtime(f.device).memory().capacity_bytes);
  if (!tpu && capacity == 0) capacity = int64_t(runtime(f.device).physical_total_bytes());
  bool any_too_large = false;
  for (const ComponentPlan& c : components) any_too_large = any_too_large || c.too_large();
  on_device.fits = !any_too_large && (capacity == 0 || on_device.required <= capacity);
  offloaded.fits = !any_too_large && (capacity == 0 || offloaded.required <= capacity);
  const Placement& chosen = f.offload == "model" ? offloaded : on_device;

  // ---- the table ----
  const std::string where = tpu ? target->describe() : f.device.str();
  std::printf("kiln plan: %s%s%s, %lldx%lld, dtype %s, tp %lld, offload %s, on %s\n", pipe->class_name(),
              f.like ? " like " : "", f.like ? f.like->c_str() : "", static_cast<long long>(height),
              static_cast<long long>(width), f.dtype.c_str(), static_cast<long long>(f.tp), f.offload.c_str(),
              where.c_str());
  if (tpu)
    std::printf("  %-16s %12s %12s %12s %12s %12s %10s %9s  %s\n", "component", "weights", "arguments", "outputs",
                "temporaries", "code", "total", "compile", "collectives");
  else
    std::printf("  %-16s %12s %12s %12s\n", "component", "weights", "activations", "total");
  for (const ComponentPlan& c : components) {
    if (tpu) {
      std::string coll;
      for (const auto& [op, n] : c.collectives) coll += (coll.empty() ? "" : ", ") + std::to_string(n) + " " + op;
      const AotMemory& m = *c.program;
      if (c.too_large()) {
        std::printf("  %-16s %12s  does not fit one device: XLA: %s\n", c.name.c_str(), gib(c.weights).c_str(),
                    m.does_not_fit.c_str());
        continue;
      }
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, m.from_cache ? "cached" : "%.1fs", m.compile_seconds);
      std::printf("  %-16s %12s %12s %12s %12s %12s %10s %9s  %s\n", c.name.c_str(), gib(c.weights).c_str(),
                  gib(m.arguments).c_str(), gib(m.outputs - m.aliased).c_str(), gib(m.temporaries).c_str(),
                  gib(m.code).c_str(), gib(m.total()).c_str(), seconds, coll.empty() ? "-" : coll.c_str());
    } else {
      std::printf("  %-16s %12s %12s %12s\n", c.name.c_str(), gib(c.weights).c_str(), gib(c.activations).c_str(),
                  gib(c.running()).c_str());
    }
  }
  const std::string cap = capacity ? gib(capacity) : std::string("no limit");
  std::printf("  carried between components: %s\n", gib(carried).c_str());
  std::printf("  every component on the device: %s per device of %s: %s\n", gib(on_device.required).c_str(),
              cap.c_str(), on_device.fits ? "fits" : "does not fit");
  std::printf("  model offload (--offload model): %s per device of %s: %s\n", gib(offloaded.required).c_str(),
              cap.c_str(), offloaded.fits ? "fits" : "does not fit");
  std::fflush(stdout);

  if (f.report_given) {
    nlohmann::json comps = nlohmann::json::array();
    for (const ComponentPlan& c : components) {
      nlohmann::json j = {{"name", c.name}, {"weights_bytes", c.weights}, {"activation_bytes", c.activations},
                          {"running_bytes", c.running()}};
      if (c.program) {
        const AotMemory& m = *c.program;
        j["program"] = {{"replicas", c.replicas},         {"argument_bytes", m.arguments}, {"output_bytes", m.outputs},
                        {"alias_bytes", m.aliased},       {"temp_bytes", m.temporaries},  {"code_bytes", m.code},
                        {"total_bytes", m.total()},       {"compile_seconds", m.compile_seconds},
                        {"from_cache", m.from_cache},
                        {"does_not_fit", c.too_large() ? nlohmann::json(m.does_not_fit) : nlohmann::json(nullptr)},
                        {"collectives", c.collectives}};
      }
      comps.push_back(j);
    }
    const nlohmann::json report = {
        {"pipeline", pipe->class_name()},
        {"model", f.like ? nlohmann::json(nullptr) : nlohmann::json(model_name(*f.model, false))},
        {"like", f.like ? nlohmann::json(*f.like) : nlohmann::json(nullptr)},
        {"height", height},
        {"width", width},
        {"dtype", f.dtype},
        {"tp", f.tp},
        {"offload", f.offload},
        {"device", f.device.str()},
        {"topology", f.topology ? nlohmann::json(*f.topology) : nlohmann::json(nullptr)},
        {"target", where},
        {"capacity_bytes", capacity},
        {"components", comps},
        {"carried_bytes", carried},
        {"placements",
         {{"none", {{"required_bytes", on_device.required}, {"fits", on_device.fits}}},
          {"model", {{"required_bytes", offloaded.required}, {"fits", offloaded.fits}}}}},
        {"required_bytes", chosen.required},
        {"fits", chosen.fits},
        {"compile_seconds", compile_seconds},
        {"programs_compiled", compiled},
        {"programs_from_cache", from_cache},
        {"checkpoint_bytes_read", io::bytes_read()}};
    const std::string text = report.dump(2) + "\n";
    io::write_output_atomically("plan", f.report, [&](std::FILE* out) { std::fwrite(text.data(), 1, text.size(), out); });
  }

  if (!chosen.fits) {
    std::string fix;
    if (f.tp == 1 && f.offload == "none" && offloaded.fits && !any_too_large) {
      fix = "--offload model fits (" + gib(offloaded.required) + ")";
    } else {
      // More ranks divide the weights, which dominate (the replicated parts and the activations
      // are taken as they are: an estimate, which a plan at that degree then states exactly).
      int64_t n = f.tp * 2;
      const auto at = [&](int64_t ranks) { return all_weights * f.tp / ranks + (chosen.required - all_weights); };
      while (n < 64 && at(n) > capacity) n *= 2;
      fix = "about --tp " + std::to_string(n) + " (" + gib(at(n)) + " per device with the weights split " +
            std::to_string(n) + " ways); plan it with --tp " + std::to_string(n) +
            (tpu ? " and a topology of at least " + std::to_string(n) + " chips" : std::string()) +
            (tpu ? "" : ", or --quantize");
    }
    fail("plan", pipe->class_name(), " at ", height, "x", width, " with offload ", f.offload, ", tp ", f.tp, " needs ",
         gib(chosen.required), " per device but ", where, " has ", cap, ": ", fix);
  }
  return 0;
}

}  // namespace kiln::cli
