#include "io/model_folder.h"

#include <algorithm>
#include <system_error>

#include "core/error.h"
#include "io/hub_cache.h"
#include "io/input_file.h"
#include "io/relative_name.h"

namespace kiln::io {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWhere = "model";

// "a1b2c3, d4e5f6" (sorted), or "none", for the snapshots a repo folder holds.
std::string available_snapshots(const fs::path& repo) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(repo / "snapshots", ec))
    if (e.is_directory(ec)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}

std::string strip(const std::string& s) {
  const char* space = " \t\r\n\f\v";
  const size_t b = s.find_first_not_of(space);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(space) - b + 1);
}

}  // namespace

bool is_hub_cache_repo(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || fs::exists(dir / "model_index.json", ec)) return false;
  for (const char* sub : {"refs", "snapshots", "blobs"})
    if (fs::is_directory(dir / sub, ec)) return true;
  return false;
}

fs::path resolve_model_folder(const fs::path& dir) {
  if (!is_hub_cache_repo(dir)) return dir;
  const fs::path ref = dir / "refs" / "main";
  std::error_code ec;
  if (!fs::is_regular_file(ref, ec))
    fail(kWhere, dir.string(),
         ": a Hugging Face hub cache folder (refs/, snapshots/, blobs/) with no refs/main; pass "
         "the snapshot folder snapshots/REV instead, available: ",
         available_snapshots(dir));
  const std::string rev = strip(read_input_file(kWhere, ref, "a file naming a snapshot"));  // never blocks
  check_relative_name(kWhere, ref, "snapshot", rev,
                      "a snapshot folder name under " + (dir / "snapshots").string() +
                          "; available: " + available_snapshots(dir));
  const fs::path snapshot = dir / "snapshots" / rev;
  if (!fs::is_directory(snapshot, ec))
    fail(kWhere, ref.string(), ": names snapshot '", rev, "', but the snapshot folder ",
         snapshot.string(), " is missing; available: ", available_snapshots(dir));
  return snapshot;
}

fs::path locate_model(const std::string& model, const std::string& where) {
  std::error_code ec;
  if (fs::exists(model, ec)) return fs::is_directory(model, ec) ? resolve_model_folder(model) : fs::path(model);
  if (!is_repo_id(model))
    fail(where, "model folder ", model, " does not exist (expected a Diffusers folder, a Hugging Face cache folder, "
         "or a Hub repo id such as black-forest-labs/FLUX.1-schnell)");
  const fs::path repo = hub_repo_folder(model);
  if (!fs::is_directory(repo, ec))
    fail(where, model, " is not a folder here, and the Hugging Face cache has no ", repo.string(),
         " (the cache is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub); kiln does not "
         "download models: fetch it with ", hub_download_command(model));
  const fs::path snapshot = resolve_model_folder(repo);
  if (snapshot == repo)  // refs/, snapshots/ and blobs/ all missing: not a cache repo folder
    fail(where, repo.string(), " (", model, " in the Hugging Face cache) has no refs/main and no snapshots/; fetch it "
         "with ", hub_download_command(model));
  if (!fs::exists(snapshot / "model_index.json", ec))
    fail(where, snapshot.string(), " (", model, " in the Hugging Face cache) has no model_index.json: a partial "
         "download, or a repo that is not a Diffusers pipeline; fetch the pipeline with ", hub_download_command(model));
  return snapshot;
}

std::vector<std::pair<std::string, nlohmann::json>> model_index_components(
    const JsonConfig& index, const fs::path& dir, const std::string& where) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  for (const auto& [name, value] : index.json().items()) {
    if ((!name.empty() && name[0] == '_') || !value.is_array()) continue;
    check_relative_name(where, dir / "model_index.json", "component", name,
                        "a component folder inside " + dir.string());
    out.emplace_back(name, value);
  }
  return out;
}

}  // namespace kiln::io
