#include "random_checkpoint/random_folder.h"

#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <system_error>

#include "core/error.h"
#include "io/output_file.h"
#include "io/staged_folder.h"

namespace kiln::random_weights {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWhere = "make-random";

void write_text(const fs::path& path, const std::string& text) {
  io::write_output_atomically(kWhere, path, [&](std::FILE* f) { std::fwrite(text.data(), 1, text.size(), f); });
}

void create_folder(const fs::path& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  KILN_CHECK(!ec, kWhere, "cannot create ", path.string(), ": ", ec.message());
}

uint64_t tree_bytes(const fs::path& dir) {
  uint64_t bytes = 0;
  try {
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.is_regular_file()) bytes += e.file_size();
  } catch (const fs::filesystem_error& e) {
    fail(kWhere, "cannot read ", dir.string(), ": ", e.what());
  }
  return bytes;
}

// Copies the regular files under `from` to `to` (folders created with the default mode, so a
// read-only source gives a writable copy), except those whose path relative to DIR is in `skip`.
void copy_folder(const fs::path& from, const fs::path& to, const fs::path& root, const std::set<fs::path>& skip) {
  create_folder(to);
  for (const auto& e : fs::recursive_directory_iterator(from)) {
    const fs::path dest = to / fs::relative(e.path(), from);
    if (e.is_directory()) {
      create_folder(dest);
    } else if (e.is_regular_file() && !skip.count(fs::relative(dest, root))) {
      std::error_code ec;
      fs::copy_file(e.path(), dest, ec);
      KILN_CHECK(!ec, kWhere, "cannot copy ", e.path().string(), " to ", dest.string(), ": ", ec.message());
    }
  }
}

}  // namespace

uint64_t RandomFolder::total_bytes() const {
  uint64_t b = other_bytes;
  for (const WrittenComponent& c : components) b += c.bytes;
  return b;
}

int64_t RandomFolder::total_parameters() const {
  int64_t n = 0;
  for (const WrittenComponent& c : components) n += c.parameters;
  return n;
}

RandomFolder write_random_folder(const fs::path& dir, const RandomFolderContents& contents,
                                 const RandomFolderProgress& progress) {
  // ---- every check before any work ----
  KILN_CHECK(is_floating(contents.dtype), kWhere, "weights are f32, bf16 or f16, not ", dtype_name(contents.dtype));
  for (const auto& [from, to] : contents.copied_folders)
    KILN_CHECK(fs::is_directory(from), kWhere, "tokenizer folder ", from.string(),
               " is missing (make-random copies the bundled checkpoint's tokenizers)");
  // The bytes to write, from the shapes alone (every file's header is well under 1 KiB a tensor),
  // so that even an absurd block count is refused at once.
  uint64_t needed = 1 << 20;  // configs, model_index.json, the scheduler config, shard indexes
  for (const RandomComponent& c : contents.components)
    needed += (contents.layout_only ? 0 : uint64_t(c.parameters()) * dtype_size(contents.dtype)) +
              1024 * c.tensors.size();
  for (const auto& [from, to] : contents.copied_folders) needed += tree_bytes(from);
  for (const auto& [path, text] : contents.text_files) needed += text.size();

  try {
    io::StagedFolder staged(dir, needed, kWhere);
    const fs::path& temp = staged.path();
    RandomFolder done;
    std::set<fs::path> replaced;
    for (const auto& [path, text] : contents.text_files) replaced.insert(fs::path(path).lexically_normal());
    for (const auto& [from, to] : contents.copied_folders) copy_folder(from, temp / to, temp, replaced);
    for (const auto& [path, text] : contents.text_files) {
      create_folder((temp / path).parent_path());
      write_text(temp / path, text);
    }
    done.other_bytes = tree_bytes(temp);
    for (const RandomComponent& c : contents.components) {
      if (progress.starting) progress.starting(plan_random_component(c, contents.dtype));
      const auto t0 = std::chrono::steady_clock::now();
      done.components.push_back(write_random_component(temp, c, contents.dtype, contents.seed, contents.layout_only));
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (progress.written) progress.written(done.components.back(), seconds);
    }
    staged.commit();
    return done;
  } catch (const fs::filesystem_error& e) {
    fail(kWhere, "cannot write ", dir.string(), ": ", e.what());
  }
}

}  // namespace kiln::random_weights
