#include "pipelines/model_argument.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "io/model_folder.h"
#include "models/transformer_families.h"
#include "nn/weight_source.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWhere = "pipeline";

[[noreturn]] void refuse_checkpoint_file(const fs::path& file) {
  const std::string f = file.string();
  const std::vector<io::DetectedLayout> layouts = detect_original_layouts(nn::open_checkpoint(file)->names());
  const TransformerFamily* family = nullptr;
  bool vae = false;
  for (const io::DetectedLayout& d : layouts) {
    if (!family) family = transformer_family(d.layout);
    vae = vae || d.layout == io::Layout::ldm_vae;
  }
  if (!family)
    fail(kWhere, "--model ", f, ": a checkpoint file", vae ? " holding a VAE" : "",
         ", not a pipeline; kiln loads a pipeline from a Diffusers folder or a Hub repo id (--model), and reads one "
         "component's weights from a file with --transformer FILE, --vae FILE or --text-encoder FILE beside it");
  fail(kWhere, "--model ", f, ": a single-file checkpoint holding a ", family->family, " transformer",
       vae ? " and a VAE" : "", " (", io::layout_name(family->original),
       " names); kiln takes the pipeline's configs, text encoders and tokenizers from a Diffusers folder: run it as "
       "--model ", family->example_repo, " (or another ", family->family, " folder) --transformer ", f,
       vae ? " --vae " + f : std::string());
}

}  // namespace

fs::path pipeline_folder(const fs::path& model) {
  const fs::path folder = io::locate_model(model.string(), kWhere);
  if (!fs::is_directory(folder)) refuse_checkpoint_file(folder);
  return folder;
}

}  // namespace kiln
