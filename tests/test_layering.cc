// The source tree's layers include only the layers below them, in every folder: a map of the
// allowed dependencies, checked against every #include "layer/..." of src/ and tools/. Above
// src/devices only the device interface (devices/runtime.h, devices/aot_target.h) is named,
// never a backend's own headers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace kiln {
namespace {

namespace fs = std::filesystem;

// Each layer and the layers it may include (besides itself). Reads bottom-up.
const std::map<std::string, std::set<std::string>>& allowed() {
  static const std::map<std::string, std::set<std::string>> m = {
      {"core", {}},
      {"graph", {"core"}},
      {"io", {"core"}},
      {"distributed", {"core"}},
      {"tokenizers", {"core", "io"}},
      {"devices", {"core", "graph", "distributed"}},
      {"exec", {"core", "graph", "io", "distributed", "devices"}},
      {"schedulers", {"core", "exec", "io"}},
      {"nn", {"core", "distributed", "exec", "io"}},
      {"models", {"core", "distributed", "exec", "io", "nn"}},
      {"random_checkpoint", {"core", "distributed", "exec", "io", "nn", "models"}},
      {"pipelines", {"core", "devices", "distributed", "exec", "io", "models", "nn", "schedulers", "tokenizers"}},
      {"server", {"core", "distributed", "exec", "io", "pipelines"}},
      {"tools", {"core", "graph", "io", "distributed", "tokenizers", "devices", "exec", "schedulers", "nn", "models",
                 "pipelines", "server", "random_checkpoint"}},
  };
  return m;
}

// What a layer above src/devices may include from it: the device interface only.
bool device_interface(const std::string& header) {
  return header == "devices/runtime.h" || header == "devices/aot_target.h";
}

TEST(Layering, EveryFolderIncludesOnlyTheLayersBelowIt) {
  const std::regex include(R"(^\s*#\s*include\s+"([a-z0-9_]+)/([^"]+)\")");
  std::ostringstream wrong;
  int files = 0, includes = 0;
  for (const char* top : {"src", "tools"}) {
    const fs::path root = fs::path(KILN_SOURCE_DIR) / top;
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(root)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".h" && ext != ".cc")) continue;
      const std::string rel = fs::relative(e.path(), KILN_SOURCE_DIR).string();
      const std::string layer = std::string(top) == "tools" ? "tools" : rel.substr(4, rel.find('/', 4) - 4);
      const auto rules = allowed().find(layer);
      ASSERT_NE(rules, allowed().end()) << "a folder the layer map does not know: src/" << layer
                                        << " (add it to allowed() with the layers it may include)";
      ++files;
      std::ifstream in(e.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        std::smatch m;
        if (!std::regex_search(line, m, include)) continue;
        const std::string to = m[1].str(), header = to + "/" + m[2].str();
        if (to == layer || !allowed().count(to)) continue;  // its own layer, or a path relative to its folder
        ++includes;
        const bool below = rules->second.count(to) > 0;
        const bool interface_only = to != "devices" || layer == "devices" || device_interface(header);
        if (!below || !interface_only)
          wrong << rel << ":" << n << ": " << layer << " includes " << header
                << (below ? " (a backend's own header above src/devices)" : " (not a layer below it)") << "\n";
      }
    }
  }
  EXPECT_GT(files, 300);
  EXPECT_GT(includes, 500);
  EXPECT_EQ(wrong.str(), "");
}

}  // namespace
}  // namespace kiln
