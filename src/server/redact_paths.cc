#include "server/redact_paths.h"

#include <algorithm>
#include <vector>

namespace kiln::server {

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

// Where a path may begin: the start, after a space, a quote, a bracket or '='; not after ':' (a
// URL's "//") or a name ("a/b" is relative).
bool path_may_start_after(char c) { return c == ' ' || c == '\'' || c == '"' || c == '(' || c == '[' || c == '=' || c == '\n'; }

bool ends_path(char c) { return c == ' ' || c == '\'' || c == '"' || c == ')' || c == ']' || c == ',' || c == ';' || c == '\n'; }

}  // namespace

std::string redact_paths(const std::string& message, const std::filesystem::path& model_folder,
                         const std::string& model_name) {
  std::string out = message;
  std::vector<std::string> folders;
  std::error_code ec;
  for (const std::filesystem::path& p : {model_folder, std::filesystem::absolute(model_folder, ec),
                                         std::filesystem::weakly_canonical(model_folder, ec)}) {
    std::string s = p.lexically_normal().string();
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    if (s.size() > 1 && s.front() == '/') folders.push_back(s);
  }
  // Longest first, so a folder is never replaced inside a longer one.
  std::sort(folders.begin(), folders.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  for (const std::string& f : folders) replace_all(out, f, model_name);

  std::string redacted;
  redacted.reserve(out.size());
  for (size_t i = 0; i < out.size();) {
    if (out[i] == '/' && (i == 0 || path_may_start_after(out[i - 1]))) {
      size_t end = i;
      while (end < out.size() && !ends_path(out[end])) ++end;
      std::string path = out.substr(i, end - i);
      while (!path.empty() && (path.back() == '.' || path.back() == ':')) {  // a sentence's end
        path.pop_back();
        --end;
      }
      const size_t last = path.find_last_of('/');
      if (last != 0 && last != std::string::npos) {
        redacted += ".../" + path.substr(last + 1);
        i = end;
        continue;
      }
    }
    redacted += out[i++];
  }
  return redacted;
}

}  // namespace kiln::server
