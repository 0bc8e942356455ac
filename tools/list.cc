// kiln list: the pipelines a user already has in the Hugging Face cache, each with what --model
// takes to run it (its repo id) or why kiln cannot (another class, a partial download).
#include <algorithm>
#include <cstdio>
#include <string>
#include <system_error>
#include <vector>

#include "commands.h"
#include "help.h"
#include "core/error.h"
#include "core/terminal.h"
#include "io/hub_cache.h"
#include "io/json_config.h"
#include "io/model_folder.h"
#include "pipelines/diffusion_pipeline.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

// The bytes of the repo's blobs (what it holds on disk).
uint64_t blob_bytes(const fs::path& repo) {
  uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(repo / "blobs", ec))
    if (e.is_regular_file(ec)) bytes += e.file_size(ec);
  return bytes;
}

// Why kiln cannot run `snapshot` ("" when it can): not a pipeline, a class kiln lacks, or
// components missing from the download.
std::string problem(const fs::path& snapshot, std::string& cls) {
  if (snapshot.empty()) return "no snapshot (refs/main names none that exists)";
  if (!fs::exists(snapshot / "model_index.json")) return "no model_index.json (not a Diffusers pipeline download)";
  try {
    const io::JsonConfig index(snapshot / "model_index.json");
    cls = index.get_string("_class_name", "");
    const std::vector<std::string>& known = DiffusionPipeline::supported_classes();
    if (std::find(known.begin(), known.end(), cls) == known.end()) return "a pipeline kiln does not implement";
    std::string missing;
    for (const auto& [name, entry] : io::model_index_components(index, snapshot, "list"))
      if (entry.size() == 2 && entry[1].is_string() && !fs::is_directory(snapshot / name))
        missing += (missing.empty() ? "" : ", ") + name;
    if (!missing.empty()) return "partly downloaded: no " + missing;
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

int list(const std::vector<std::string>& args) {
  for (const std::string& a : args) unknown_flag("list", a);
  const fs::path cache = io::hub_cache_dir();
  const std::vector<io::CachedRepo> repos = io::cached_model_repos();
  print_line(stdout, "Hugging Face cache: %s ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub)",
             cache.c_str());
  int runnable = 0;
  for (const io::CachedRepo& r : repos) {
    std::string cls;
    const std::string why = problem(r.snapshot, cls);
    runnable += why.empty();
    print_line(stdout, "  %-44s %-26s %7.1f GB  %s", r.repo_id.c_str(), cls.empty() ? "-" : cls.c_str(),
               double(blob_bytes(r.folder)) / 1e9, why.empty() ? "runs: kiln generate --model REPO" : why.c_str());
  }
  if (repos.empty()) print_line(stdout, "  (no models; fetch one with: %s)",
                                io::hub_download_command("black-forest-labs/FLUX.1-schnell").c_str());
  else print_line(stdout, "%d of %zu runnable", runnable, repos.size());
  return 0;
}

}  // namespace kiln::cli
