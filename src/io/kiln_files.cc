#include "io/kiln_files.h"

#include <system_error>

namespace kiln::io {

namespace fs = std::filesystem;

namespace {

struct Roots {
  fs::path data, fixtures;
};

// Where the files were found, looked up once: an installed tree beside the running program, the
// source tree this library was built from, the prefix it was installed to.
const Roots& roots() {
  static const Roots found = [] {
    std::error_code ec;
    const auto has_recipes = [&](const fs::path& data) {
      return fs::is_regular_file(data / "make_random" / "likes.json", ec);
    };
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    const fs::path beside = exe.parent_path().parent_path() / "share" / "kiln";
    if (!exe.empty() && has_recipes(beside / "data")) return Roots{beside / "data", beside / "fixtures"};
    const fs::path source = KILN_SOURCE_ROOT;
    if (has_recipes(source / "data")) return Roots{source / "data", source / "tests" / "fixtures"};
    const fs::path installed = KILN_INSTALL_DATADIR;
    return Roots{installed / "data", installed / "fixtures"};
  }();
  return found;
}

}  // namespace

fs::path kiln_data_dir() { return roots().data; }
fs::path kiln_fixtures_dir() { return roots().fixtures; }
fs::path bundled_model_dir() { return kiln_fixtures_dir() / "flux1_tiny_arch" / "pipeline"; }

}  // namespace kiln::io
