// Writing a whole Diffusers folder of random components (kiln make-random), whatever the model:
// text files (model_index.json, the scheduler config, edited tokenizer files), folders copied as
// they are (the bundled checkpoint's tokenizers) and the random weight components, each streamed
// to disk (random_component.h). flux1_random_folder.h, sd3_random_folder.h and
// flux2_random_folder.h say what goes in.
//
// The folder is written whole or not at all (io/staged_folder.h): a hidden temporary
// `.NAME.make-random.PID` next to DIR, renamed onto it at the end; a signal removes it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "random_checkpoint/random_component.h"

namespace kiln::random_weights {

struct RandomFolderContents {
  // The weight components, in the order they are written.
  std::vector<RandomComponent> components;
  DType dtype = DType::bf16;
  uint64_t seed = 0;
  // Every tensor's bytes left as a hole (reading as zeros, no disk space): a folder that only
  // has the model's layout, for loading without reading weights (kiln plan --like).
  bool layout_only = false;
  // Folders copied file by file: {source folder, destination relative to DIR}. A missing source
  // is an error that says make-random copies the bundled checkpoint's tokenizers.
  std::vector<std::pair<std::filesystem::path, std::string>> copied_folders;
  // Text files: {path relative to DIR, contents}. A text file replaces a copied file of the
  // same path (the copy skips it).
  std::vector<std::pair<std::string, std::string>> text_files;
};

struct RandomFolderProgress {
  std::function<void(const WrittenComponent& planned)> starting;               // before a component
  std::function<void(const WrittenComponent& written, double seconds)> written;  // after it
};

struct RandomFolder {
  std::vector<WrittenComponent> components;  // in RandomFolderContents' order
  uint64_t other_bytes = 0;                  // the text files and the copied folders
  uint64_t total_bytes() const;
  int64_t total_parameters() const;
};

// Writes the folder (see above). Before any work it checks, with errors naming what is wrong:
// the dtype; every copied folder existing; DIR not existing or being an empty folder (missing
// parents are created, and removed again on failure); and enough free space for every file.
RandomFolder write_random_folder(const std::filesystem::path& dir, const RandomFolderContents& contents,
                                 const RandomFolderProgress& progress = {});

}  // namespace kiln::random_weights
