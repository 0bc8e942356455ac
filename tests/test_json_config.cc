// JsonConfig: typed getters, defaults, and errors that name the file and the field.
#include "io/json_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <initializer_list>

#include "core/error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using kiln::io::JsonConfig;

namespace {

using kiln::test::expect_error;

class JsonConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kiln_cfg_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& text) const {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }

  fs::path dir_;
};

constexpr const char* kUnet = R"({
  "_class_name": "UNet2DConditionModel",
  "num_layers": 2,
  "big": 9007199254740993,
  "norm_eps": 1e-05,
  "scale": 1,
  "center_input_sample": false,
  "block_out_channels": [320, 640, 1280, 1280],
  "cross_attention_dim": null,
  "name_as_number": "2",
  "mixed": [1, "two", 3]
})";

TEST_F(JsonConfigTest, TypedGetters) {
  const JsonConfig cfg(write("config.json", kUnet));
  EXPECT_EQ(cfg.get_string("_class_name"), "UNet2DConditionModel");
  EXPECT_EQ(cfg.get_int("num_layers"), 2);
  EXPECT_EQ(cfg.get_int("big"), 9007199254740993LL);  // no detour through double
  EXPECT_DOUBLE_EQ(cfg.get_float("norm_eps"), 1e-5);
  EXPECT_DOUBLE_EQ(cfg.get_float("scale"), 1.0);  // integers are valid floats
  EXPECT_FALSE(cfg.get_bool("center_input_sample"));
  EXPECT_EQ(cfg.get_int_list("block_out_channels"), (std::vector<int64_t>{320, 640, 1280, 1280}));
  EXPECT_EQ(cfg.json()["block_out_channels"].size(), 4u);
  EXPECT_NE(cfg.source().find("config.json"), std::string::npos);
}

TEST_F(JsonConfigTest, DefaultsAndNull) {
  const JsonConfig cfg(write("config.json", kUnet));
  EXPECT_TRUE(cfg.has("num_layers"));
  EXPECT_FALSE(cfg.has("absent"));
  EXPECT_FALSE(cfg.has("cross_attention_dim"));  // null means "use the default"
  EXPECT_EQ(cfg.get_int("absent", 7), 7);
  EXPECT_EQ(cfg.get_int("cross_attention_dim", 768), 768);
  EXPECT_EQ(cfg.get_int("num_layers", 7), 2);
  EXPECT_DOUBLE_EQ(cfg.get_float("absent", 0.5), 0.5);
  EXPECT_TRUE(cfg.get_bool("absent", true));
  EXPECT_EQ(cfg.get_string("absent", "x"), "x");
  EXPECT_EQ(cfg.get_int_list("absent", {1, 2}), (std::vector<int64_t>{1, 2}));
  // A present field of the wrong type is still an error, not the fallback.
  expect_error([&] { cfg.get_int("name_as_number", 3); }, {"'name_as_number'", "a string"});
}

TEST_F(JsonConfigTest, WrongTypeNamesFileAndField) {
  const fs::path p = write("config.json", kUnet);
  const JsonConfig cfg(p);
  expect_error(
      [&] { cfg.get_int("name_as_number"); },
      {"[config] ", p.string() + ": field 'name_as_number' is a string, expected an integer"});
  expect_error([&] { cfg.get_int("norm_eps"); },
               {"field 'norm_eps' is a float, expected an integer"});
  expect_error([&] { cfg.get_bool("num_layers"); },
               {"field 'num_layers' is an integer, expected a boolean"});
  expect_error([&] { cfg.get_string("block_out_channels"); },
               {"field 'block_out_channels' is an array, expected a string"});
  expect_error([&] { cfg.get_float("_class_name"); }, {"'_class_name' is a string"});
  expect_error([&] { cfg.get_int_list("num_layers"); },
               {"'num_layers' is an integer, expected a list of integers"});
  expect_error([&] { cfg.get_int_list("mixed"); },
               {"field 'mixed' element 1 is a string, expected an integer"});
}

TEST_F(JsonConfigTest, MissingFieldNamesFileAndField) {
  const fs::path p = write("config.json", kUnet);
  const JsonConfig cfg(p);
  expect_error([&] { cfg.get_int("num_heads"); }, {p.string(), "missing field 'num_heads'"});
  expect_error([&] { cfg.get_string("cross_attention_dim"); },
               {"missing field 'cross_attention_dim'"});
}

TEST_F(JsonConfigTest, BadJsonNamesFileAndPosition) {
  const fs::path p = write("broken.json", "{\n  \"a\": 1,\n  \"b\": tru\n}");
  expect_error([&] { JsonConfig c(p); }, {"[config] ", p.string(), "bad JSON", "line 3"});
  expect_error([&] { JsonConfig c(write("array.json", "[1]")); },
               {"array.json", "top level is an array, expected an object"});
  expect_error([&] { JsonConfig c(write("empty.json", "")); }, {"empty.json", "bad JSON"});
}

TEST_F(JsonConfigTest, MissingFileNamesPath) {
  expect_error([&] { JsonConfig c(dir_ / "nope" / "config.json"); },
               {"[config] ", (dir_ / "nope" / "config.json").string(), "not found"});
}

TEST_F(JsonConfigTest, FromString) {
  const JsonConfig cfg = JsonConfig::from_string(R"({"steps": 50})", "scheduler config");
  EXPECT_EQ(cfg.get_int("steps"), 50);
  expect_error([&] { cfg.get_bool("steps"); }, {"scheduler config: field 'steps'"});
  expect_error([&] { JsonConfig::from_string("{,}", "inline"); },
               {"inline: bad JSON at line 1, column 2"});
}

}  // namespace

namespace {

TEST(JsonConfigStringList, ReadsListsAndNamesWrongElements) {
  const JsonConfig cfg = JsonConfig::from_string(R"({"up": ["A", "B"], "mixed": ["A", 3], "one": "A"})", "vae config");
  EXPECT_EQ(cfg.get_string_list("up"), (std::vector<std::string>{"A", "B"}));
  EXPECT_EQ(cfg.get_string_list("absent", {"X"}), (std::vector<std::string>{"X"}));
  expect_error([&] { cfg.get_string_list("mixed"); }, {"vae config", "'mixed' element 1", "expected a string"});
  expect_error([&] { cfg.get_string_list("one"); }, {"vae config", "'one'", "expected a list of strings"});
}

}  // namespace
