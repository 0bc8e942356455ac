// An unlinked file on disk that holds bytes moved out of the process's memory: under model
// offload, a component's host copy (weights quantized or converted at load, which have no
// checkpoint file to be re-read from) is written here and mapped back read-only, so while the
// component waits for its turn its pages are the kernel's page cache, not the process's, and
// leave memory under pressure as a mapped checkpoint's do (exec/residency.h). The file has no
// name from the moment it is created, so nothing is left on disk however the process ends.
#pragma once
#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>

namespace kiln {

class SpillFile {
 public:
  // Opens a nameless file in `dir` (an error names the folder and the system's reason).
  static std::shared_ptr<SpillFile> create(const std::filesystem::path& dir);
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  // Appends `bytes` bytes at a page boundary and maps them read-only. The mapping outlives this
  // object if need be. Errors (no space left) name the folder and the bytes asked for; nothing is
  // mapped then.
  struct Mapping {
    void* data;
    std::shared_ptr<void> owner;  // unmaps when the last copy goes
  };
  Mapping write(const void* data, size_t bytes);

 private:
  SpillFile(std::filesystem::path dir, int fd) : dir_(std::move(dir)), fd_(fd) {}
  std::filesystem::path dir_;
  int fd_;
  size_t end_ = 0;  // where the next write starts (a page boundary)
};

// What a folder can take: free bytes for this user, and whether it is memory itself (tmpfs:
// spilling there would keep the bytes in memory). {0, false} when it cannot be queried.
struct FolderSpace {
  size_t free_bytes = 0;
  bool in_memory = false;
};
FolderSpace folder_space(const std::filesystem::path& dir);

}  // namespace kiln
