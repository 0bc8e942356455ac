// The PJRT backend's files under cache_dir() (core/cache_dir.h): compiled executables (pjrt/)
// and the memory figures of ahead-of-time compiles (aot/), each named by a hash of what made it
// (the program text and the plugin or topology), so a changed input is a new file.
#pragma once
#include <filesystem>
#include <optional>
#include <string>

namespace kiln::pjrt {

// cache_dir()/`kind`/<hash of text and salt><extension>; empty when there is no cache folder.
std::filesystem::path cache_file(const std::string& kind, const std::string& text, const std::string& salt,
                                 const std::string& extension);
// The file's bytes, when it exists and reads whole.
std::optional<std::string> read_cache_file(const std::filesystem::path& file);
// Writes `bytes` to `file` through a temporary and a rename. The cache is an optimisation: a
// failure (a full disk, no permission) only means the work is done again next time.
void store_cache_file(const std::filesystem::path& file, const std::string& bytes);

}  // namespace kiln::pjrt
