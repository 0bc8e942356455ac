// What a pipeline is loaded from (--model, DiffusionPipeline::from_pretrained): a Diffusers folder,
// a Hugging Face cache folder or a Hub repo id in the cache (io::locate_model). A single checkpoint
// file is refused with the command that runs it: kiln takes a pipeline's configs, tokenizers and
// scheduler from a Diffusers folder, and reads a file's transformer and VAE through --transformer
// FILE and --vae FILE beside a --model of the same family.
#pragma once
#include <filesystem>

namespace kiln {

// The Diffusers folder `model` names; errors ("[pipeline] ...") say what was expected.
std::filesystem::path pipeline_folder(const std::filesystem::path& model);

}  // namespace kiln
