// A folder written whole or not at all (kiln make-random's DIR). The work goes into a hidden
// temporary `.NAME.<where>.PID` next to DIR, which commit() renames onto it, so a failed run leaves
// no DIR. SIGINT, SIGTERM or SIGHUP removes the temporary (and the parents the run created)
// before the signal ends the process; one that SIGKILL (or a crash) left is removed by the next
// run writing next to it, once its PID is no longer alive. (io/output_file.h does the same for
// one file.)
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace kiln::io {

class StagedFolder {
 public:
  // Checks `dir` (a folder name, not existing or an empty folder), creates its missing parents
  // (mkdir -p), checks that `needed` bytes fit the free space there, removes stale temporaries
  // and creates the temporary. Errors start "[where]" and name what is wrong.
  StagedFolder(const std::filesystem::path& dir, uint64_t needed, const char* where);
  // Not committed: removes the temporary and the parents it created (if still empty).
  ~StagedFolder();
  StagedFolder(const StagedFolder&) = delete;
  StagedFolder& operator=(const StagedFolder&) = delete;

  // The temporary to write into.
  const std::filesystem::path& path() const { return temp_; }
  // Fsyncs every folder in it, renames it onto `dir` (rename(2) replaces an empty folder, never
  // a full one) and fsyncs the parent: from then on a signal removes nothing.
  void commit();

 private:
  class RemoveOnSignal;
  void undo();  // disarms, removes the temporary and the created parents (if still empty)
  const char* where_;
  std::filesystem::path shown_, target_, temp_;
  std::vector<std::filesystem::path> created_;
  std::unique_ptr<RemoveOnSignal> cleanup_;
  bool committed_ = false;
};

}  // namespace kiln::io
