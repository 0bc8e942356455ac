// Messages a server sends to its clients without the paths of the machine it runs on: a job's
// error (a checkpoint file that cannot be read, a cache folder) would otherwise tell every client
// where the server keeps its models and who runs it.
#pragma once
#include <filesystem>
#include <string>

namespace kiln::server {

// `message` with the model's folder (as given and as resolved) replaced by `model_name`, and
// every other absolute path shortened to ".../" and its last component.
std::string redact_paths(const std::string& message, const std::filesystem::path& model_folder,
                         const std::string& model_name);

}  // namespace kiln::server
