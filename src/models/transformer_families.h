// The diffusion-transformer families kiln runs, each registered once: its Diffusers class name,
// the single-file layout its original checkpoints use (BFL's, Stability's) with that layout's
// key map, and how to load it from a Diffusers folder for its named parameters. kiln convert and
// the single-file loaders (pipelines/component_file.h) read this table; a new family adds a row.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/key_map.h"
#include "nn/weights.h"

namespace kiln {

struct TransformerFamily {
  const char* class_name;    // config.json's _class_name: "FluxTransformer2DModel"
  const char* family;        // what users call it: "FLUX.1"
  const char* example_repo;  // a Hub pipeline repo of the family, for errors: "black-forest-labs/FLUX.1-schnell"
  io::Layout original;     // its original checkpoints' layout
  std::vector<io::KeyRule> (*original_key_rules)();  // that layout's names as Diffusers'; see original_key_map
  std::vector<std::string> signature;  // tensors only that layout has: any one identifies a file in it
  // from_pretrained(dir, dtype).named_parameters(): the checkpoint's keys, as loaded.
  nn::NamedParameters (*load)(const std::filesystem::path& dir, std::optional<DType> dtype);
};

const std::vector<TransformerFamily>& transformer_families();
// The family of `class_name`, or nullptr.
const TransformerFamily* transformer_family(const std::string& class_name);
// "FluxTransformer2DModel, SD3Transformer2DModel, Flux2Transformer2DModel": what an error expects.
std::string transformer_class_names();

// The key map of an original layout (not diffusers), named as the layout (io::layout_name) in
// errors: a transformer family's, or the LDM VAE's (the one original layout of another
// component). A new io::Layout needs a row here or there: without one, opening a file in it
// fails naming the layout.
const io::KeyMap& original_key_map(io::Layout layout);

// The original layout of a file's tensors `names` for `component` ("" for whichever it holds),
// among the families' and the LDM VAE's signatures (io::detect_layout): diffusers when none.
io::DetectedLayout detect_original_layout(const std::vector<std::string>& names, const std::string& component = "",
                                          const std::string& file = "");
io::DetectedLayout detect_original_layout(const nn::WeightSource& source, const std::string& component = "");
// Every original layout `names` carry (a transformer's and a VAE's in an all-in-one file).
std::vector<io::DetectedLayout> detect_original_layouts(const std::vector<std::string>& names);
// The family whose original layout is `layout`, or nullptr (the LDM VAE's, diffusers).
const TransformerFamily* transformer_family(io::Layout layout);

}  // namespace kiln
