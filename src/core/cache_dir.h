// Where kiln keeps what it makes once and reuses across processes (compiled executables,
// generated device kernels): KILN_CACHE_DIR ("none": nowhere), else $XDG_CACHE_HOME/kiln, else
// ~/.cache/kiln; empty when none of them is set.
#pragma once
#include <filesystem>

namespace kiln {

std::filesystem::path cache_dir();

}  // namespace kiln
