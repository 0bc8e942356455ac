#include "io/relative_name.h"

#include "core/error.h"

namespace kiln::io {

std::string relative_name_problem(const std::string& name) {
  if (name.empty()) return "is empty";
  if (name.find('\0') != std::string::npos) return "holds a NUL character";
  const std::filesystem::path p(name);
  if (p.has_root_path() || name.front() == '/') return "is an absolute path";
  bool names_something = false;
  for (const std::filesystem::path& part : p) {
    if (part == "..") return "contains a '..' component";
    if (!part.empty() && part != ".") names_something = true;
  }
  if (!names_something) return "names the folder itself";
  return "";
}

void check_relative_name(const std::string& where, const std::filesystem::path& listed_in,
                         const std::string& entry, const std::string& name,
                         const std::string& expected) {
  const std::string problem = relative_name_problem(name);
  if (problem.empty()) return;
  // A NUL would cut the message short where it is printed as a C string.
  std::string shown = name;
  for (char& ch : shown)
    if (ch == '\0') ch = '?';
  fail(where, listed_in.string(), ": ", entry, " '", shown, "' ", problem, "; expected ", expected,
       " (a relative name: not empty, no '..' component, not an absolute path)");
}

}  // namespace kiln::io
