// kiln's own files that are not code: the make-random recipes with the Hub files they imitate
// (make_random/) and the bundled tiny checkpoint with the fixture tokenizers make-random copies.
//
// A kiln run from its build tree reads them from the source tree (data/, tests/fixtures/). An
// installed kiln (cmake --install) reads PREFIX/share/kiln/{data,fixtures}: found beside the
// running program (PREFIX/bin/../share/kiln), so an installed tree can be moved, else at the
// prefix it was installed to; the source tree is the last resort, and no path is needed at all
// for a program that never asks.
#pragma once
#include <filesystem>

namespace kiln::io {

// The folder holding make_random/ (likes.json and one folder per recipe).
std::filesystem::path kiln_data_dir();
// The folder holding the tiny checkpoints (flux1_tiny_arch/pipeline, ...).
std::filesystem::path kiln_fixtures_dir();
// The checkpoint kiln runs without --model: kiln_fixtures_dir()/flux1_tiny_arch/pipeline.
std::filesystem::path bundled_model_dir();

}  // namespace kiln::io
