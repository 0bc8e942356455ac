#include "random_checkpoint/like_recipe.h"


#include "core/error.h"
#include "io/input_file.h"
#include "io/json_config.h"
#include "io/kiln_files.h"
#include "random_checkpoint/component_reads.h"

namespace kiln::random_weights {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWhere = "make-random";

std::string read_text(const fs::path& path) {
  return io::read_input_file(kWhere, path, "a file of kiln's data/make_random folder");
}

nlohmann::json read_json(const fs::path& path) {
  const std::string text = read_text(path);
  return io::parse_json(text.data(), text.data() + text.size(), kWhere, path.string());
}

LikeRecipe recipe_from(const nlohmann::json& j, const fs::path& data) {
  LikeRecipe r;
  r.name = j.at("name");
  r.family = j.at("family");
  r.hub = j.at("hub");
  r.files = data / r.name;
  for (const auto& c : j.at("copy")) r.copies.push_back({c.at("to"), c.at("from")});
  for (const auto& d : j.at("depths"))
    r.depths.push_back({d.at("flag"), d.at("component"), d.at("keys"), d.at("min"), d.at("form"), d.at("unit"),
                        d.value("why", ""), d.at("words")});
  r.text_encoder_out_layers = j.value("text_encoder_out_layers", std::vector<int64_t>{});
  return r;
}

// The value at a '/' path of a config ("text_config/num_hidden_layers"); like_recipes() checked
// that every depth's keys are integers of its component's config.
nlohmann::json& at_path(nlohmann::json& config, const std::string& path) {
  return config.at(nlohmann::json::json_pointer("/" + path));
}

// A depth's values in `config` (its component's), in the order of its keys.
std::vector<int64_t> depth_values(const nlohmann::json& config, const LikeDepth& d) {
  std::vector<int64_t> values;
  for (const std::string& key : d.keys)
    values.push_back(config.at(nlohmann::json::json_pointer("/" + key)).get<int64_t>());
  return values;
}

// What like_configs relies on, checked once so that an edited recipe fails naming what is wrong:
// unique names, each depth's component a model_index entry with a config.json holding each key
// as an integer, and FLUX.2's out layers beside a --text-encoder-layers depth.
void check_recipe(const LikeRecipe& r, const std::vector<LikeRecipe>& before, const fs::path& likes) {
  for (const LikeRecipe& b : before) KILN_CHECK(b.name != r.name, kWhere, likes.string(), ": ", r.name, " twice");
  const nlohmann::json index = r.hub_json("model_index.json");
  for (const auto& [folder, entry] : index.items())  // components; other fields (is_distilled) are not arrays
    KILN_CHECK(!entry.is_array() || (entry.size() == 2 && entry[0].is_string() && entry[1].is_string()), kWhere,
               (r.files / "model_index.json").string(), ": ", folder, " must be [library, class]");
  for (const LikeDepth& d : r.depths) {
    KILN_CHECK(index.contains(d.component) && fs::exists(r.files / d.component / "config.json"), kWhere,
               likes.string(), ": ", r.name, " ", d.flag, ": no component '", d.component, "' with a config.json");
    const nlohmann::json config = r.hub_json(d.component + "/config.json");
    for (const std::string& key : d.keys) {
      const nlohmann::json::json_pointer at("/" + key);
      KILN_CHECK(config.contains(at) && config.at(at).is_number_integer(), kWhere, likes.string(), ": ", r.name, " ",
                 d.flag, ": ", d.component, "/config.json has no integer '", key, "'");
    }
  }
  KILN_CHECK(r.text_encoder_out_layers.empty() || r.depth("--text-encoder-layers"), kWhere, likes.string(), ": ",
             r.name, ": text_encoder_out_layers needs a --text-encoder-layers depth");
}

// A depth's values as the user writes them: "19+38".
std::string plus_joined(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t v : values) {
    if (!text.empty()) text += '+';
    text += std::to_string(v);
  }
  return text;
}

// The recipe's depth `flag`, or an error that names the depths it has.
const LikeDepth& depth_of(const LikeRecipe& r, const std::string& flag, const char* where) {
  if (const LikeDepth* d = r.depth(flag)) return *d;
  std::string own;
  for (const LikeDepth& d : r.depths) {
    if (!own.empty()) own += ", ";
    own += d.flag;
  }
  fail(where, flag, ": ", r.name, " has no such depth (its depths are ", own, ")");
}

// `where`: "cli" for a flag's value, make-random for the library's options.
void check_depth(const LikeRecipe& r, const LikeDepth& d, const std::vector<int64_t>& values, const char* where) {
  const std::string text = plus_joined(values);
  KILN_CHECK(values.size() == d.keys.size(), where, d.flag, " ", text, ": ", r.name, " takes ", d.form);
  for (int64_t v : values) {
    KILN_CHECK(v >= d.min, where, d.flag, " ", text, ": ", r.name, " needs at least ", d.min, " ", d.unit,
               d.why.empty() ? "" : " (" + d.why + ")");
    KILN_CHECK(v <= kMaxRandomLayers, where, d.flag, " ", text, ": at most ", kMaxRandomLayers, " ", d.unit, "s",
               values.size() > 1 ? " each" : "");
  }
}

// SD3.5's dual-attention blocks are the first 13; a shallower transformer keeps those it has.
void keep_blocks_below_depth(nlohmann::json& config) {
  if (!config.contains("dual_attention_layers") || !config.contains("num_layers")) return;
  nlohmann::json kept = nlohmann::json::array();
  for (const auto& i : config.at("dual_attention_layers"))
    if (i.is_number_integer() && i.get<int64_t>() < config.at("num_layers").get<int64_t>()) kept.push_back(i);
  config["dual_attention_layers"] = kept;
}

}  // namespace

const LikeDepth* LikeRecipe::depth(const std::string& flag) const {
  for (const LikeDepth& d : depths)
    if (d.flag == flag) return &d;
  return nullptr;
}

nlohmann::json LikeRecipe::hub_json(const std::string& path) const {
  return read_json(files / path);
}

const std::vector<LikeRecipe>& like_recipes() {
  static const std::vector<LikeRecipe> recipes = [] {
    const fs::path data = io::kiln_data_dir() / "make_random";
    const fs::path likes_file = data / "likes.json";
    const nlohmann::json likes = read_json(likes_file);
    KILN_CHECK(likes.contains("likes") && likes["likes"].is_array(), kWhere, likes_file.string(),
               ": expected {\"likes\": [...]}");
    std::vector<LikeRecipe> out;
    for (size_t i = 0; i < likes["likes"].size(); ++i) {
      try {
        LikeRecipe r = recipe_from(likes["likes"][i], data);
        check_recipe(r, out, likes_file);
        out.push_back(std::move(r));
      } catch (const nlohmann::json::exception& e) {
        fail(kWhere, likes_file.string(), ": likes[", i, "]: ", e.what());
      }
    }
    return out;
  }();
  return recipes;
}

const LikeRecipe& like_recipe(const std::string& name) {
  for (const LikeRecipe& r : like_recipes())
    if (r.name == name) return r;
  fail(kWhere, "--like ", name, ": expected ", like_names_by_family());
}

bool is_like_name(const std::string& name) {
  for (const LikeRecipe& r : like_recipes())
    if (r.name == name) return true;
  return false;
}

std::string like_hub_repo(const std::string& name) {
  for (const LikeRecipe& r : like_recipes())
    if (r.name == name) return r.hub;
  return "";
}

std::string like_names_joined(const std::string& separator) {
  std::string out;
  for (const LikeRecipe& r : like_recipes()) {
    if (!out.empty()) out += separator;
    out += r.name;
  }
  return out;
}

std::string like_names_by_family() {
  std::string out;
  const std::vector<LikeRecipe>& all = like_recipes();
  for (size_t i = 0; i < all.size(); ++i) {
    const bool first = i == 0 || all[i - 1].family != all[i].family;
    const bool last = i + 1 == all.size() || all[i + 1].family != all[i].family;
    out += first ? (i == 0 ? "" : ", ") : last ? " or " : ", ";
    out += all[i].name;
    if (last) out += " (" + all[i].family + ")";
  }
  return out;
}

std::vector<int64_t> parse_like_depth(const LikeRecipe& r, const std::string& flag, const std::string& value) {
  const LikeDepth* d = &depth_of(r, flag, "cli");
  // The Hub's depths, as an example.
  const std::string example = plus_joined(depth_values(r.hub_json(d->component + "/config.json"), *d));
  std::vector<int64_t> values;
  for (size_t start = 0;;) {
    const size_t plus = value.find('+', start);
    const std::string part = value.substr(start, plus - start);
    KILN_CHECK(!part.empty() && part.size() <= 9 && part.find_first_not_of("0123456789") == std::string::npos &&
                   values.size() < d->keys.size(),
               "cli", flag, " ", value, ": expected ", d->form, " of ", r.name, " (e.g. ", example, ")");
    values.push_back(std::stoll(part));
    if (plus == std::string::npos) break;
    start = plus + 1;
  }
  KILN_CHECK(values.size() == d->keys.size(), "cli", flag, " ", value, ": expected ", d->form, " of ", r.name,
             " (e.g. ", example, ")");
  check_depth(r, *d, values, "cli");
  return values;
}

std::map<std::string, nlohmann::json> like_configs(const RandomLikeOptions& o) {
  const LikeRecipe& r = like_recipe(o.like);
  KILN_CHECK(is_floating(o.dtype), kWhere, "weights are f32, bf16 or f16, not ", dtype_name(o.dtype));
  for (const auto& [flag, values] : o.depths) check_depth(r, depth_of(r, flag, kWhere), values, kWhere);
  std::map<std::string, nlohmann::json> configs;
  const nlohmann::json index = r.hub_json("model_index.json");
  for (const auto& [folder, entry] : index.items()) {
    if (!entry.is_array() || !fs::exists(r.files / folder / "config.json")) continue;
    nlohmann::json config = r.hub_json(folder + "/config.json");
    if (config.contains("torch_dtype")) config["torch_dtype"] = torch_dtype_name(o.dtype);
    for (const LikeDepth& d : r.depths) {
      const auto values = o.depths.find(d.flag);
      if (d.component != folder || values == o.depths.end()) continue;
      for (size_t i = 0; i < d.keys.size(); ++i) at_path(config, d.keys[i]) = values->second[i];
      keep_blocks_below_depth(config);
    }
    configs[folder] = config;
  }
  return configs;
}

namespace {

RandomComponent component(const nlohmann::json& index, const std::string& folder, const nlohmann::json& config) {
  const bool diffusers = index[folder][0] == "diffusers";
  return {folder, config, diffusers ? "diffusion_pytorch_model" : "model",
          diffusers ? kDiffusersShardBytes : kTransformersShardBytes, component_tensors(folder, config)};
}

}  // namespace

std::vector<RandomComponent> like_components(const RandomLikeOptions& o) {
  const nlohmann::json index = like_recipe(o.like).hub_json("model_index.json");
  std::vector<RandomComponent> out;
  for (const auto& [folder, config] : like_configs(o)) out.push_back(component(index, folder, config));
  return out;
}

RandomComponent like_component(const RandomLikeOptions& o, const std::string& folder) {
  const std::map<std::string, nlohmann::json> configs = like_configs(o);
  KILN_CHECK(configs.count(folder), kWhere, o.like, " has no weight component '", folder, "'");
  return component(like_recipe(o.like).hub_json("model_index.json"), folder, configs.at(folder));
}

RandomFolderContents like_contents(const RandomLikeOptions& o, const fs::path& fixtures) {
  const LikeRecipe& r = like_recipe(o.like);
  RandomFolderContents contents;
  contents.components = like_components(o);
  contents.dtype = o.dtype;
  contents.seed = o.seed;
  contents.layout_only = o.layout_only;
  for (const LikeCopy& c : r.copies) {
    KILN_CHECK(fs::is_directory(fixtures / c.from), kWhere, "tokenizer folder ", (fixtures / c.from).string(),
               " is missing (make-random copies the bundled checkpoint's tokenizers)");
    contents.copied_folders.emplace_back(fixtures / c.from, c.to);
  }
  // The Hub's other files (model_index.json, the scheduler's config, edited tokenizer files) as they are.
  for (const auto& e : fs::recursive_directory_iterator(r.files)) {
    const std::string path = fs::relative(e.path(), r.files).generic_string();
    if (e.is_regular_file() && !path.ends_with("/config.json"))
      contents.text_files.emplace_back(path, read_text(e.path()));
  }
  return contents;
}

std::vector<int64_t> like_depth(const RandomLikeOptions& o, const LikeDepth& d) {
  return depth_values(like_configs(o).at(d.component), d);
}

std::string like_summary(const RandomLikeOptions& o) {
  const std::map<std::string, nlohmann::json> configs = like_configs(o);  // read once for every depth
  std::string out;
  for (const LikeDepth& d : like_recipe(o.like).depths) {
    if (!out.empty()) out += ", ";
    const nlohmann::json& config = configs.at(d.component);
    out += plus_joined(depth_values(config, d)) + " " + d.words;
    if (config.contains("dual_attention_layers"))
      out += " (" + std::to_string(config["dual_attention_layers"].size()) + " with dual attention)";
  }
  return out;
}

}  // namespace kiln::random_weights
