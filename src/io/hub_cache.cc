#include "io/hub_cache.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <system_error>

#include "io/model_folder.h"

namespace kiln::io {

namespace fs = std::filesystem;

namespace {

std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool good_part(const std::string& part) {
  if (part.empty() || part.find("--") != std::string::npos || part.find("..") != std::string::npos) return false;
  for (char c : part)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
  const auto edge = [](char c) { return c == '-' || c == '.'; };
  return !edge(part.front()) && !edge(part.back());
}

}  // namespace

fs::path hub_cache_dir() {
  if (const std::string v = env_text("HF_HUB_CACHE"); !v.empty()) return v;
  if (const std::string v = env_text("HF_HOME"); !v.empty()) return fs::path(v) / "hub";
  if (const std::string v = env_text("XDG_CACHE_HOME"); !v.empty()) return fs::path(v) / "huggingface" / "hub";
  return fs::path(env_text("HOME")) / ".cache" / "huggingface" / "hub";
}

bool is_repo_id(const std::string& text) {
  const size_t slash = text.find('/');
  if (text.size() > 96 || slash == std::string::npos || text.find('/', slash + 1) != std::string::npos) return false;
  return good_part(text.substr(0, slash)) && good_part(text.substr(slash + 1));
}

fs::path hub_repo_folder(const std::string& repo_id) {
  std::string name = "models--" + repo_id;
  name.replace(name.find('/'), 1, "--");
  return hub_cache_dir() / name;
}

std::string repo_id_of_cache_folder(const std::string& name) {
  const size_t sep = name.find("--", 8);
  if (name.rfind("models--", 0) != 0 || sep == std::string::npos) return "";
  return name.substr(8, sep - 8) + "/" + name.substr(sep + 2);
}

std::string hub_download_command(const std::string& repo_id) {
  return "hf download " + repo_id + " --include \"model_index.json\" --include \"*/*\"";
}

std::vector<CachedRepo> cached_model_repos() {
  std::vector<CachedRepo> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(hub_cache_dir(), ec)) {
    const std::string id = repo_id_of_cache_folder(e.path().filename().string());
    if (id.empty() || !e.is_directory(ec)) continue;
    CachedRepo repo{id, e.path(), {}};
    try {
      const fs::path snapshot = resolve_model_folder(e.path());
      if (snapshot != e.path()) repo.snapshot = snapshot;
    } catch (const std::exception&) {
      // No refs/main, or it names a missing snapshot: listed without one.
    }
    out.push_back(std::move(repo));
  }
  std::sort(out.begin(), out.end(), [](const CachedRepo& a, const CachedRepo& b) { return a.repo_id < b.repo_id; });
  return out;
}

}  // namespace kiln::io
