// An image made again from its PNG (kiln generate --from-png): the "kiln" chunk records the
// pipeline class, the model's name, every call argument after the pipeline's defaults and the
// load options that change the image, so an SD3.5 and a FLUX.2 klein image come back byte for
// byte (the whole file: pixels and metadata); a flag given beside it overrides what it
// recorded; the AUTOMATIC1111 "parameters" chunk other tools read says the same; a PNG without
// the chunk is refused naming it.
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "io/png.h"
#include "spawn_util.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class FromPng : public testing::Test {
 protected:
  // The CLI run in the fixture's folder, whose model is "pipeline" there: the name the PNG
  // records (never a path of this machine) is one --model takes in that folder.
  static std::pair<int, std::string> kiln_in(const std::string& fixture, const std::string& args) {
    return test::run_command("cd " + (fs::path(KILN_FIXTURES_DIR) / fixture).string() + " && " + KILN_CLI_PATH +
                             " generate " + args);
  }
  static std::map<std::string, std::string> text(const fs::path& png) {
    std::map<std::string, std::string> out;
    for (const auto& [key, value] : io::read_png(png).text) out[key] = value;
    return out;
  }
  test::ScopedTempDir scratch_{"from_png"};
  const fs::path& dir_ = scratch_.path();
};

TEST_F(FromPng, AnSd35ImageComesBackByteForByte) {
  const fs::path first = dir_ / "sd35.png", again = dir_ / "again.png", other = dir_ / "other.png";
  const auto made = kiln_in("sd35_tiny_arch", "--model pipeline -p 'a fox' -n blurry -H 64 -W 96 --steps 3 "
                                              "--guidance 5 --clip-skip 1 --slg-layers 1 --seed random "
                                              "--dtype bf16,vae=f32 -o " + first.string());
  ASSERT_EQ(made.first, 0) << made.second;
  const auto remade = kiln_in("sd35_tiny_arch", "--from-png " + first.string() + " -o " + again.string());
  ASSERT_EQ(remade.first, 0) << remade.second;
  EXPECT_EQ(test::read_text_file(again), test::read_text_file(first));  // pixels and every chunk

  const std::map<std::string, std::string> t = text(first);
  const nlohmann::json recipe = nlohmann::json::parse(t.at("kiln"));
  EXPECT_EQ(recipe["pipeline"], "StableDiffusion3Pipeline");
  EXPECT_EQ(recipe["model"], "pipeline");
  EXPECT_EQ(recipe["dtype"], "bf16,vae=f32");
  EXPECT_EQ(recipe["call"]["clip_skip"], 1);
  EXPECT_EQ(recipe["call"]["skip_guidance_layers"], nlohmann::json::array({1}));
  EXPECT_EQ(recipe["call"]["max_sequence_length"], 256);  // the pipeline's default, recorded
  EXPECT_EQ(std::to_string(recipe["call"]["seed"].get<uint64_t>()), t.at("seed"));
  EXPECT_EQ(t.at("parameters"), "a fox\nNegative prompt: blurry\nSteps: 3, Sampler: Euler, CFG scale: 5, Seed: " +
                                    t.at("seed") + ", Size: 96x64, Model: pipeline, Version: kiln " KILN_VERSION);

  // A flag beside it overrides what it recorded; the rest stays.
  const auto changed = kiln_in("sd35_tiny_arch", "--from-png " + first.string() + " --seed 5 -o " + other.string());
  ASSERT_EQ(changed.first, 0) << changed.second;
  EXPECT_NE(io::read_png(other).rgb, io::read_png(first).rgb);
  nlohmann::json other_recipe = nlohmann::json::parse(text(other).at("kiln"));
  EXPECT_EQ(other_recipe["call"]["seed"], 5);
  other_recipe["call"].erase("seed");
  nlohmann::json first_call = recipe["call"];
  first_call.erase("seed");
  EXPECT_EQ(other_recipe["call"], first_call);
  EXPECT_EQ(other_recipe["dtype"], "bf16,vae=f32");
}

TEST_F(FromPng, AFlux2KleinImageComesBackByteForByte) {
  const fs::path first = dir_ / "klein.png", again = dir_ / "again.png";
  const auto made = kiln_in("flux2_klein_tiny", "--model pipeline -p 'a fox' -H 64 -W 80 --steps 3 --guidance 3 "
                                                "--text-encoder-out-layers 1,2,3 --max-sequence-length 32 --seed 9 "
                                                "--quantize Q8_0 -o " + first.string());
  ASSERT_EQ(made.first, 0) << made.second;
  const auto remade = kiln_in("flux2_klein_tiny", "--from-png " + first.string() + " -o " + again.string());
  ASSERT_EQ(remade.first, 0) << remade.second;
  EXPECT_EQ(test::read_text_file(again), test::read_text_file(first));
  const nlohmann::json recipe = nlohmann::json::parse(text(first).at("kiln"));
  EXPECT_EQ(recipe["pipeline"], "Flux2KleinPipeline");
  EXPECT_EQ(recipe["quantize"], "transformer=q8_0");
  EXPECT_EQ(recipe["call"]["text_encoder_out_layers"], nlohmann::json::array({1, 2, 3}));
}

TEST_F(FromPng, APngWithoutTheRecipeIsRefusedNamingIt) {
  const fs::path plain = dir_ / "plain.png";
  const uint8_t rgb[3 * 4] = {};
  io::write_png(plain, rgb, 2, 2, {{"parameters", "a fox\nSteps: 3"}});
  const auto r = kiln_in("sd35_tiny_arch", "--from-png " + plain.string() + " -o " + (dir_ / "x.png").string());
  EXPECT_EQ(r.first, 1);
  EXPECT_NE(r.second.find("--from-png " + plain.string() + ": the PNG has no 'kiln' text chunk"), std::string::npos)
      << r.second;
  io::write_png(plain, rgb, 2, 2, {{"kiln", "{\"model\": 3}"}});
  const auto bad = kiln_in("sd35_tiny_arch", "--from-png " + plain.string() + " -o " + (dir_ / "x.png").string());
  EXPECT_EQ(bad.first, 1);
  EXPECT_NE(bad.second.find("its 'kiln' chunk"), std::string::npos) << bad.second;
  EXPECT_FALSE(fs::exists(dir_ / "x.png"));
}

}  // namespace
}  // namespace kiln
