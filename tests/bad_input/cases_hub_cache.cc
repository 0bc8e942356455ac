// Bad-input corpus: names in indexes and model_index (containment), Hub cache folders.
//
// The rule (src/io/relative_name.h) is about the names a checkpoint gives: a shard name in an
// index.json or a component name in model_index.json is not empty, holds no ".." component and
// is not absolute — even when the file it would reach exists. A Hugging Face hub cache repo
// folder (models--org--name) needs refs/main naming a snapshot that is there.
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "corpus.h"

namespace kiln::corpus {

namespace {

constexpr const char* kRev = "3de623fc3c33e44ffbe2bad470d0f45bccf2eb21";

// A transformer index mapping every tensor of the copy's transformer to `shard`.
void write_transformer_index(const fs::path& model, const std::string& shard) {
  const fs::path transformer = model / "transformer";
  const auto [header, data] = Corpus::read_safetensors(transformer / "diffusion_pytorch_model.safetensors");
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& [name, entry] : header.items())
    if (name != "__metadata__") weight_map[name] = shard;
  const fs::path index = transformer / "diffusion_pytorch_model.safetensors.index.json";
  std::ofstream(index) << "{}\n";
  Corpus::edit_json(index, [&](nlohmann::json& j) {
    j["metadata"] = {{"total_size", data.size()}};
    j["weight_map"] = weight_map;
  });
}

// models/NAME laid out as a hub cache repo folder: snapshots/<kRev> a copy of the tiny model,
// an empty blobs/ and refs/ (refs/main written by the caller, if at all).
fs::path hub_repo(Corpus& corpus, const std::string& name) {
  const fs::path repo = corpus.models_dir() / name;
  fs::create_directories(repo / "snapshots");
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "refs");
  corpus.copy_model(name + "/snapshots/" + kRev, corpus.tiny_model());
  return repo;
}


}  // namespace

void add_hub_cache_cases(Corpus& corpus) {
  const std::string rev = kRev;
  const char* rule = "(a relative name: not empty, no '..' component, not an absolute path)";

  // Shard names in an index: "../" out of the folder, though the file it names exists.
  {
    const fs::path m = corpus.copy_model("hub_cache_shard_dotdot", corpus.tiny_model());
    write_transformer_index(m, "../transformer/diffusion_pytorch_model.safetensors");
    corpus.add(failing("hub_cache/shard_name_dotdot", corpus.generate(m),
                     {"diffusion_pytorch_model.safetensors.index.json", "weight_map entry for tensor '",
                      "shard '../transformer/diffusion_pytorch_model.safetensors'", "contains a '..' component",
                      "a shard file inside", rule}));
    corpus.add(failing("hub_cache/shard_name_dotdot_inspect", {"inspect", "--model", m.string()},
                     {"diffusion_pytorch_model.safetensors.index.json",
                      "shard '../transformer/diffusion_pytorch_model.safetensors'", "contains a '..' component"}));
  }
  // An absolute shard name, naming the copy's own (existing) file.
  {
    const fs::path m = corpus.copy_model("hub_cache_shard_absolute", corpus.tiny_model());
    const std::string abs = fs::absolute(m / "transformer" / "diffusion_pytorch_model.safetensors").string();
    write_transformer_index(m, abs);
    corpus.add(failing("hub_cache/shard_name_absolute", corpus.generate(m),
                     {"diffusion_pytorch_model.safetensors.index.json", "shard '" + abs + "'", "is an absolute path",
                      rule}));
  }
  // An empty shard name.
  {
    const fs::path m = corpus.copy_model("hub_cache_shard_empty", corpus.tiny_model());
    write_transformer_index(m, "");
    corpus.add(failing("hub_cache/shard_name_empty", corpus.generate(m),
                     {"diffusion_pytorch_model.safetensors.index.json", "shard ''", "is empty"}));
  }

  // A component name "../transformer" in model_index.json (models/transformer does not exist;
  // the name is refused before any folder is looked at).
  {
    const fs::path m = corpus.copy_model("hub_cache_component_dotdot", corpus.tiny_model());
    Corpus::edit_json(m / "model_index.json", [](nlohmann::json& j) {
      j["../transformer"] = j["transformer"];
      j.erase("transformer");
    });
    const std::vector<std::string> expect{"model_index.json", "component '../transformer'",
                                          "contains a '..' component", "a component folder inside", rule};
    corpus.add(failing("hub_cache/component_dotdot_generate", corpus.generate(m), expect,
                     {"is not listed"}));
    corpus.add(failing("hub_cache/component_dotdot_inspect", {"inspect", "--model", m.string()}, expect,
                     {"is missing"}));
  }
  // The same name when the folder it reaches exists (a sibling "transformer"): still refused.
  {
    fs::create_directories(corpus.models_dir() / "hub_cache_component_dotdot_present");
    const fs::path m = corpus.copy_model("hub_cache_component_dotdot_present/pipeline", corpus.tiny_model());
    fs::copy(m / "transformer", m.parent_path() / "transformer", fs::copy_options::recursive);
    Corpus::edit_json(m / "model_index.json", [](nlohmann::json& j) { j["../transformer"] = j["transformer"]; });
    corpus.add(failing("hub_cache/component_dotdot_present_inspect", {"inspect", "--model", m.string()},
                     {"model_index.json", "component '../transformer'", "contains a '..' component"}));
  }
  // An absolute component name.
  {
    const fs::path m = corpus.copy_model("hub_cache_component_absolute", corpus.tiny_model());
    const std::string abs = fs::absolute(m / "vae").string();
    Corpus::edit_json(m / "model_index.json", [&](nlohmann::json& j) { j[abs] = j["vae"]; });
    corpus.add(failing("hub_cache/component_absolute_generate", corpus.generate(m),
                     {"model_index.json", "component '" + abs + "'", "is an absolute path"}));
  }

  // A hub cache repo folder without refs/main: the snapshots there are listed.
  {
    const fs::path repo = hub_repo(corpus, "models--kiln--no-refs");
    const std::vector<std::string> expect{"[model]", repo.string(), "no refs/main",
                                          "pass the snapshot folder snapshots/REV instead", "available: " + rev};
    corpus.add(failing("hub_cache/repo_without_refs_main_generate", corpus.generate(repo), expect));
    corpus.add(failing("hub_cache/repo_without_refs_main_inspect", {"inspect", "--model", repo.string()}, expect));
    corpus.add(failing("hub_cache/repo_without_refs_main_warmup",
                     {"warmup", "--model", repo.string(), "--sizes", "32x32", "--max-sequence-length", "16"},
                     expect, {"KILN_CACHE_DIR=none"}));
  }
  // refs/main naming a snapshot that is not there.
  {
    const fs::path repo = hub_repo(corpus, "models--kiln--stale-ref");
    std::ofstream(repo / "refs" / "main") << "0000000000000000000000000000000000000000";
    const std::vector<std::string> expect{"[model]", (repo / "refs" / "main").string(),
                                          "names snapshot '0000000000000000000000000000000000000000'",
                                          (repo / "snapshots" / "0000000000000000000000000000000000000000").string(),
                                          "is missing", "available: " + rev};
    corpus.add(failing("hub_cache/refs_main_missing_snapshot_generate", corpus.generate(repo), expect));
    corpus.add(failing("hub_cache/refs_main_missing_snapshot_inspect", {"inspect", "--model", repo.string()}, expect));
  }
  // refs/main naming something out of snapshots/.
  {
    const fs::path repo = hub_repo(corpus, "models--kiln--ref-out");
    std::ofstream(repo / "refs" / "main") << "../snapshots/" << rev << "/../..\n";
    corpus.add(failing("hub_cache/refs_main_dotdot", corpus.generate(repo),
                     {"refs/main", "snapshot '../snapshots/", "contains a '..' component", "available: " + rev}));
  }
  // An empty snapshots/ with refs/main: nothing available.
  {
    const fs::path repo = corpus.models_dir() / "models--kiln--empty";
    fs::create_directories(repo / "snapshots");
    fs::create_directories(repo / "refs");
    std::ofstream(repo / "refs" / "main") << rev;
    corpus.add(failing("hub_cache/repo_with_no_snapshots", {"inspect", "--model", repo.string()},
                     {"names snapshot '" + rev + "'", "is missing", "available: none"}));
  }
}

}  // namespace kiln::corpus
