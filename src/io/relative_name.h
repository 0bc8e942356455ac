// Names that one checkpoint file gives for another: shard file names in a
// *.safetensors.index.json weight_map, component folder names in model_index.json, the snapshot
// a Hugging Face hub cache's refs/main names. Such a name must stay inside the folder it is
// relative to: it is not empty, holds no ".." component and is not an absolute path. The rule
// is about the name only; where the user's own files (symlinks into a hub cache's blobs/, say)
// lead once the OS opens `folder / name` is the user's business.
#pragma once
#include <filesystem>
#include <string>

namespace kiln::io {

// What is wrong with `name` as a relative name ("is empty", "contains a '..' component", ...),
// or "" when nothing is.
std::string relative_name_problem(const std::string& name);

// Throws kiln::Error
//   "[where] <listed_in>: <entry> '<name>' <problem>; expected <expected> (a relative name:
//    not empty, no '..' component, not an absolute path)"
// unless `name` is a good relative name. `entry` says what the name is, e.g. "component" or
// "weight_map entry for tensor 'x': shard"; `expected` what it should name, e.g. "a shard file
// inside /m/transformer".
void check_relative_name(const std::string& where, const std::filesystem::path& listed_in,
                         const std::string& entry, const std::string& name,
                         const std::string& expected);

}  // namespace kiln::io
