// The persistent executable cache of compiled mode: a
// compiled graph (canonical graph + launch partition) is written to one file per key, so a
// second process with the same shapes loads it instead of compiling. The key combines the
// graph's structural fingerprint with the engine version, the executable format version, the
// fusion limits and the CPU's features; a file is also checksummed and its graph compared with
// the traced one node by node before use. Anything that does not match (corrupt, truncated,
// another engine or CPU, a hash collision) is ignored with a warning and recompiled over.
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "exec/graph_executor.h"

namespace kiln {

// Bumped whenever the serialised form or the meaning of a launch partition changes.
constexpr int kExecutableFormatVersion = 2;

// KILN_CACHE_DIR (read once); unset: $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln. Empty when
// the variable is "none" (persistence off) or no home directory is known.
std::filesystem::path executable_cache_dir();
// Replaces that directory for the rest of the process (an empty path turns persistence off).
void set_executable_cache_dir(const std::filesystem::path& dir);
// The running CPU's architecture and SIMD features ("x86_64 avx2 avx512f ..."), part of each key.
std::string cpu_features();

// The file an executable of `canonical` is stored in under `dir`.
std::filesystem::path executable_path(const std::filesystem::path& dir, const Graph& canonical);

// The stored executable for `canonical` (memory planned), or nullptr when there is none.
// A file that exists but cannot be trusted returns nullptr and sets `*rejected` to why.
std::shared_ptr<const CompiledGraph> load_executable(const std::filesystem::path& dir, const Graph& canonical,
                                                     std::string* rejected);
// Writes `compiled` (temp file + rename, so readers never see a partial entry). Failures (a
// read-only directory, a full disk) are returned as a message, never thrown: the cache is an
// optimisation.
std::string store_executable(const std::filesystem::path& dir, const CompiledGraph& compiled);

}  // namespace kiln
