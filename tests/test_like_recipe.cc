// random_checkpoint/like_recipe.h: make-random's checkpoints are data (data/make_random), read by
// generic code. The depths a user chooses set the config keys the recipe names and nothing else,
// every other field stays the Hub's, every component's config names a model kiln builds, and a
// depth out of range is refused with the flag, the value and what was expected.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "random_checkpoint/component_reads.h"
#include "random_checkpoint/like_recipe.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
namespace rw = random_weights;

TEST(LikeRecipe, EveryRecipeHasItsHubFilesAndEveryComponentIsAModelKilnReads) {
  ASSERT_EQ(rw::like_names_joined("|"),
            "flux1-schnell|flux1-dev|sd3-medium|sd3.5-medium|flux2-dev|flux2-klein-4b|flux2-klein-9b");
  for (const rw::LikeRecipe& r : rw::like_recipes()) {
    SCOPED_TRACE(r.name);
    const nlohmann::json index = r.hub_json("model_index.json");
    EXPECT_TRUE(fs::exists(r.files / "scheduler" / "scheduler_config.json"));
    const std::map<std::string, nlohmann::json> configs = rw::like_configs({r.name});
    std::set<std::string> weighted;  // model_index.json's entries that are models
    for (const auto& [folder, entry] : index.items())
      if (entry.is_array() && folder != "scheduler" && !folder.starts_with("tokenizer")) weighted.insert(folder);
    std::set<std::string> got;
    for (const auto& [folder, config] : configs) {
      got.insert(folder);
      EXPECT_EQ(rw::config_class(config), index[folder][1]) << folder;  // the class model_index names
      EXPECT_FALSE(rw::component_tensors(folder, config).empty()) << folder;
    }
    EXPECT_EQ(got, weighted);
    for (const rw::LikeDepth& d : r.depths) EXPECT_TRUE(configs.count(d.component)) << d.flag;
    for (const rw::LikeCopy& c : r.copies) EXPECT_TRUE(fs::is_directory(fs::path(KILN_FIXTURES_DIR) / c.from));
  }
}

TEST(LikeRecipe, DepthsSetOnlyTheirKeys) {
  const rw::RandomLikeOptions hub{"sd3.5-medium"};
  const rw::RandomLikeOptions shallow{"sd3.5-medium", {{"--blocks", {5}}, {"--t5-layers", {2}}}, DType::f16};
  const auto a = rw::like_configs(hub), b = rw::like_configs(shallow);
  EXPECT_EQ(a.at("transformer")["num_layers"], 24);
  EXPECT_EQ(b.at("transformer")["num_layers"], 5);
  EXPECT_EQ(b.at("text_encoder_3")["num_layers"], 2);
  // SD3.5's dual-attention blocks are its first 13: five blocks keep five.
  EXPECT_EQ(a.at("transformer")["dual_attention_layers"].size(), 13u);
  EXPECT_EQ(b.at("transformer")["dual_attention_layers"], nlohmann::json({0, 1, 2, 3, 4}));
  EXPECT_EQ(a.at("text_encoder")["torch_dtype"], "bfloat16");
  EXPECT_EQ(b.at("text_encoder")["torch_dtype"], "float16");
  // Nothing else differs.
  for (const auto& [folder, config] : a) {
    nlohmann::json x = config, y = b.at(folder);
    for (nlohmann::json* c : {&x, &y})
      for (const char* key : {"num_layers", "dual_attention_layers", "torch_dtype"}) c->erase(key);
    EXPECT_EQ(x, y) << folder;
  }
  EXPECT_EQ(rw::like_summary(hub), "24 transformer blocks (13 with dual attention), 24 T5 layers");
  EXPECT_EQ(rw::like_summary(shallow), "5 transformer blocks (5 with dual attention), 2 T5 layers");
  // A nested key: FLUX.2-dev's text encoder depth is Mistral's text_config/num_hidden_layers.
  const rw::RandomLikeOptions dev{"flux2-dev", {{"--text-encoder-layers", {3}}}};
  EXPECT_EQ(rw::like_configs(dev).at("text_encoder")["text_config"]["num_hidden_layers"], 3);
  EXPECT_EQ(rw::like_summary(dev), "8+48 transformer blocks, 3 text encoder layers");
}

TEST(LikeRecipe, DepthsOutOfRangeNameTheFlagAndWhatWasExpected) {
  const rw::LikeRecipe& flux = rw::like_recipe("flux1-schnell");
  EXPECT_EQ(rw::parse_like_depth(flux, "--blocks", "2+3"), (std::vector<int64_t>{2, 3}));
  test::expect_error([&] { rw::parse_like_depth(flux, "--blocks", "7"); },
                     {"--blocks 7: expected D+S, the double-stream and single-stream block counts of flux1-schnell",
                      "(e.g. 19+38)"});
  test::expect_error([&] { rw::parse_like_depth(flux, "--text-encoder-layers", "2"); },
                     {"--text-encoder-layers: flux1-schnell has no such depth (its depths are --blocks, --t5-layers)"});
  test::expect_error([&] { rw::like_configs({"flux1-schnell", {{"--t5-layers", {0}}}}); },
                     {"--t5-layers 0: flux1-schnell needs at least 1 T5 layer (block 0 holds T5's position bias)"});
  test::expect_error([&] { rw::like_configs({"flux1-schnell", {{"--blocks", {1}}}}); },
                     {"--blocks 1: flux1-schnell takes D+S"});
  test::expect_error([&] { rw::like_recipe("flux3"); }, {"--like flux3: expected flux1-schnell or flux1-dev (FLUX.1)"});
}

}  // namespace
}  // namespace kiln
