// What --model takes (pipelines/model_argument.h): a Hub repo id found in the Hugging Face cache
// that HF_HOME / HF_HUB_CACHE name gives the folder's image, `kiln list` shows it, a repo not in
// the cache or partly downloaded is refused with the `hf download` command, and a single-file
// checkpoint is refused naming the flags that run it, which then give the folder's image.
#include <filesystem>
#include <fstream>

#include "call_args.h"
#include "golden.h"
#include "io/hub_cache.h"
#include "io/png.h"
#include "io/safetensors.h"
#include "models/transformer_families.h"
#include "nn/key_mapped_source.h"
#include "pipelines/flux_pipeline.h"
#include "spawn_util.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

const std::string kSet = "flux1_tiny_arch";
constexpr const char* kRev = "0123456789abcdef0123456789abcdef01234567";

class ModelArgument : public testing::Test {
 protected:
  // HF_HOME/hub/models--org--name as huggingface_hub lays it out: refs/main naming a snapshot
  // whose files link to the fixture's (the blobs, here).
  fs::path cache_repo(const std::string& repo_id, const fs::path& from) {
    fs::path repo = dir_ / "home" / "hub" / ("models--" + repo_id.substr(0, repo_id.find('/')) + "--" +
                                             repo_id.substr(repo_id.find('/') + 1));
    fs::create_directories(repo / "refs");
    std::ofstream(repo / "refs" / "main") << kRev;  // no newline, as the hub writes it
    const fs::path snapshot = repo / "snapshots" / kRev;
    for (const auto& e : fs::recursive_directory_iterator(from)) {
      if (!e.is_regular_file()) continue;
      const fs::path link = snapshot / fs::relative(e.path(), from);
      fs::create_directories(link.parent_path());
      fs::create_symlink(e.path(), link);
    }
    return snapshot;
  }

  std::pair<int, std::string> kiln(const std::string& args) {
    return test::run_command("HF_HOME=" + (dir_ / "home").string() + " HF_HUB_CACHE= " + KILN_CLI_PATH + " " + args);
  }

  test::ScopedTempDir scratch_{"model_argument"};
  const fs::path& dir_ = scratch_.path();
};

using test::ScopedEnv;

TEST(HubRepoIds, TheHubsSpellingOnly) {
  for (const char* ok : {"black-forest-labs/FLUX.1-schnell", "stabilityai/stable-diffusion-3.5-medium", "a/b",
                         "org_1/name.v2"})
    EXPECT_TRUE(io::is_repo_id(ok)) << ok;
  for (const char* bad : {"", "FLUX.1-schnell", "a/b/c", "/abs/path", "org/", "/name", "org/na--me", "org/..x",
                          "org/-x", "org/x.", "org/na me", "./model", "../x/y"})
    EXPECT_FALSE(io::is_repo_id(bad)) << bad;
  EXPECT_FALSE(io::is_repo_id("org/" + std::string(93, 'x')));  // 97 characters
}

TEST(HubRepoIds, TheCacheFolderFollowsHuggingFaceHub) {
  const ScopedEnv xdg("XDG_CACHE_HOME", "/xdg"), home("HF_HOME", nullptr), hub("HF_HUB_CACHE", nullptr);
  EXPECT_EQ(io::hub_cache_dir(), fs::path("/xdg/huggingface/hub"));
  {
    const ScopedEnv h("HF_HOME", "/hf");
    EXPECT_EQ(io::hub_cache_dir(), fs::path("/hf/hub"));
    const ScopedEnv c("HF_HUB_CACHE", "/cache");
    EXPECT_EQ(io::hub_cache_dir(), fs::path("/cache"));
    EXPECT_EQ(io::hub_repo_folder("black-forest-labs/FLUX.1-schnell"),
              fs::path("/cache/models--black-forest-labs--FLUX.1-schnell"));
  }
  const ScopedEnv no_xdg("XDG_CACHE_HOME", nullptr), user("HOME", "/home/u");
  EXPECT_EQ(io::hub_cache_dir(), fs::path("/home/u/.cache/huggingface/hub"));
}

TEST_F(ModelArgument, ARepoIdInTheCacheGivesTheFoldersImageAndIsListed) {
  const fs::path folder = test::pipeline_dir(kSet);
  cache_repo("kiln-tests/tiny-flux", folder);
  const std::string call = " --prompt 'A painting of a squirrel eating a burger' --height 64 --width 64 --steps 2 "
                           "--max-sequence-length 32 --seed 3 --out ";
  const auto plain = kiln("generate --model " + folder.string() + call + (dir_ / "plain.png").string());
  ASSERT_EQ(plain.first, 0) << plain.second;
  const auto repo = kiln("generate --model kiln-tests/tiny-flux" + call + (dir_ / "repo.png").string());
  ASSERT_EQ(repo.first, 0) << repo.second;
  EXPECT_EQ(io::read_png(dir_ / "repo.png").rgb, io::read_png(dir_ / "plain.png").rgb);

  cache_repo("kiln-tests/not-a-pipeline", folder / "vae");  // no model_index.json
  const auto list = kiln("list");
  ASSERT_EQ(list.first, 0) << list.second;
  EXPECT_NE(list.second.find((dir_ / "home" / "hub").string()), std::string::npos) << list.second;
  for (const char* line : {"kiln-tests/tiny-flux", "FluxPipeline", "runs: kiln generate --model",
                           "kiln-tests/not-a-pipeline", "no model_index.json", "1 of 2 runnable"})
    EXPECT_NE(list.second.find(line), std::string::npos) << line << "\n" << list.second;
}

// The short names make-random knows (flux1-schnell, sd3.5-medium, flux2-klein-4b, ...) stand for
// their Hub repos; the PNG records the repo id.
TEST_F(ModelArgument, AShortNameIsItsHubRepo) {
  cache_repo("black-forest-labs/FLUX.1-schnell", test::pipeline_dir(kSet));
  const fs::path png = dir_ / "short.png";
  const auto r = kiln("generate --model flux1-schnell -p cat -H 32 -W 32 --steps 1 -o " + png.string());
  ASSERT_EQ(r.first, 0) << r.second;
  std::string model;
  for (const auto& [key, value] : io::read_png(png).text)
    if (key == "model") model = value;
  EXPECT_EQ(model, "black-forest-labs/FLUX.1-schnell");
  const auto absent = kiln("generate --model sd3.5-medium -p cat -o " + (dir_ / "x.png").string());
  EXPECT_EQ(absent.first, 1);
  EXPECT_NE(absent.second.find("hf download stabilityai/stable-diffusion-3.5-medium"), std::string::npos)
      << absent.second;
}

TEST_F(ModelArgument, ARepoIdNotInTheCacheOrPartlyThereIsRefusedWithTheDownloadCommand) {
  const std::string out = (dir_ / "x.png").string();
  const auto absent = kiln("generate --prompt cat --model kiln-tests/absent --out " + out);
  EXPECT_EQ(absent.first, 1);
  for (const std::string& part :
       {std::string("[pipeline] kiln-tests/absent is not a folder here"),
        (dir_ / "home" / "hub" / "models--kiln-tests--absent").string(), std::string("kiln does not download"),
        std::string("hf download kiln-tests/absent --include \"model_index.json\" --include \"*/*\"")})
    EXPECT_NE(absent.second.find(part), std::string::npos) << part << "\n" << absent.second;

  cache_repo("kiln-tests/partial", test::pipeline_dir(kSet) / "transformer");
  const auto partial = kiln("generate --prompt cat --model kiln-tests/partial --out " + out);
  EXPECT_EQ(partial.first, 1);
  EXPECT_NE(partial.second.find("has no model_index.json: a partial download"), std::string::npos) << partial.second;
  EXPECT_NE(partial.second.find("hf download kiln-tests/partial"), std::string::npos) << partial.second;

  const auto typo = kiln("generate --prompt cat --model " + (dir_ / "nowhere").string() + " --out " + out);
  EXPECT_EQ(typo.first, 1);
  EXPECT_NE(typo.second.find("model folder " + (dir_ / "nowhere").string() + " does not exist"), std::string::npos)
      << typo.second;
  EXPECT_FALSE(fs::exists(out));
}

// ComfyUI's all-in-one layout: the transformer under model.diffusion_model. in BFL's names, the
// VAE under first_stage_model. in the LDM names, in one file.
TEST_F(ModelArgument, ASingleFileCheckpointIsRefusedNamingTheFlagsThatRunIt) {
  const fs::path folder = test::pipeline_dir(kSet);
  const fs::path transformer = dir_ / "t.safetensors", vae = dir_ / "v.safetensors", file = dir_ / "all.safetensors";
  nn::write_original_layout(*nn::open_checkpoint(folder / "transformer"), original_key_map(io::Layout::flux1_bfl),
                            transformer, "model.diffusion_model.");
  nn::write_original_layout(*nn::open_checkpoint(folder / "vae"), original_key_map(io::Layout::ldm_vae), vae,
                            "first_stage_model.");
  std::vector<std::pair<std::string, Tensor>> all;
  for (const fs::path& part : {transformer, vae}) {
    const io::SafetensorsFile f(part);
    for (const std::string& name : f.names()) all.emplace_back(name, f.load(name));
  }
  io::save_safetensors(file, all, {});

  test::expect_error([&] { (void)DiffusionPipeline::from_pretrained(file); },
                     {"[pipeline] --model " + file.string() + ": a single-file checkpoint holding a FLUX.1 "
                      "transformer and a VAE",
                      "--model black-forest-labs/FLUX.1-schnell (or another FLUX.1 folder) --transformer " +
                          file.string() + " --vae " + file.string()});
  test::expect_error([&] { (void)DiffusionPipeline::from_pretrained(folder / "vae" / "diffusion_pytorch_model.safetensors"); },
                     {"a checkpoint file, not a pipeline", "--transformer FILE, --vae FILE"});

  // What the error says to run, with the folder as --model: the folder's image.
  PipelineCallArgs args = test::fixture_call_args(kSet);
  args.latents = test::golden(kSet, "latents.initial_packed");
  PipelineOptions o;
  const PipelineOutput want = FluxPipeline::from_pretrained(folder, o)(args);
  o.component_files["transformer"] = file;
  o.component_files["vae"] = file;
  const PipelineOutput got = FluxPipeline::from_pretrained(folder, o)(args);
  EXPECT_EQ(got.image, want.image);

  const auto cli = kiln("generate --prompt cat --model " + file.string() + " --out " + (dir_ / "x.png").string());
  EXPECT_EQ(cli.first, 1);
  EXPECT_NE(cli.second.find("--transformer " + file.string() + " --vae " + file.string()), std::string::npos)
      << cli.second;
}

}  // namespace
}  // namespace kiln
