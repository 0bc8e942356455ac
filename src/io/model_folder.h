// The model folder a user names (--model, FluxPipeline::from_pretrained) and the components
// its model_index.json lists.
//
// Accepted folders:
//   - a Diffusers folder (model_index.json and one folder per component), sharded or not, whose
//     files may be symlinks anywhere (a Hugging Face hub cache snapshot is one:
//     models--org--name/snapshots/REV/, every file a link into ../../blobs/);
//   - a Hugging Face hub cache repo folder (models--org--name: refs/, snapshots/, blobs/, no
//     model_index.json): the snapshot refs/main names, snapshots/<refs/main>;
//   - a Hub repo id ("black-forest-labs/FLUX.1-schnell") that names no folder here: that repo's
//     folder in the hub cache (io/hub_cache.h).
#pragma once
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/json_config.h"

namespace kiln::io {

// `dir` itself, or for a hub cache repo folder dir/snapshots/<contents of dir/refs/main,
// whitespace stripped>. Errors ("[model] ...") when refs/main is missing or empty, names no
// good folder name, or its snapshot folder is missing; each lists the snapshots there are.
// A `dir` that is neither (missing, no model_index.json, ...) comes back as it is, for the
// caller's own error.
std::filesystem::path resolve_model_folder(const std::filesystem::path& dir);

// The folder `model` names, as the list above accepts it. A path that exists and is no folder
// (a checkpoint file) comes back as it is, for the caller to say what to do with it. Errors
// (tagged `where`) name what was looked for: the path, or the repo's cache folder with the
// `hf download` command that fetches it.
std::filesystem::path locate_model(const std::string& model, const std::string& where);

// True when `dir` looks like a hub cache repo folder: no model_index.json, and a refs/,
// snapshots/ or blobs/ folder.
bool is_hub_cache_repo(const std::filesystem::path& dir);

// The component entries of `index` (dir/model_index.json): every key not starting with '_'
// whose value is an array ([library, class], or [null, null] for a component left out), sorted
// by name. Each name is checked with check_relative_name (errors tagged `where`) before
// anything is returned.
std::vector<std::pair<std::string, nlohmann::json>> model_index_components(
    const JsonConfig& index, const std::filesystem::path& dir, const std::string& where);

}  // namespace kiln::io
