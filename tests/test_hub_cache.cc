// The Hugging Face hub cache layout (~/.cache/huggingface/hub/models--org--name: refs/main,
// snapshots/REV/ whose files are all relative symlinks into ../../blobs/, sharded transformer
// and T5 as FLUX.1 ships them) loads, giving exactly the plain folder's latents and image; and
// the naming rule (io/relative_name.h) for shard names, model_index component names and
// refs/main.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "call_args.h"
#include "golden.h"
#include "io/model_folder.h"
#include "io/relative_name.h"
#include "io/safetensors.h"
#include "pipelines/flux_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// A fresh scratch folder per test, removed afterwards.
class HubCacheTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& ch : name)
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    dir_ = fs::temp_directory_path() / ("kiln_hub_cache_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

void edit_json(const fs::path& file, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(read_bytes(file));
  edit(j);
  write_bytes(file, j.dump(2));
}

// Builds a hub cache repo folder the way huggingface_hub lays one out.
class HubRepo {
 public:
  HubRepo(fs::path repo, std::string rev) : repo_(std::move(repo)), rev_(std::move(rev)) {
    fs::create_directories(repo_ / "blobs");
    fs::create_directories(snapshot());
    fs::create_directories(repo_ / "refs");
    write_bytes(repo_ / "refs" / "main", rev_);  // the hub writes it without a newline
  }
  const fs::path& repo() const { return repo_; }
  fs::path snapshot() const { return repo_ / "snapshots" / rev_; }

  // snapshot/rel as a relative symlink to a blob holding `bytes` (named by a content hash,
  // as the hub names blobs by their hash).
  void add(const fs::path& rel, const std::string& bytes) {
    std::ostringstream name;
    name << std::hex << std::hash<std::string>{}(bytes) << "-" << bytes.size();
    const fs::path blob = repo_ / "blobs" / name.str();
    if (!fs::exists(blob)) write_bytes(blob, bytes);
    const fs::path link = snapshot() / rel;
    fs::create_directories(link.parent_path());
    // ../../blobs/<name> from the snapshot root, ../../../blobs/<name> one folder down.
    const fs::path target = fs::relative(blob, link.parent_path());
    fs::create_symlink(target, link);
  }

  // The whole pipeline folder `from`, with `sharded` (paths relative to it) split into two
  // shards each plus an index.json, as FLUX.1 ships its transformer and T5.
  void add_pipeline(const fs::path& from, const std::vector<fs::path>& sharded) {
    for (const auto& e : fs::recursive_directory_iterator(from)) {
      if (!e.is_regular_file()) continue;
      const fs::path rel = fs::relative(e.path(), from);
      if (std::find(sharded.begin(), sharded.end(), rel) != sharded.end())
        add_sharded(rel, e.path());
      else
        add(rel, read_bytes(e.path()));
    }
  }

 private:
  // "model.safetensors" -> model-00001-of-00002.safetensors, model-00002-of-00002.safetensors
  // and model.safetensors.index.json, with the tensors (sorted by name) split in halves.
  void add_sharded(const fs::path& rel, const fs::path& file) {
    const io::SafetensorsFile src(file);
    const std::vector<std::string> names = src.names();
    const std::string stem = rel.stem().string();
    const size_t half = (names.size() + 1) / 2;
    nlohmann::json weight_map = nlohmann::json::object();
    uint64_t total = 0;
    for (int shard = 0; shard < 2; ++shard) {
      const std::string shard_name = stem + "-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
      std::vector<std::pair<std::string, Tensor>> tensors;
      for (size_t i = shard == 0 ? 0 : half; i < (shard == 0 ? half : names.size()); ++i) {
        tensors.emplace_back(names[i], src.load(names[i]));  // stored dtype, zero-copy
        weight_map[names[i]] = shard_name;
        total += src.info(names[i]).nbytes();
      }
      const fs::path tmp = repo_ / ("shard.tmp." + std::to_string(shard));
      io::save_safetensors(tmp, tensors, src.metadata());
      add(rel.parent_path() / shard_name, read_bytes(tmp));
      fs::remove(tmp);
    }
    const nlohmann::json index{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    add(rel.parent_path() / (rel.filename().string() + ".index.json"), index.dump(2));
  }

  fs::path repo_;
  std::string rev_;
};

const std::vector<fs::path> kFluxShards = {"transformer/diffusion_pytorch_model.safetensors",
                                           "text_encoder_2/model.safetensors"};
constexpr const char* kRev = "3de623fc3c33e44ffbe2bad470d0f45bccf2eb21";

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> x = to_vector(a), y = to_vector(b);
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

class HubCacheGolden : public testing::WithParamInterface<std::string>, public HubCacheTest {};

TEST_P(HubCacheGolden, RepoAndSnapshotFoldersGiveThePlainFolderImage) {
  const std::string set = GetParam();
  HubRepo hub(dir_ / "models--kiln--tiny", kRev);
  hub.add_pipeline(test::pipeline_dir(set), kFluxShards);

  // The layout is the hub's: only links in the snapshot, relative, into blobs/.
  size_t links = 0;
  for (const auto& e : fs::recursive_directory_iterator(hub.snapshot())) {
    if (e.is_directory()) continue;
    ASSERT_TRUE(e.is_symlink()) << e.path();
    const std::string target = fs::read_symlink(e.path()).string();
    const bool nested = e.path().lexically_relative(hub.snapshot()).has_parent_path();
    EXPECT_EQ(target.rfind(nested ? "../../../blobs/" : "../../blobs/", 0), 0u) << e.path() << " -> " << target;
    ++links;
  }
  EXPECT_GT(links, 10u);
  EXPECT_TRUE(fs::is_symlink(hub.snapshot() / "transformer" / "diffusion_pytorch_model-00002-of-00002.safetensors"));
  EXPECT_FALSE(fs::exists(hub.snapshot() / "transformer" / "diffusion_pytorch_model.safetensors"));
  EXPECT_TRUE(fs::is_symlink(hub.snapshot() / "text_encoder_2" / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(hub.snapshot() / "text_encoder_2" / "model.safetensors"));

  PipelineCallArgs args = test::fixture_call_args(set);
  args.latents = test::golden(set, "latents.initial_packed");
  const PipelineOutput plain = FluxPipeline::from_pretrained(test::pipeline_dir(set))(args);

  const FluxPipeline from_repo = FluxPipeline::from_pretrained(hub.repo());
  EXPECT_EQ(from_repo.model_dir(), hub.snapshot());
  const PipelineOutput repo_out = from_repo(args);
  EXPECT_TRUE(same_bits(repo_out.latents, plain.latents)) << set << ": latents from the repo folder";
  EXPECT_EQ(repo_out.image, plain.image) << set << ": image from the repo folder";

  const FluxPipeline from_snapshot = FluxPipeline::from_pretrained(hub.snapshot());
  EXPECT_EQ(from_snapshot.model_dir(), hub.snapshot());
  const PipelineOutput snapshot_out = from_snapshot(args);
  EXPECT_TRUE(same_bits(snapshot_out.latents, plain.latents)) << set << ": latents from the snapshot folder";
  EXPECT_EQ(snapshot_out.image, plain.image) << set << ": image from the snapshot folder";
}

INSTANTIATE_TEST_SUITE_P(HubCacheFixtures, HubCacheGolden, testing::Values("flux1_tiny", "flux1_tiny_arch"));

// ---- the naming rule ------------------------------------------------------------------------

TEST(HubCacheNames, RelativeNameRule) {
  EXPECT_EQ(io::relative_name_problem("model-00001-of-00002.safetensors"), "");
  EXPECT_EQ(io::relative_name_problem("shards/s.safetensors"), "");
  EXPECT_EQ(io::relative_name_problem("./transformer"), "");
  EXPECT_EQ(io::relative_name_problem("a..b"), "");
  EXPECT_EQ(io::relative_name_problem(""), "is empty");
  EXPECT_EQ(io::relative_name_problem("."), "names the folder itself");
  EXPECT_EQ(io::relative_name_problem("../x"), "contains a '..' component");
  EXPECT_EQ(io::relative_name_problem("a/../../x"), "contains a '..' component");
  EXPECT_EQ(io::relative_name_problem("a/.."), "contains a '..' component");
  EXPECT_EQ(io::relative_name_problem("/etc/passwd"), "is an absolute path");
  EXPECT_EQ(io::relative_name_problem(std::string("a\0b", 3)), "holds a NUL character");
}

class HubCacheIndex : public HubCacheTest {
 protected:
  void SetUp() override {
    HubCacheTest::SetUp();
    io::save_safetensors(dir_ / "outside.safetensors", {{"a", from_vector({1, 2, 3, 4}, {2, 2})}});
    fs::create_directories(dir_ / "m");
  }
  fs::path index(const std::string& shard) const {
    const fs::path p = dir_ / "m" / "model.safetensors.index.json";
    write_bytes(p, nlohmann::json{{"weight_map", {{"a", shard}}}}.dump());
    return p;
  }
};

TEST_F(HubCacheIndex, ShardNamesFollowTheRule) {
  test::expect_error([&] { io::SafetensorsIndex i(index("../outside.safetensors")); },
                     {"[safetensors]", "model.safetensors.index.json", "weight_map entry for tensor 'a'",
                      "shard '../outside.safetensors'", "contains a '..' component", "a shard file inside"});
  const std::string abs = (dir_ / "outside.safetensors").string();
  test::expect_error([&] { io::SafetensorsIndex i(index(abs)); },
                     {"model.safetensors.index.json", "tensor 'a'", "'" + abs + "'", "is an absolute path"});
  test::expect_error([&] { io::SafetensorsIndex i(index("")); },
                     {"model.safetensors.index.json", "tensor 'a'", "shard ''", "is empty"});
  test::expect_error([&] { io::SafetensorsIndex i(index("sub/../../outside.safetensors")); },
                     {"'sub/../../outside.safetensors'", "'..'"});
}

// Where a user's own symlink points is not the index's business: a shard behind a link out of
// the folder (absolute or relative, as the hub's links into blobs/ are) loads.
TEST_F(HubCacheIndex, ShardsBehindSymlinksOutOfTheFolderLoad) {
  fs::create_symlink("../outside.safetensors", dir_ / "m" / "rel.safetensors");
  fs::create_symlink(dir_ / "outside.safetensors", dir_ / "m" / "abs.safetensors");
  for (const char* shard : {"rel.safetensors", "abs.safetensors"}) {
    const io::SafetensorsIndex i(index(shard));
    EXPECT_EQ(to_vector(i.load("a")), (std::vector<float>{1, 2, 3, 4})) << shard;
    EXPECT_EQ(i.shard_path("a"), dir_ / "m" / shard);  // opened through the name, not resolved
  }
}

class HubCachePipeline : public HubCacheTest {
 protected:
  fs::path copy_tiny() const {
    const fs::path to = dir_ / "pipeline";
    fs::copy(test::pipeline_dir("flux1_tiny"), to, fs::copy_options::recursive);
    return to;
  }
};

TEST_F(HubCachePipeline, ComponentNamesInModelIndexFollowTheRule) {
  const fs::path m = copy_tiny();
  fs::copy(m / "vae", dir_ / "x", fs::copy_options::recursive);  // what "../x" would reach
  edit_json(m / "model_index.json", [](nlohmann::json& j) { j["../x"] = {"diffusers", "AutoencoderKL"}; });
  test::expect_error([&] { FluxPipeline::from_pretrained(m); },
                     {"[pipeline]", "model_index.json", "component '../x'", "contains a '..' component",
                      "a component folder inside"});

  edit_json(m / "model_index.json", [&](nlohmann::json& j) {
    j.erase("../x");
    j[(dir_ / "x").string()] = {"diffusers", "AutoencoderKL"};
  });
  test::expect_error([&] { FluxPipeline::from_pretrained(m); },
                     {"model_index.json", "component '" + (dir_ / "x").string() + "'", "is an absolute path"});

  edit_json(m / "model_index.json", [&](nlohmann::json& j) {
    j.erase((dir_ / "x").string());
    j[""] = {"diffusers", "AutoencoderKL"};
  });
  test::expect_error([&] { FluxPipeline::from_pretrained(m); }, {"model_index.json", "component ''", "is empty"});

  // Renaming the transformer entry to "../transformer" is caught the same way, by name.
  edit_json(m / "model_index.json", [&](nlohmann::json& j) {
    j.erase("");
    j["../transformer"] = j["transformer"];
    j.erase("transformer");
  });
  test::expect_error([&] { FluxPipeline::from_pretrained(m); }, {"component '../transformer'", "'..'"});
}

TEST_F(HubCachePipeline, APlainFolderIsItsOwnModelFolder) {
  const fs::path m = copy_tiny();
  EXPECT_EQ(io::resolve_model_folder(m), m);
  EXPECT_FALSE(io::is_hub_cache_repo(m));
  EXPECT_EQ(FluxPipeline::from_pretrained(m).model_dir(), m);
  // A missing folder comes back as it is, for the caller's own error.
  EXPECT_EQ(io::resolve_model_folder(dir_ / "nope"), dir_ / "nope");
  test::expect_error([&] { FluxPipeline::from_pretrained(dir_ / "nope"); }, {"[pipeline]", "nope", "does not exist"});
}

TEST_F(HubCachePipeline, RepoFolderErrors) {
  HubRepo hub(dir_ / "models--kiln--tiny", kRev);
  hub.add_pipeline(test::pipeline_dir("flux1_tiny"), {});
  fs::create_directories(hub.repo() / "snapshots" / "0123abcd");

  fs::remove(hub.repo() / "refs" / "main");
  EXPECT_TRUE(io::is_hub_cache_repo(hub.repo()));
  test::expect_error([&] { FluxPipeline::from_pretrained(hub.repo()); },
                     {"[model]", "models--kiln--tiny", "no refs/main",
                      "pass the snapshot folder snapshots/REV instead",
                      std::string("available: 0123abcd, ") + kRev});

  write_bytes(hub.repo() / "refs" / "main", "deadbeef\n");
  test::expect_error([&] { FluxPipeline::from_pretrained(hub.repo()); },
                     {"[model]", "refs/main", "names snapshot 'deadbeef'",
                      (hub.repo() / "snapshots" / "deadbeef").string(), "is missing",
                      std::string("available: 0123abcd, ") + kRev});

  write_bytes(hub.repo() / "refs" / "main", "../../elsewhere");
  test::expect_error([&] { io::resolve_model_folder(hub.repo()); },
                     {"[model]", "refs/main", "snapshot '../../elsewhere'", "contains a '..' component"});

  write_bytes(hub.repo() / "refs" / "main", " \n");
  test::expect_error([&] { io::resolve_model_folder(hub.repo()); }, {"refs/main", "snapshot ''", "is empty"});

  // Surrounding whitespace is stripped.
  write_bytes(hub.repo() / "refs" / "main", std::string("  ") + kRev + "\r\n");
  EXPECT_EQ(io::resolve_model_folder(hub.repo()), hub.snapshot());

  // No snapshots at all.
  const fs::path bare = dir_ / "models--kiln--bare";
  fs::create_directories(bare / "blobs");
  test::expect_error([&] { io::resolve_model_folder(bare); }, {"no refs/main", "available: none"});
}

}  // namespace
}  // namespace kiln
