// `kiln warmup`: fills the compile caches ahead of time, so a server (or the
// next `kiln generate --mode compile`) never compiles on a request: traces and compiles the
// transformer executables for each listed size without running the model, and stores them in
// the persistent cache (KILN_CACHE_DIR).
#include <chrono>
#include <optional>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "io/kiln_files.h"
#include "help.h"
#include "core/error.h"
#include "core/terminal.h"
#include "exec/compile.h"
#include "exec/executable_store.h"
#include "io/output_file.h"
#include "pipelines/diffusion_pipeline.h"
#include "pipelines/pipeline_checks.h"
#include "report.h"

namespace kiln::cli {

// "512x512,1024x768" (HEIGHTxWIDTH) -> sizes.
std::vector<ImageSize> parse_sizes(const std::string& flag, const std::string& v) {
  std::vector<ImageSize> out;
  size_t at = 0;
  while (at <= v.size()) {
    const size_t comma = std::min(v.find(',', at), v.size());
    const std::string item = v.substr(at, comma - at);
    const size_t x = item.find('x');
    ImageSize s;
    try {
      size_t used_h = 0, used_w = 0;
      KILN_CHECK(x != std::string::npos, "cli", "");
      s.height = std::stoll(item.substr(0, x), &used_h);
      s.width = std::stoll(item.substr(x + 1), &used_w);
      KILN_CHECK(used_h == x && used_w == item.size() - x - 1, "cli", "");
    } catch (const std::exception&) {
      fail("cli", flag, " expects HEIGHTxWIDTH[,HEIGHTxWIDTH...], got '", item, "' in '", v, "'");
    }
    KILN_CHECK(s.height >= 16 && s.width >= 16, "cli", flag, ": ", item, " is smaller than 16x16");
    KILN_CHECK(s.height <= pipeline_checks::kMaxSide && s.width <= pipeline_checks::kMaxSide, "cli", flag, ": ", item,
               " has a side above ", pipeline_checks::kMaxSide, "; expected sides from 16 to ", pipeline_checks::kMaxSide);
    // Each size is a compile of its own: a list this long is a mistake, refused before any.
    KILN_CHECK(int64_t(out.size()) < pipeline_checks::kMaxWarmupSizes, "cli", flag, " lists more than ",
               pipeline_checks::kMaxWarmupSizes, " sizes; expected at most ", pipeline_checks::kMaxWarmupSizes);
    out.push_back(s);
    at = comma + 1;
  }
  return out;
}

int warmup(const std::vector<std::string>& args) {
  std::filesystem::path model, report;
  bool report_given = false;
  std::string sizes_text, compile = "full", dtype = "auto";
  int64_t max_sequence_length = 0;  // 0: the pipeline's default (FLUX 512, SD3 256)
  bool length_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&]() -> std::string {
      KILN_CHECK(i + 1 < args.size(), "cli", "flag ", flag, " needs a value");
      return args[++i];
    };
    if (flag == "--model") model = parse_model(value());
    else if (flag == "--sizes") sizes_text = value();
    else if (flag == "--compile") compile = value();
    else if (flag == "--max-sequence-length") max_sequence_length = parse_int(flag, value()), length_given = true;
    else if (flag == "--report") report = value(), report_given = true;
    else if (flag == "--dtype") dtype = value();
    else unknown_flag("warmup", flag);
  }
  KILN_CHECK(!sizes_text.empty(), "cli", "warmup needs --sizes HEIGHTxWIDTH[,...] (e.g. --sizes 512x512,1024x1024)");
  const std::vector<ImageSize> sizes = parse_sizes("--sizes", sizes_text);
  check_compile_flag(compile);
  PipelineOptions pipe_options;
  parse_dtype(dtype, pipe_options);
  KILN_CHECK(!length_given || (max_sequence_length >= 1 && max_sequence_length <= 512), "cli",
             "--max-sequence-length must be in [1, 512], got ", max_sequence_length);
  if (model.empty()) {
    model = io::bundled_model_dir();
    if (!length_given) max_sequence_length = kBundledMaxSequenceLength;  // as generate's bundled run
  }
  if (report_given) io::resolve_output("--report", report);  // the output rule, before any work
  const std::filesystem::path dir = executable_cache_dir();
  if (dir.empty())
    std::fprintf(stderr, "kiln: warning: the persistent compile cache is off (KILN_CACHE_DIR=none); warmup only "
                         "fills this process's cache\n");

  reset_compile_stats();
  const std::unique_ptr<DiffusionPipeline> pipe = DiffusionPipeline::from_pretrained(model, pipe_options);
  compile_transformer(*pipe, compile);
  for (const ImageSize& s : sizes) {
    const CompileStats before = compile_stats();
    const auto t0 = std::chrono::steady_clock::now();
    pipe->warmup(s.height, s.width,
                 max_sequence_length ? std::optional<int64_t>(max_sequence_length) : std::nullopt);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const CompileStats after = compile_stats();
    std::fprintf(stderr, "kiln: warmup %lldx%lld (%s): %llu compiled, %llu loaded from the cache, %llu shared, %.3f s\n",
                 static_cast<long long>(s.height), static_cast<long long>(s.width), compile.c_str(),
                 static_cast<unsigned long long>(after.compiles - before.compiles),
                 static_cast<unsigned long long>(after.disk_hits - before.disk_hits),
                 static_cast<unsigned long long>(after.shared_hits - before.shared_hits), seconds);
  }
  print_line(stderr, "kiln: compile cache: %s", dir.empty() ? "(off)" : dir.c_str());
  if (!report.empty()) {
    nlohmann::json inputs{{"command", "warmup"}, {"model", model.string()}, {"sizes", sizes_text},
                          {"compile", compile}, {"max_sequence_length", max_sequence_length ? nlohmann::json(max_sequence_length) : nlohmann::json()}};
    write_report(report, std::move(inputs), nlohmann::json::object(), {{"compiled", compile_report()}});
  }
  return 0;
}

}  // namespace kiln::cli
