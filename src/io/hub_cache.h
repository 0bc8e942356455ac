// Models a user already has in the Hugging Face hub cache, named the way they name them on the Hub
// ("black-forest-labs/FLUX.1-schnell"). kiln only reads the cache huggingface_hub wrote; it never
// downloads (the error for a missing repo gives the `hf download` command that fetches it).
//
// The cache folder follows huggingface_hub's rules: $HF_HUB_CACHE, else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. A repo "org/name" lives in
// models--org--name/ (refs/, snapshots/, blobs/: see io/model_folder.h).
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace kiln::io {

// The hub cache folder, by the rules above (it need not exist).
std::filesystem::path hub_cache_dir();

// True for "org/name" as the Hub spells a repo id: two parts of letters, digits, '-', '_' and
// '.', neither starting or ending with '-' or '.', without "--" or "..", at most 96 characters.
bool is_repo_id(const std::string& text);

// The cache folder of repo `repo_id`: hub_cache_dir()/models--org--name.
std::filesystem::path hub_repo_folder(const std::string& repo_id);

// The repo id a cache folder's name stands for ("models--org--name" -> "org/name"), or "" when
// the name is not one.
std::string repo_id_of_cache_folder(const std::string& name);

// The command that puts a Diffusers pipeline repo into the cache: its model_index.json and its
// component folders, not the single-file checkpoints some repos also hold at their root.
std::string hub_download_command(const std::string& repo_id);

// A model repo in the cache and the snapshot refs/main names ("" when it names none that exists).
struct CachedRepo {
  std::string repo_id;
  std::filesystem::path folder;    // models--org--name
  std::filesystem::path snapshot;  // folder/snapshots/REV, or empty
};

// Every models--*--* folder of the cache, sorted by repo id (none when the cache does not exist).
std::vector<CachedRepo> cached_model_repos();

}  // namespace kiln::io
