// `kiln serve`: loads a pipeline once (and compiles it, with --mode compile) and answers
// image-generation requests over HTTP (docs/server.md): the OpenAI images API, jobs with
// progress events and cancellation, health and Prometheus metrics. The jobs run one at a time
// on one worker thread (server/job_queue.h); the HTTP side is serve_http.cc. Under --tp N
// (mpirun -np N) rank 0 serves and every rank runs each call on its shard (server/rank_calls.h).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <optional>

#include "commands.h"
#include "io/kiln_files.h"
#include "help.h"
#include "core/error.h"
#include "core/terminal.h"
#include "devices/runtime.h"
#include "distributed/same_arguments.h"
#include "distributed/tensor_parallel.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "io/png.h"
#include "pipelines/diffusion_pipeline.h"
#include "pipelines/pipeline_checks.h"
#include "serve_http.h"
#include "server/rank_calls.h"
#include "server/redact_paths.h"

namespace kiln::cli {

namespace {

struct ServeFlags {
  std::filesystem::path model;
  bool bundled = false;
  ServeSettings http;
  std::string mode = "eager", compile = "full", offload;
  bool compile_given = false;
  size_t device_memory = 0;
  PipelineOptions pipeline;  // --dtype, --quantize, component files, --strict, --text-encoder-out-layers
  std::vector<ImageSize> warmup;
  bool cancel_on_stop = false;
  int64_t tp = 0;  // --tp N: the transformer sharded over N processes (mpirun -np N)
};

// An integer flag within [lo, hi], checked before it is narrowed (a port of 4294975157 must not
// wrap to 7861).
int64_t parse_int_in(const std::string& flag, const std::string& text, int64_t lo, int64_t hi, const char* unit) {
  const int64_t v = parse_int(flag, text);
  KILN_CHECK(v >= lo && v <= hi, "cli", flag, " must be in [", lo, ", ", hi, "]", *unit ? " " : "", unit, ", got ", text);
  return v;
}

// --allowed-hosts a.example,b.example: host names (no scheme, port or path).
std::vector<std::string> parse_host_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> hosts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string host = text.substr(start, comma - start);
    KILN_CHECK(!host.empty() && host.find_first_of("/@ \t") == std::string::npos &&
                   host.find("://") == std::string::npos,
               "cli", flag, " ", text, ": expected host names separated by commas (e.g. kiln.lan,192.168.1.5)");
    hosts.push_back(host);
    start = comma + 1;
  }
  return hosts;
}

ServeFlags parse(const std::vector<std::string>& args) {
  ServeFlags f;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&]() -> std::string {
      KILN_CHECK(i + 1 < args.size(), "cli", "flag ", flag, " needs a value");
      return args[++i];
    };
    if (flag == "--model") f.model = parse_model(value());
    else if (flag == "--host") f.http.host = value();
    else if (flag == "--port") f.http.port = int(parse_int_in(flag, value(), 0, 65535, "(0: any free port)"));
    else if (flag == "--api-key") f.http.api_key = value();
    else if (flag == "--max-queue") f.http.max_queue = size_t(parse_int(flag, value()));
    else if (flag == "--keep-jobs") f.http.keep_jobs = size_t(parse_int(flag, value()));
    else if (flag == "--max-n") f.http.limits.max_n = parse_int(flag, value());
    else if (flag == "--max-steps")
      f.http.limits.max_steps = parse_int_in(flag, value(), 1, pipeline_checks::kMaxSteps, "");
    else if (flag == "--max-size") f.http.limits.max_side = parse_int(flag, value());
    else if (flag == "--max-prompt-bytes") f.http.limits.max_prompt_chars = size_t(parse_int(flag, value()));
    else if (flag == "--max-body") f.http.http.max_body_bytes = parse_bytes(flag, value());
    else if (flag == "--timeout")
      f.http.http.request_timeout = std::chrono::seconds(parse_int_in(flag, value(), 1, 86400, "seconds"));
    else if (flag == "--max-connections")
      f.http.http.max_connections = size_t(parse_int_in(flag, value(), 1, 1000000, ""));
    else if (flag == "--max-client-connections")
      f.http.http.max_client_connections = size_t(parse_int_in(flag, value(), 1, 1000000, "(per client address)"));
    else if (flag == "--allowed-hosts") f.http.allowed_hosts = parse_host_list(flag, value());
    else if (flag == "--on-stop") {
      const std::string v = value();
      KILN_CHECK(v == "finish" || v == "cancel", "cli", "--on-stop ", v,
                 ": expected finish (the running job ends before the server exits) or cancel (it stops at its next "
                 "step)");
      f.cancel_on_stop = v == "cancel";
    } else if (flag == "--warmup") f.warmup = parse_sizes(flag, value());
    else if (flag == "--mode") f.mode = value();
    else if (flag == "--compile") f.compile = value(), f.compile_given = true;
    else if (flag == "--offload") f.offload = value();
    else if (flag == "--device-memory") f.device_memory = parse_bytes(flag, value());
    else if (flag == "--strict") f.pipeline.strict = true;
    else if (flag == "--dtype") parse_dtype(value(), f.pipeline);
    else if (flag == "--quantize") parse_quantize(value(), f.pipeline);
    else if (flag == "--threads") parse_threads(value());
    else if (flag == "--tp") {
      f.tp = parse_int(flag, value());
      KILN_CHECK(f.tp >= 1, "cli", "--tp must be at least 1, got ", f.tp);
    }
    else if (flag == "--text-encoder-out-layers") f.pipeline.text_encoder_out_layers = parse_int_list(flag, value());
    else if (const std::string c = component_file_flag(flag); !c.empty()) f.pipeline.component_files[c] = value();
    else unknown_flag("serve", flag);
  }
  KILN_CHECK(f.http.max_queue >= 1 && f.http.max_queue <= 100000, "cli", "--max-queue must be in [1, 100000], got ",
             f.http.max_queue);
  KILN_CHECK(f.http.keep_jobs >= 1 && f.http.keep_jobs <= 100000, "cli", "--keep-jobs must be in [1, 100000], got ",
             f.http.keep_jobs);
  KILN_CHECK(f.http.limits.max_n >= 1 && f.http.limits.max_n <= 64, "cli", "--max-n must be in [1, 64], got ",
             f.http.limits.max_n);
  KILN_CHECK(f.http.limits.max_side >= 16, "cli", "--max-size must be at least 16, got ", f.http.limits.max_side);
  KILN_CHECK(f.http.http.max_body_bytes >= 1024 && f.http.http.max_body_bytes <= (size_t(1) << 30), "cli",
             "--max-body must be in [1KiB, 1GiB], got ", f.http.http.max_body_bytes, " bytes");
  KILN_CHECK(f.mode == "eager" || f.mode == "defer" || f.mode == "compile", "cli", "--mode ", f.mode,
             ": expected eager, defer or compile");
  check_compile_flag(f.compile);
  KILN_CHECK(!f.compile_given || f.mode == "compile", "cli", "--compile ", f.compile, " needs --mode compile");
  KILN_CHECK(f.offload.empty() || f.offload == "none" || f.offload == "model", "cli", "--offload ", f.offload,
             ": expected none or model");
  check_tensor_parallel_launch("serve", f.tp, f.offload);
  // A server others can reach answers only those who hold the key.
  KILN_CHECK(is_loopback_host(f.http.host) || !f.http.api_key.empty(), "cli", "--host ", f.http.host,
             " is reachable from other machines: it needs --api-key KEY (clients send Authorization: Bearer KEY)");
  if (f.model.empty()) {
    f.model = io::bundled_model_dir();
    f.bundled = true;
  }
  return f;
}

}  // namespace

int serve(const std::vector<std::string>& args) {
  // SIGTERM, SIGINT and SIGUSR1 (which mpirun forwards to every rank; its own SIGTERM kills
  // them) are taken by one thread of rank 0 (serve_http.cc), so every thread started from here
  // on (MPI's among them) leaves them blocked; the other ranks stop when rank 0 tells them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (const int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaddset(&stop_signals, sig);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // Under mpirun every rank must have been started with the same arguments (a rank with another
  // model or port would fail in the first collective with MPI's own message).
  check_same_arguments(*ProcessGroup::world(), "serve", args, {"--device-memory"});
  ServeFlags f = parse(args);
  const std::shared_ptr<ProcessGroup> world = ProcessGroup::world();
  const bool leader = world->rank() == 0;  // under --tp only rank 0 listens and prints

  set_default_eager_mode(f.mode == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
  if (f.device_memory) runtime(Device::cpu()).set_memory_capacity(f.device_memory);
  const std::function<void(const std::string&)> warn = [leader](const std::string& w) {
    if (leader) print_line(stderr, "kiln: warning: %s", w.c_str());
  };
  PipelineOptions options = f.pipeline;  // FLUX.2 loads only the text encoder layers its out-layers need
  options.on_warning = warn;
  // The components' loads, as generate prints them; not every job's phases (one line per job).
  if (leader)
    options.on_progress = [](const PipelineProgress& p) {
      if (p.phase == "load" && p.seconds >= 0) print_progress(p);
    };
  if (f.tp > 1) options.tensor_parallel = TensorParallelConfig{DeviceMesh(world)};
  if (leader) print_line(stderr, "kiln: loading %s", f.model.c_str());
  const std::unique_ptr<DiffusionPipeline> pipe = DiffusionPipeline::from_pretrained(f.model, options);
  if (leader) std::fprintf(stderr, "kiln: loaded in %.2f s\n", pipe->load_seconds());
  if (f.offload == "none") pipe->to(Device::cpu());
  if (f.offload == "model") pipe->enable_model_cpu_offload(Device::cpu());
  if (f.mode == "compile") compile_transformer(*pipe, f.compile);
  synchronize(Device::cpu());  // no model work in flight when the ranks set up their channel

  std::optional<server::RankCalls> ranks;
  if (world->size() > 1) ranks.emplace(*pipe, world);
  if (!leader) {
    ranks->follow();
    return 0;
  }
  DiffusionPipeline& p = *pipe;
  const auto run_call = [&p, &ranks](const PipelineCallArgs& call) { return ranks ? ranks->run(call) : p(call); };

  // What a request leaves out: the pipeline's defaults, or the bundled checkpoint's call.
  PipelineCallArgs defaults;
  defaults.text_encoder_out_layers = f.pipeline.text_encoder_out_layers;
  if (p.step_distilled()) defaults.num_inference_steps = DiffusionPipeline::kDistilledSteps;
  if (f.bundled) {
    defaults.height = defaults.width = kBundledSize;
    defaults.num_inference_steps = kBundledSteps;
    defaults.max_sequence_length = kBundledMaxSequenceLength;
  }
  const std::string model = model_name(f.model, f.bundled);
  const server::ImageRunner runner = [&run_call, &warn, model, folder = f.model, &p, &options](
                                         const PipelineCallArgs& job_call,
                                         const std::function<void(int64_t, int64_t, double)>& on_step) {
    PipelineCallArgs call = job_call;
    call.on_step = on_step;
    call.on_warning = warn;
    try {
      const PipelineOutput result = run_call(call);
      return io::encode_png(result.image.data(), result.height, result.width,
                            image_metadata(call, std::to_string(call.seed), result, model, p.class_name(), options));
    } catch (const std::exception& e) {
      // A job's error travels to clients: the model's folder is named by the model's name, and
      // no other path of this machine is shown whole.
      throw std::runtime_error(server::redact_paths(e.what(), folder, model));
    }
  };
  // Warm-up: one step at each size, so compiled executables exist before the first request.
  for (const ImageSize& s : f.warmup) {
    PipelineCallArgs call = defaults;
    call.on_warning = warn;
    call.prompt = "warm-up";
    call.height = s.height;
    call.width = s.width;
    call.num_inference_steps = 1;
    std::fprintf(stderr, "kiln: warming up at %lldx%lld\n", static_cast<long long>(s.height),
                 static_cast<long long>(s.width));
    run_call(call);
  }
  synchronize(Device::cpu());  // the warm-up's work (and compiles) done before the first request
  f.http.model_id = model;
  f.http.pipeline_class = pipe->class_name();
  f.http.defaults = defaults;
  f.http.cancel_on_stop = f.cancel_on_stop;
  f.http.ranks = world->size();
  const int code = serve_http(f.http, runner, stop_signals);
  if (ranks) ranks->stop();
  return code;
}

}  // namespace kiln::cli
