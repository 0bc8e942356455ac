// The `kiln` command line as a user runs it: the bundled generate run writes a PNG with its
// metadata and a JSON report; bad input gives one clear line, a non-zero exit and no file.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "devices/cpu/kernels/linear_gemm.h"
#include "io/png.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CliRun kiln_cli_with(const std::string& prefix, const std::string& args) {
  CliRun r;
  FILE* p = ::popen((prefix + std::string(KILN_CLI_PATH) + " " + args + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf{};
  while (p && std::fgets(buf.data(), int(buf.size()), p)) r.output += buf.data();
  const int status = p ? ::pclose(p) : -1;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

CliRun kiln_cli(const std::string& args) { return kiln_cli_with("", args); }

// With `env` ("NAME=value") set for the CLI process.
CliRun kiln_cli_env(const std::string& env, const std::string& args) { return kiln_cli_with(env + " ", args); }

std::string test_model() { return (fs::path(KILN_FIXTURES_DIR) / "flux1_tiny" / "pipeline").string(); }

class Cli : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(Cli, GenerateWithNoModelRunsTheBundledCheckpoint) {
  const fs::path png = dir_ / "out.png", report = dir_ / "run.json";
  const CliRun r = kiln_cli("generate --out " + png.string() + " --report " + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("bundled tiny FLUX.1 checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 4/4"), std::string::npos) << r.output;
  // Progress names every stage, not only the steps.
  for (const char* stage : {"kiln: loading ", "kiln: loaded in ", "kiln: encoded the prompts in ",
                            "kiln: decoded the image in "})
    EXPECT_NE(r.output.find(stage), std::string::npos) << stage << "\n" << r.output;
  const io::PngImage img = io::read_png(png);
  EXPECT_EQ(img.height, 128);
  EXPECT_EQ(img.width, 128);
  std::map<std::string, std::string> meta;
  for (const auto& [key, value] : img.text) meta[key] = value;
  EXPECT_EQ(meta["prompt"], "A painting of a squirrel eating a burger");
  EXPECT_EQ(meta["seed"], "0");
  EXPECT_EQ(meta["steps"], "4");
  EXPECT_EQ(meta["size"], "128x128");
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  for (const char* key : {"engine", "inputs", "timings", "counters", "compiles", "memory", "io"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["timings"]["steps"].size(), 4u);
  for (const char* key : {"load", "encode", "decode", "total"}) EXPECT_TRUE(j["timings"].contains(key)) << key;
  EXPECT_GT(j["counters"]["kernels_launched"].get<int64_t>(), 0);
  EXPECT_GE(j["counters"]["kernels_run"].get<int64_t>(), j["counters"]["kernels_launched"].get<int64_t>());
  EXPECT_GT(j["io"]["bytes_read"].get<int64_t>(), 0);
  // The bundled run is its fixture's call, so it writes Diffusers' image (within one level), as
  // the README tells a newcomer to check with `kiln compare`.
  const fs::path diffusers = fs::path(KILN_FIXTURES_DIR) / "flux1_tiny_arch" / "image.png";
  const CliRun same = kiln_cli("compare " + png.string() + " " + diffusers.string());
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_NE(same.output.find("; same (tolerance 1)"), std::string::npos) << same.output;
  // And a real difference is reported as one: the fixture's image against a 2-step run.
  const fs::path two = dir_ / "two.png";
  ASSERT_EQ(kiln_cli("generate --steps 2 --out " + two.string()).exit_code, 0);
  const CliRun differ = kiln_cli("compare " + two.string() + " " + diffusers.string());
  EXPECT_EQ(differ.exit_code, 1) << differ.output;
  EXPECT_NE(differ.output.find("DIFFERENT"), std::string::npos) << differ.output;
}

// --mode defer and KILN_DEFER_AND_FUSE=1 give the strict-eager PNG byte for byte, and the report
// shows the mode, the graph cache (one compile per distinct graph, the steps after the first
// hitting it) and the flushes by cause.
TEST_F(Cli, DeferredModeWritesTheSameImageAndReportsTheGraphCache) {
  const fs::path eager = dir_ / "eager.png", defer = dir_ / "defer.png", env = dir_ / "env.png";
  const fs::path report = dir_ / "defer.json", env_report = dir_ / "env.json";
  ASSERT_EQ(kiln_cli("generate --out " + eager.string()).exit_code, 0);
  const CliRun r = kiln_cli("generate --mode defer --out " + defer.string() + " --report " + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string env_cmd = "KILN_DEFER_AND_FUSE=1 " + std::string(KILN_CLI_PATH) + " generate --out " +
                              env.string() + " --report " + env_report.string() + " 2>/dev/null";
  ASSERT_EQ(std::system(env_cmd.c_str()), 0);
  const auto pixels = [](const fs::path& p) { return io::read_png(p).rgb; };
  EXPECT_EQ(pixels(defer), pixels(eager));
  EXPECT_EQ(pixels(env), pixels(eager));
  for (const fs::path& file : {report, env_report}) {
    std::ifstream in(file);
    const auto j = nlohmann::json::parse(in);
    EXPECT_EQ(j["engine"]["mode"], "defer") << file;
    const auto& c = j["counters"];
    EXPECT_GT(c["graphs_compiled"].get<int64_t>(), 0) << file;
    EXPECT_GE(c["cache_hits"].get<int64_t>(), 3) << file;  // steps 2..4 of the bundled 4-step run
    EXPECT_EQ(c["flushes"]["step"].get<int64_t>(), 5) << file;  // preparation + 4 steps
    EXPECT_EQ(j["compiles"].size(), c["graphs_compiled"].get<size_t>()) << file;
  }
}

// --mode compile gives the strict-eager PNG; a second process with the same persistent cache
// (KILN_CACHE_DIR) loads the executables instead of compiling them, and `kiln warmup` fills the
// cache for a size ahead of the first run at it.
TEST_F(Cli, CompiledModeWritesTheSameImageAndAWarmCacheCompilesNothing) {
  const fs::path eager = dir_ / "eager.png", cache = dir_ / "cache";
  ASSERT_EQ(kiln_cli("generate --out " + eager.string()).exit_code, 0);
  const auto pixels = [](const fs::path& p) { return io::read_png(p).rgb; };
  const auto compiled = [&](const std::string& tag, const std::string& flags, const fs::path& reference) {
    const fs::path png = dir_ / (tag + ".png"), report = dir_ / (tag + ".json");
    const CliRun r = kiln_cli_env("KILN_CACHE_DIR=" + cache.string(),
                                  "generate --mode compile " + flags + " --out " + png.string() + " --report " +
                                      report.string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(pixels(png), pixels(reference)) << tag;
    std::ifstream in(report);
    return nlohmann::json::parse(in);
  };
  for (const std::string how : {"full", "blocks"}) {
    const auto cold = compiled(how + "_cold", "--compile " + how, eager);
    const auto warm = compiled(how + "_warm", "--compile " + how, eager);
    EXPECT_EQ(cold["engine"]["mode"], "compile");
    EXPECT_EQ(cold["engine"]["compile"], how);
    const int64_t expected = how == "full" ? 1 : 2;  // one per block class
    EXPECT_EQ(cold["compiled"]["compiles"].get<int64_t>(), expected) << how;
    EXPECT_EQ(cold["compiled"]["disk_writes"].get<int64_t>(), expected) << how;
    EXPECT_EQ(warm["compiled"]["compiles"].get<int64_t>(), 0) << how;
    EXPECT_EQ(warm["compiled"]["disk_hits"].get<int64_t>(), expected) << how;
    EXPECT_EQ(warm["compiled"]["executables"][0]["source"], "disk") << how;
    // The transformer's multi-row linears read their weights pre-packed, each packed once (where
    // oneDNN reads packs with the plain weights' kernel).
    if (cpu::linear_packing_keeps_bits(64, 64)) {
      EXPECT_GT(cold["compiled"]["prepacked_weights"]["packed"].get<int64_t>(), 0) << how;
      EXPECT_GT(cold["compiled"]["prepacked_weights"]["reused"].get<int64_t>(), 0) << how;
      EXPECT_GT(cold["compiled"]["prepacked_weights"]["bytes"].get<int64_t>(), 0) << how;
    }
    EXPECT_EQ(cold["engine"]["prepack"], "on") << how;
  }
  // --prepack off: the same image, nothing packed.
  const auto unpacked = compiled("full_unpacked", "--prepack off", eager);
  EXPECT_EQ(unpacked["engine"]["prepack"], "off");
  EXPECT_EQ(unpacked["compiled"]["prepacked_weights"]["packed"].get<int64_t>(), 0);
  const CliRun bad = kiln_cli("generate --prepack off");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--prepack off needs --mode compile"), std::string::npos) << bad.output;
  const CliRun w = kiln_cli_env("KILN_CACHE_DIR=" + cache.string(), "warmup --sizes 96x160 --compile blocks");
  ASSERT_EQ(w.exit_code, 0) << w.output;
  EXPECT_NE(w.output.find("warmup 96x160 (blocks): 2 compiled"), std::string::npos) << w.output;
  const fs::path eager_small = dir_ / "eager_small.png";
  const std::string small = " --height 96 --width 160 --steps 2";
  ASSERT_EQ(kiln_cli("generate --out " + eager_small.string() + small).exit_code, 0);
  const auto after_warmup = compiled("warmed", "--compile blocks" + small, eager_small);
  EXPECT_EQ(after_warmup["compiled"]["compiles"].get<int64_t>(), 0);
}

// An SD3.5-architecture folder through the same command: DiffusionPipeline::from_pretrained
// picks StableDiffusion3Pipeline from model_index.json; Diffusers' image from the seed alone, the
// same PNG compiled, warmup for that class, and the SD3 arguments in the report.
TEST_F(Cli, GenerateRunsTheClassTheModelIndexNames) {
  const std::string model = (fs::path(KILN_FIXTURES_DIR) / "sd35_tiny_arch" / "pipeline").string();
  const std::string call = "generate --model " + model +
                           " --prompt 'A painting of a squirrel eating a burger' --height 128 --width 128 --steps 3"
                           " --guidance 4.5 --max-sequence-length 40 --seed 0";
  const fs::path png = dir_ / "sd35.png", report = dir_ / "sd35.json", compiled = dir_ / "sd35_compiled.png";
  const CliRun r = kiln_cli(call + " --out " + png.string() + " --report " + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = io::read_png(fs::path(KILN_FIXTURES_DIR) / "sd35_tiny_arch" / "image.png").rgb;
  const auto got = io::read_png(png).rgb;
  ASSERT_EQ(got.size(), want.size());
  int worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(int(got[i]) - int(want[i])));
  EXPECT_LE(worst, 1);
  std::ifstream in(report);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["inputs"]["pipeline"], "StableDiffusion3Pipeline");
  EXPECT_EQ(j["inputs"]["guidance"], 4.5);
  EXPECT_EQ(j["inputs"]["max_sequence_length"], 40);
  EXPECT_TRUE(j["engine"]["dtype"].contains("text_encoder_3"));
  const CliRun c = kiln_cli_env("KILN_CACHE_DIR=none", call + " --mode compile --compile blocks --out " + compiled.string());
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(io::read_png(compiled).rgb, got);
  const CliRun w = kiln_cli_env("KILN_CACHE_DIR=none", "warmup --model " + model + " --sizes 128x128 --compile full");
  ASSERT_EQ(w.exit_code, 0) << w.output;
  EXPECT_NE(w.output.find("warmup 128x128 (full): 2 compiled"), std::string::npos) << w.output;  // batch 2 and 1
  const CliRun bad = kiln_cli(call + " --slg-layers 5 --out " + (dir_ / "bad.png").string());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("skip_guidance_layers: layer 5"), std::string::npos) << bad.output;
  EXPECT_FALSE(fs::exists(dir_ / "bad.png"));
}

// --offload model under a device budget too small for every component at once: the same PNG,
// one component on the device at a time (the report's event log), the peak within the budget.
TEST_F(Cli, ModelOffloadFitsABudgetThatAllWeightsOnTheDeviceDoNot) {
  const fs::path eager = dir_ / "eager.png", png = dir_ / "offload.png", report = dir_ / "offload.json";
  ASSERT_EQ(kiln_cli("generate --out " + eager.string()).exit_code, 0);
  const CliRun r = kiln_cli("generate --offload model --device-memory 21MiB --out " + png.string() + " --report " +
                            report.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(io::read_png(png).rgb, io::read_png(eager).rgb);
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["offload"]["placement"], "model offload");
  EXPECT_EQ(j["offload"]["events"].size(), 8u);  // four onloads, four offloads
  int resident = 0, most = 0;
  for (const auto& e : j["offload"]["events"]) {
    resident += e["action"] == "onload" ? 1 : -1;
    most = std::max(most, resident);
  }
  EXPECT_EQ(most, 1);
  EXPECT_EQ(resident, 0);
  EXPECT_LE(j["memory"]["device_peak_bytes"].get<int64_t>(), 21 << 20);
}

// kiln convert writes the transformer quantized as --quantize holds it: the GGUF (Diffusers or
// original BFL names) passed with --transformer gives the PNG that quantizing at load gives.
TEST_F(Cli, ConvertWritesTheTransformerThatQuantizingAtLoadHolds) {
  const std::string model = (fs::path(KILN_FIXTURES_DIR) / "flux1_tiny_arch" / "pipeline").string();
  const std::string call =
      "generate --model " + model + " --prompt 'a red fox' --dtype bf16 --height 64 --width 64 --steps 2 --seed 1";
  const fs::path want = dir_ / "quantize.png";
  const CliRun q = kiln_cli(call + " --quantize q8_0 --out " + want.string());
  ASSERT_EQ(q.exit_code, 0) << q.output;
  for (const std::string layout : {"diffusers", "original"}) {
    const fs::path gguf = dir_ / (layout + ".gguf"), png = dir_ / (layout + ".png");
    const CliRun c = kiln_cli("convert --model " + model + " --dtype bf16 --quantize q8_0 --layout " + layout +
                              " --out " + gguf.string());
    ASSERT_EQ(c.exit_code, 0) << c.output;
    EXPECT_NE(c.output.find("in q8_0)"), std::string::npos) << c.output;
    const CliRun g = kiln_cli(call + " --transformer " + gguf.string() + " --out " + png.string());
    ASSERT_EQ(g.exit_code, 0) << g.output;
    EXPECT_EQ(io::read_png(png).rgb, io::read_png(want).rgb) << layout;
  }
  // The file's Q8_0 is not requantized to another type: refused before loading, no PNG.
  const fs::path requantized = dir_ / "requantized.png";
  const CliRun r = kiln_cli(call + " --transformer " + (dir_ / "diffusers.gguf").string() +
                            " --quantize q4_0 --out " + requantized.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--quantize q4_0 for transformer"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("already stores weights quantized as q8_0"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(requantized));
  const fs::path bad = dir_ / "bad.gguf";
  const CliRun b = kiln_cli("convert --model " + model + " --out " + bad.string());
  EXPECT_NE(b.exit_code, 0);
  EXPECT_NE(b.output.find("convert needs --quantize"), std::string::npos) << b.output;
  EXPECT_FALSE(fs::exists(bad));
}

TEST_F(Cli, BadInputGivesOneClearLineAndNoFile) {
  const fs::path png = dir_ / "out.png";
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"generate --out " + (dir_ / "missing" / "x.png").string(), "cannot write"},
      {"generate --steps 0 --out " + png.string(), "--steps must be at least 1, got 0"},
      {"generate --steps many --out " + png.string(), "flag --steps expects an integer, got 'many'"},
      {"generate --prompt cat --model " + (dir_ / "nowhere").string() + " --out " + png.string(), "does not exist"},
      {"generate --bogus 1", "unknown flag '--bogus'"},
      {"generate --device cuda:0 --out " + png.string(), "[device] cuda:0 is not available"},
      {"generate --max-sequence-length 600 --out " + png.string(), "--max-sequence-length must be at most 512, got 600"},
      {"generate --height 8 --out " + png.string(), "--height must be at least 16, got 8"},
      {"generate --model " + test_model() + " --out " + png.string(), "--prompt is required with --model"},
      {"generate --mode fast --out " + png.string(), "--mode fast: expected eager"},
      {"generate --mode compile --compile fast --out " + png.string(), "--compile fast: expected full"},
      {"generate --compile blocks --out " + png.string(), "--compile blocks needs --mode compile"},
      {"warmup", "warmup needs --sizes"},
      {"generate --offload fast --out " + png.string(), "--offload fast: expected none"},
      {"generate --device-memory lots --out " + png.string(), "--device-memory expects a size"},
      {"generate --offload none --vae-tiling off --device-memory 18MiB --out " + png.string(), "--offload model"},
      {"generate --vae-tiling sometimes --out " + png.string(), "--vae-tiling sometimes: expected auto"},
      {"generate --vae-tiling off --vae-tile-size 256 --out " + png.string(), "--vae-tile-size has no effect"},
      {"generate --profile --out " + png.string(), "--profile adds to the report: it needs --report FILE"},
      {"warmup --sizes 512", "--sizes expects HEIGHTxWIDTH"},
      {"warmup --sizes 8x8", "smaller than 16x16"},
      {"generate --dtype int8 --out " + png.string(), "--dtype int8: 'int8' is not a dtype; expected auto, bf16"},
      {"generate --dtype bf16,unet=f32 --out " + png.string(), "unknown component 'unet'"},
      {"generate --dtype vae=f32,bf16 --out " + png.string(), "only the first entry may be a plain dtype"},
      {"generate --dtype \"\" --out " + png.string(), "--dtype \"\": expected auto, bf16"},
  };
  for (const Case& c : cases) {
    const CliRun r = kiln_cli(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(png)) << c.args;
  }
}

// The spellings users bring from other tools: short flags (stable-diffusion.cpp's -p -n -H -W -s,
// -o), Diffusers' argument names, ggml's Q8_0; --seed random recorded in the PNG so the image can
// be made again; and a mistyped flag answered with the flag it most likely meant.
TEST_F(Cli, FlagsUsersKnowGiveTheSameImageAsKilnsOwn) {
  const fs::path own = dir_ / "own.png", short_flags = dir_ / "short.png", random = dir_ / "random.png",
                 again = dir_ / "again.png";
  const CliRun a = kiln_cli("generate --prompt cat --negative-prompt dog --height 64 --width 80 --seed 7 --steps 2 "
                            "--guidance 2.5 --quantize q8_0 --out " + own.string());
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const CliRun b = kiln_cli("generate -p cat -n dog -H 64 -W 80 -s 7 --num-inference-steps 2 --guidance-scale 2.5 "
                            "--quantize Q8_0 -o " + short_flags.string());
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(io::read_png(short_flags).rgb, io::read_png(own).rgb);
  EXPECT_EQ(io::read_png(short_flags).width, 80);

  const CliRun r = kiln_cli("generate -p cat -H 64 -W 64 --steps 2 --seed random --output " + random.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string seed;
  for (const auto& [key, value] : io::read_png(random).text)
    if (key == "seed") seed = value;
  ASSERT_FALSE(seed.empty());
  EXPECT_NE(r.output.find("--seed random: " + seed), std::string::npos) << r.output;
  const CliRun s = kiln_cli("generate -p cat -H 64 -W 64 --steps 2 --seed " + seed + " --output " + again.string());
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(io::read_png(again).rgb, io::read_png(random).rgb);

  const std::pair<std::string, std::string> typos[] = {
      {"generate --step 3", "unknown flag '--step' for generate (did you mean --steps? see kiln generate --help)"},
      {"generate -steps 3", "did you mean --steps?"},
      {"generate --guidence 3", "did you mean --guidance?"},
      {"serve --prot 8000", "unknown flag '--prot' for serve (did you mean --port?"},
      {"generate --xyzzy 1", "unknown flag '--xyzzy' for generate (see kiln generate --help)"},
  };
  for (const auto& [args, message] : typos) {
    const CliRun t = kiln_cli(args);
    EXPECT_EQ(t.exit_code, 1) << args;
    EXPECT_NE(t.output.find(message), std::string::npos) << args << "\n" << t.output;
  }
}

// A step-distilled checkpoint (FLUX.1-schnell's architecture: no guidance embedder; FLUX.2 klein
// with is_distilled) runs 4 steps unless --steps says otherwise, and says so; FLUX.2-dev (guidance-
// distilled, not step-distilled) and SD3 keep Diffusers' 28.
TEST_F(Cli, StepDistilledCheckpointsDefaultToFourSteps) {
  const auto steps_of = [](const fs::path& png) {
    for (const auto& [key, value] : io::read_png(png).text)
      if (key == "steps") return value;
    return std::string();
  };
  const std::string fixtures = KILN_FIXTURES_DIR;
  const CliRun schnell = kiln_cli("generate --model " + fixtures + "/flux1_tiny_arch/pipeline -p cat -H 32 -W 32 -o " +
                                  (dir_ / "schnell.png").string());
  ASSERT_EQ(schnell.exit_code, 0) << schnell.output;
  EXPECT_NE(schnell.output.find("kiln: a step-distilled checkpoint: 4 steps (--steps N to choose)"), std::string::npos)
      << schnell.output;
  EXPECT_EQ(steps_of(dir_ / "schnell.png"), "4");
  const CliRun given = kiln_cli("generate --model " + fixtures + "/flux1_tiny_arch/pipeline -p cat -H 32 -W 32 "
                                "--steps 2 -o " + (dir_ / "given.png").string());
  ASSERT_EQ(given.exit_code, 0) << given.output;
  EXPECT_EQ(given.output.find("step-distilled"), std::string::npos) << given.output;
  EXPECT_EQ(steps_of(dir_ / "given.png"), "2");

  // klein's distilled twin: the same folder with is_distilled true in model_index.json.
  const fs::path klein = dir_ / "klein_distilled";
  fs::copy(fixtures + "/flux2_klein_tiny/pipeline", klein, fs::copy_options::recursive);
  fs::copy_file(fixtures + "/flux2_klein_tiny/pipeline_distilled/model_index.json", klein / "model_index.json",
                fs::copy_options::overwrite_existing);
  const CliRun distilled = kiln_cli("generate --model " + klein.string() + " -p cat -H 32 -W 32 "
                                    "--text-encoder-out-layers 1,2,3 -o " + (dir_ / "klein.png").string());
  ASSERT_EQ(distilled.exit_code, 0) << distilled.output;
  EXPECT_EQ(steps_of(dir_ / "klein.png"), "4");

  const CliRun dev = kiln_cli("generate --model " + fixtures + "/flux2_tiny/pipeline -p cat -H 32 -W 32 "
                              "--max-sequence-length 16 --text-encoder-out-layers 1 -o " + (dir_ / "dev.png").string());
  ASSERT_EQ(dev.exit_code, 0) << dev.output;
  EXPECT_EQ(dev.output.find("step-distilled"), std::string::npos) << dev.output;
  EXPECT_EQ(steps_of(dir_ / "dev.png"), "28");
}

// On a terminal (a pseudo-terminal here, through script(1)) every phase that can take seconds on
// real checkpoints says when it starts and how long it took: each component's load (with what
// quantizing at load does), its onload under model offload, the encoders and the decode; not on
// a pipe unless --verbose, where the lines would only fill a log.
TEST_F(Cli, PhasesPrintProgressOnATerminal) {
  const CliRun tty = kiln_cli_with("script -qec \"", "generate --offload model --quantize q8_0 -o " +
                                                          (dir_ / "tty.png").string() + "\" /dev/null");
  ASSERT_EQ(tty.exit_code, 0) << tty.output;
  for (const char* line : {"kiln: loading text_encoder\r\n", "kiln: loaded text_encoder in ",
                           "kiln: loading transformer (quantizing to q8_0)", "kiln: loaded transformer in ",
                           "kiln: loaded vae in ", "kiln: encoding with text_encoder_2", "kiln: onloaded text_encoder_2 in ",
                           "kiln: onloading transformer", "kiln: onloaded transformer in ", "kiln: decoding with vae",
                           "kiln: onloaded vae in ", "] step 4/4 "})
    EXPECT_NE(tty.output.find(line), std::string::npos) << line << "\n" << tty.output;
  const CliRun pipe = kiln_cli("generate --offload model --quantize q8_0 -o " + (dir_ / "pipe.png").string());
  ASSERT_EQ(pipe.exit_code, 0) << pipe.output;
  EXPECT_EQ(pipe.output.find("kiln: loading transformer"), std::string::npos) << pipe.output;
  const CliRun verbose = kiln_cli("generate --verbose -o " + (dir_ / "verbose.png").string());
  ASSERT_EQ(verbose.exit_code, 0) << verbose.output;
  EXPECT_NE(verbose.output.find("kiln: loaded transformer in "), std::string::npos) << verbose.output;
  EXPECT_EQ(io::read_png(dir_ / "tty.png").rgb, io::read_png(dir_ / "pipe.png").rgb);
}

// --threads N reaches the threads that run the kernels (the CPU queue's worker, not only the main
// thread): the image is the one OMP_NUM_THREADS=N makes (oneDNN's reductions depend on the
// thread count, so this would differ on a machine with more cores if it did not), and the report
// says N.
TEST_F(Cli, ThreadsFlagSetsTheKernelsThreadCount) {
  const fs::path flag = dir_ / "flag.png", env = dir_ / "env.png", report = dir_ / "threads.json";
  const CliRun a = kiln_cli("generate --threads 1 -o " + flag.string() + " --report " + report.string());
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const CliRun b = kiln_cli_env("OMP_NUM_THREADS=1", "generate -o " + env.string());
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(io::read_png(flag).rgb, io::read_png(env).rgb);
  std::ifstream in(report);
  EXPECT_EQ(nlohmann::json::parse(in)["engine"]["threads"], 1);
  const CliRun bad = kiln_cli("generate --threads 0 -o " + (dir_ / "bad.png").string());
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("--threads must be in [1, 1024], got 0"), std::string::npos) << bad.output;
}

// Choices that run slowly for no reason are named: f16 on a CPU without AVX512-FP16, and a VAE
// tile given in stable-diffusion.cpp's latent units (kiln's are image pixels).
TEST_F(Cli, SlowChoicesAreWarnedAbout) {
  const CliRun f16 = kiln_cli("generate --dtype f16 -o " + (dir_ / "f16.png").string());
  ASSERT_EQ(f16.exit_code, 0) << f16.output;
  const bool warned = f16.output.find("computes in f16, which cpu:0 has no arithmetic of its own") != std::string::npos;
  EXPECT_EQ(warned, !__builtin_cpu_supports("avx512fp16")) << f16.output;
  const CliRun bf16 = kiln_cli("generate --dtype bf16 -o " + (dir_ / "bf16.png").string());
  EXPECT_EQ(bf16.output.find("warning"), std::string::npos) << bf16.output;
  const CliRun tile = kiln_cli("generate --vae-tiling on --vae-tile-size 32 -o " + (dir_ / "tile.png").string());
  ASSERT_EQ(tile.exit_code, 0) << tile.output;
  EXPECT_NE(tile.output.find("--vae-tile-size 32 is in image pixels (4 latent pixels)"), std::string::npos)
      << tile.output;
}

// --dtype: the report names each component's dtype and the bytes its weights hold, by dtype
// and place; the bundled f32 checkpoint in bf16 holds half the bytes, all bf16 (converted once
// at load: host copies), and no f32 copy of any weight.
TEST_F(Cli, DtypeIsReportedWithTheBytesItsWeightsHold) {
  const auto run = [&](const std::string& dtype) {
    const fs::path png = dir_ / (dtype + ".png"), report = dir_ / (dtype + ".json");
    const CliRun r = kiln_cli("generate --dtype " + dtype + " --out " + png.string() + " --report " + report.string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(report);
    return nlohmann::json::parse(in);
  };
  const nlohmann::json f32 = run("auto"), bf16 = run("bf16"), mixed = run("bf16,vae=f32");
  for (const char* c : {"text_encoder", "text_encoder_2", "transformer", "vae"}) {
    EXPECT_EQ(f32["engine"]["dtype"][c], "f32") << c;
    EXPECT_EQ(bf16["engine"]["dtype"][c], "bf16") << c;
  }
  EXPECT_EQ(mixed["engine"]["dtype"]["vae"], "f32");
  EXPECT_EQ(mixed["engine"]["dtype"]["transformer"], "bf16");
  const nlohmann::json &w32 = f32["memory"]["weights_bytes"], &w16 = bf16["memory"]["weights_bytes"];
  EXPECT_EQ(w16["total"].get<size_t>() * 2, w32["total"].get<size_t>());
  EXPECT_EQ(w16["by_dtype"].size(), 1u);
  EXPECT_EQ(w16["by_dtype"]["bf16"], w16["total"]);
  EXPECT_EQ(w16["by_place"]["host_copy"], w16["total"]);
  EXPECT_EQ(w32["by_place"]["mapped_file"], w32["total"]);  // stored f32: read in place
  EXPECT_GT(bf16["memory"]["estimate"]["required_bytes"].get<size_t>(), 0u);
}

// As Diffusers, a prompt longer than an encoder reads is cut with a warning naming the encoder.
TEST_F(Cli, APromptLongerThanTheEncodersReadIsCutWithAWarning) {
  const fs::path png = dir_ / "out.png";
  std::string words;
  for (int i = 0; i < 100; ++i) words += "fox ";
  const CliRun r = kiln_cli("generate --prompt '" + words + "' --max-sequence-length 16 --steps 1 --out " + png.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: the CLIP prompt is "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokens but only the first 77 are used (CLIP reads 77 tokens)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("warning: the T5 prompt is"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("only the first 16 are used (max_sequence_length is 16)"), std::string::npos) << r.output;
  const CliRun short_prompt = kiln_cli("generate --prompt 'a fox' --steps 1 --out " + png.string());
  ASSERT_EQ(short_prompt.exit_code, 0) << short_prompt.output;
  EXPECT_EQ(short_prompt.output.find("warning:"), std::string::npos) << short_prompt.output;
}

TEST_F(Cli, SizesThatAreNotMultiplesOf16AreRoundedDownWithAWarning) {
  const fs::path png = dir_ / "out.png";
  const CliRun r = kiln_cli("generate --height 100 --width 120 --steps 1 --out " + png.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: height and width must be divisible by 16; 100x120 is rounded down to 96x112"),
            std::string::npos)
      << r.output;
  // Sizes are HxW everywhere: the warning, the "wrote" line and the PNG's metadata.
  EXPECT_NE(r.output.find("(96x112, 1 steps"), std::string::npos) << r.output;
  const io::PngImage img = io::read_png(png);
  EXPECT_EQ(img.height, 96);
  EXPECT_EQ(img.width, 112);
  std::map<std::string, std::string> meta(img.text.begin(), img.text.end());
  EXPECT_EQ(meta["size"], "96x112");
}

}  // namespace
}  // namespace kiln
