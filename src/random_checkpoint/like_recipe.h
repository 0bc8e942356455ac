// The checkpoints kiln make-random imitates (--like NAME), as data: data/make_random/likes.json
// lists each one (its family, the fixture tokenizers it copies, the depths a user may choose),
// and data/make_random/NAME/ holds its Hub files (model_index.json, the scheduler's config,
// every component's config.json, tokenizer files it edits), with the edits likes.json's notes
// name (the tokenizer classes of the copied fixtures, no IP-Adapter entries). A component's weights follow from what
// the model its config.json names reads (component_reads.h), so a new checkpoint of a known
// family is a folder of JSON files and an entry in likes.json.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "random_checkpoint/random_folder.h"

namespace kiln::random_weights {

// A depth the user chooses with a flag: --blocks sets the transformer's block counts, --t5-layers
// T5's layers, ... Each value sets one config key (a '/' path: "text_config/num_hidden_layers").
struct LikeDepth {
  std::string flag;               // "--blocks"
  std::string component;          // "transformer"
  std::vector<std::string> keys;  // "num_layers", "num_single_layers": one value each, '+'-joined
  int64_t min = 0;
  std::string form;  // what a value is: "D+S, the double-stream and single-stream block counts"
  std::string unit;  // "transformer block": "needs at least 1 transformer block"
  std::string why;   // why the minimum, or ""
  std::string words;  // "transformer blocks": the summary's "19+38 transformer blocks"
};

// A folder copied from the test fixtures (the tiny checkpoints' tokenizers). A file of the
// recipe's folder at the same path replaces the copy's (SD3's tokenizer_2 pads with "!").
struct LikeCopy {
  std::string to, from;  // DIR/to; from relative to the fixtures folder
};

struct LikeRecipe {
  std::string name, family;  // "flux1-schnell", "FLUX.1"
  std::string hub;           // the Hub repo it imitates: "black-forest-labs/FLUX.1-schnell"
  std::vector<LikeCopy> copies;
  std::vector<LikeDepth> depths;
  // The pipeline's default text_encoder_out_layers, where it has them (FLUX.2): a shallower text
  // encoder needs other ones.
  std::vector<int64_t> text_encoder_out_layers;
  std::filesystem::path files;  // data/make_random/NAME

  const LikeDepth* depth(const std::string& flag) const;  // nullptr when it has no such depth
  // The Hub file at `path` (relative to the folder), parsed.
  nlohmann::json hub_json(const std::string& path) const;
};

// Every recipe, in likes.json's order (read once, from the data folder the build names).
const std::vector<LikeRecipe>& like_recipes();
// The recipe `name`, or an error listing the names.
const LikeRecipe& like_recipe(const std::string& name);
bool is_like_name(const std::string& name);
// The Hub repo id of the recipe `name` ("flux1-schnell" -> "black-forest-labs/FLUX.1-schnell"),
// or "" when no recipe has that name: --model's short names.
std::string like_hub_repo(const std::string& name);
// Every name joined by `separator` ("flux1-schnell|flux1-dev|...": --help's value).
std::string like_names_joined(const std::string& separator);
// "flux1-schnell or flux1-dev (FLUX.1), sd3-medium or sd3.5-medium (Stable Diffusion 3), ...":
// what an error expects.
std::string like_names_by_family();

struct RandomLikeOptions {
  std::string like;
  std::map<std::string, std::vector<int64_t>> depths = {};  // flag -> one value per LikeDepth key; others the Hub's
  DType dtype = DType::bf16;
  uint64_t seed = 0;
  bool layout_only = false;  // RandomFolderContents::layout_only
};

// A flag's value as the user writes it ("19+38", "24") read for `recipe`, with errors naming the
// flag, the value and what was expected.
std::vector<int64_t> parse_like_depth(const LikeRecipe& recipe, const std::string& flag, const std::string& value);

// The config.json of each weight component (model_index.json's entries with one), by folder name
// (so in the order text encoders, transformer, vae), with the options' depths and dtype.
std::map<std::string, nlohmann::json> like_configs(const RandomLikeOptions& options);
// The components, tensors and all, in that order; one of them by folder.
std::vector<RandomComponent> like_components(const RandomLikeOptions& options);
RandomComponent like_component(const RandomLikeOptions& options, const std::string& folder);
// Everything the folder holds, its tokenizers copied from `fixtures` (kiln's tests/fixtures).
RandomFolderContents like_contents(const RandomLikeOptions& options, const std::filesystem::path& fixtures);
// The values of one depth in the folder: the options' or the Hub's.
std::vector<int64_t> like_depth(const RandomLikeOptions& options, const LikeDepth& depth);
// Its depths in words: "19+38 transformer blocks, 24 T5 layers".
std::string like_summary(const RandomLikeOptions& options);

}  // namespace kiln::random_weights
