#include "core/cache_dir.h"

#include <cstdlib>

#include "core/env.h"

namespace kiln {

std::filesystem::path cache_dir() {
  static const std::filesystem::path dir = []() -> std::filesystem::path {
    if (const auto v = env::text("KILN_CACHE_DIR")) {
      if (*v == "none") return {};
      return *v;
    }
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::filesystem::path(x) / "kiln";
    if (const char* h = std::getenv("HOME"); h && *h) return std::filesystem::path(h) / ".cache" / "kiln";
    return {};
  }();
  return dir;
}

}  // namespace kiln
