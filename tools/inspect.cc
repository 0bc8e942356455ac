// `kiln inspect`: load a Diffusers folder the way a pipeline will (model_index.json, each
// component's config.json and safetensors weights) and summarise it.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "io/kiln_files.h"
#include "help.h"
#include "report.h"
#include "core/error.h"
#include "core/terminal.h"
#include "devices/runtime.h"
#include "io/json_config.h"
#include "io/model_folder.h"
#include "pipelines/model_argument.h"
#include "io/output_file.h"
#include "io/safetensors.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

struct Options {
  fs::path model;
  fs::path report;
  bool report_given = false;
};

Options parse(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> std::string {
      KILN_CHECK(i + 1 < args.size(), "cli", "flag ", args[i], " needs a value");
      return args[++i];
    };
    if (args[i] == "--model") o.model = parse_model(value());
    else if (args[i] == "--report") o.report = value(), o.report_given = true;
    else unknown_flag("inspect", args[i]);
  }
  if (o.model.empty()) {
    o.model = io::bundled_model_dir();
    std::fprintf(stderr, "kiln: no --model given, using the bundled tiny FLUX.1 checkpoint (%s)\n", o.model.c_str());
  }
  return o;
}

// Components of a Diffusers folder: model_index.json entries whose value is [library, class]
// (every listed name checked first, as the pipeline does).
std::vector<std::pair<std::string, std::string>> components(const fs::path& dir) {
  const io::JsonConfig index(dir / "model_index.json");
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, value] : io::model_index_components(index, dir, "inspect")) {
    if (value.size() != 2 || !value[1].is_string()) continue;
    out.emplace_back(name, value[1].get<std::string>());
  }
  return out;
}

bool has_weights(const fs::path& dir) {
  if (!fs::is_directory(dir)) return false;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 12 && (n.ends_with(".safetensors") || n.ends_with(".safetensors.index.json"))) return true;
  }
  return false;
}

}  // namespace

int inspect(const std::vector<std::string>& args) {
  Options opt = parse(args);
  if (opt.report_given) io::resolve_output("--report", opt.report);  // the output rule, before any work
  opt.model = pipeline_folder(opt.model);  // a cache folder or repo id: its snapshot
  const auto t0 = std::chrono::steady_clock::now();
  io::reset_bytes_read();
  nlohmann::json report_components = nlohmann::json::array();
  // Names and classes come from model_index.json: escaped on their way out (core/terminal.h).
  print_line(stdout, "%s", opt.model.c_str());
  for (const auto& [name, cls] : components(opt.model)) {
    const fs::path dir = opt.model / name;
    KILN_CHECK(fs::is_directory(dir), "inspect", "component '", name, "' (", cls, ") is listed in ",
               opt.model / "model_index.json", " but its folder ", dir, " is missing");
    nlohmann::json entry{{"name", name}, {"class", cls}};
    if (!has_weights(dir)) {
      print_line(stdout, "  %-16s %-28s (no weights)", name.c_str(), cls.c_str());
      report_components.push_back(entry);
      continue;
    }
    const io::SafetensorsIndex weights(dir);
    int64_t params = 0;
    std::map<std::string, int64_t> bytes_by_dtype;
    for (const std::string& t : weights.names()) {
      const Tensor w = weights.load(t);  // zero-copy view of the mapped file
      params += w.numel();
      bytes_by_dtype[dtype_name(w.dtype())] += int64_t(w.nbytes());
    }
    std::string dtypes;
    for (const auto& [d, b] : bytes_by_dtype) dtypes += (dtypes.empty() ? "" : ", ") + d + " " + std::to_string(b) + " B";
    print_line(stdout, "  %-16s %-28s %5zu tensors %10lld params  (%s)", name.c_str(), cls.c_str(),
               weights.names().size(), static_cast<long long>(params), dtypes.c_str());
    entry["tensors"] = weights.names().size();
    entry["parameters"] = params;
    entry["bytes_by_dtype"] = bytes_by_dtype;
    report_components.push_back(entry);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const MemoryStats mem = runtime(Device::cpu()).memory();
  std::printf("loaded in %.3f s, %llu bytes read from checkpoint files, device peak %zu bytes\n", seconds,
              static_cast<unsigned long long>(io::bytes_read()), mem.peak_bytes);
  if (!opt.report.empty())
    write_report(opt.report, {{"command", "inspect"}, {"model", opt.model.string()}}, {{"load", seconds}, {"total", seconds}},
                 {{"components", report_components}});
  return 0;
}

}  // namespace kiln::cli
