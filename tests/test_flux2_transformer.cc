// Flux2Transformer2DModel against Diffusers' own outputs (tests/fixtures/flux2_tiny, made by
// Diffusers' Flux2Pipeline): the embeddings, the three shared modulations, the RoPE tables, each
// block fed with Diffusers' inputs, the whole forward at both steps of the pipeline run; then the
// execution modes (bitwise equal), what compiles, and config/checkpoint errors.
// Tolerance: the manifest suggests "fp32: max abs err <= 1e-4"; parity is checked at 1e-5.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "exec/compile.h"
#include "exec/executable_store.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "golden.h"
#include "io/safetensors.h"
#include "models/flux2/flux2_transformer.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSet = "flux2_tiny";
constexpr double kAtol = 1e-5;

Tensor g(const std::string& key) { return test::golden(kSet, key); }
Tensor module_out(const std::string& name) { return g("transformer.step0.module." + name); }
fs::path transformer_dir() { return test::pipeline_dir(kSet) / "transformer"; }

const Flux2Transformer2DModel& fixture_model() {
  static const Flux2Transformer2DModel m = Flux2Transformer2DModel::from_pretrained(transformer_dir());
  return m;
}

struct StepInputs {
  Tensor hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids, guidance;
};
StepInputs step_inputs(int step) {
  const std::string s = "transformer.step" + std::to_string(step) + ".in.";
  return {g(s + "hidden_states"), g("transformer.in.encoder_hidden_states"), g(s + "timestep"),
          g("transformer.in.img_ids"), g("transformer.in.txt_ids"), g("transformer.in.guidance")};
}
Tensor run(const Flux2Transformer2DModel& m, const StepInputs& in) {
  return m.forward(in.hidden_states, in.encoder_hidden_states, in.timestep, in.img_ids, in.txt_ids, in.guidance);
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : to_vector(t)) m = std::max(m, double(std::fabs(v)));
  return m;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = to_vector(a), y = to_vector(b);
  return a.shape() == b.shape() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

TEST(Flux2TransformerGolden, EmbeddingsModulationsAndRope) {
  const auto& m = fixture_model();
  const StepInputs in = step_inputs(0);
  test::expect_close(m.x_embedder(in.hidden_states), module_out("x_embedder"), kAtol, 0, "x_embedder");
  test::expect_close(m.context_embedder(in.encoder_hidden_states), module_out("context_embedder"), kAtol, 0,
                     "context_embedder");
  const Tensor temb = m.time_guidance_embed(in.timestep, in.guidance);
  test::expect_close(temb, module_out("time_guidance_embed"), kAtol, 0, "time_guidance_embed (with guidance)");
  const auto mod = m.modulations(temb);
  test::expect_close(mod.img, module_out("double_stream_modulation_img"), kAtol, 0, "double_stream_modulation_img");
  test::expect_close(mod.txt, module_out("double_stream_modulation_txt"), kAtol, 0, "double_stream_modulation_txt");
  test::expect_close(mod.single, module_out("single_stream_modulation"), kAtol, 0, "single_stream_modulation");
  // Text rows first, then image rows.
  const nn::RotaryTables rope = m.pos_embed(in.img_ids, in.txt_ids);
  const Tensor cos = concat({module_out("pos_embed.txt.0"), module_out("pos_embed.img.0")}, 0);
  const Tensor sin = concat({module_out("pos_embed.txt.1"), module_out("pos_embed.img.1")}, 0);
  test::expect_close(rope.cos, cos, 1e-7, 0, "RoPE cos (4 axes, theta 2000)");
  test::expect_close(rope.sin, sin, 1e-7, 0, "RoPE sin");
}

TEST(Flux2TransformerGolden, BlocksFromDiffusersInputs) {
  const auto& m = fixture_model();
  const StepInputs in = step_inputs(0);
  const auto mod = m.modulations(module_out("time_guidance_embed"));
  const nn::RotaryTables rope = m.pos_embed(in.img_ids, in.txt_ids);
  const auto [c, x] =
      m.transformer_blocks()[0](module_out("x_embedder"), module_out("context_embedder"), mod.img, mod.txt, rope);
  test::expect_close(c, module_out("transformer_blocks.0.0"), kAtol, 0, "double block: text stream");
  test::expect_close(x, module_out("transformer_blocks.0.1"), kAtol, 0, "double block: image stream");
  const Tensor s = m.single_transformer_blocks()[0](
      concat({module_out("transformer_blocks.0.0"), module_out("transformer_blocks.0.1")}, 1), mod.single, rope);
  test::expect_close(s, module_out("single_transformer_blocks.0"), kAtol, 0, "single block");
  const int64_t L_txt = in.encoder_hidden_states.dim(1);
  const Tensor img = slice(module_out("single_transformer_blocks.0"), 1, L_txt, s.dim(1));
  test::expect_close(m.norm_out(img, module_out("time_guidance_embed")), module_out("norm_out"), kAtol, 0, "norm_out");
  test::expect_close(m.proj_out(module_out("norm_out")), module_out("proj_out"), kAtol, 0, "proj_out");
}

TEST(Flux2TransformerGolden, ForwardMatchesDiffusersAtEveryStep) {
  for (int s = 0; s < 2; ++s)
    test::expect_close(run(fixture_model(), step_inputs(s)), g("transformer.step" + std::to_string(s) + ".out"), kAtol,
                       0, "forward, step " + std::to_string(s));
}

// Diffusers: with guidance_embeds but no guidance given, only the timestep is embedded.
TEST(Flux2TransformerGolden, WithoutGuidanceOnlyTheTimestepIsEmbedded) {
  const auto& m = fixture_model();
  const StepInputs in = step_inputs(0);
  const Tensor with = m.time_guidance_embed(in.timestep, in.guidance);
  const Tensor without = m.time_guidance_embed(in.timestep, std::nullopt);
  const Tensor zero_guidance_part = m.time_guidance_embed(in.timestep, in.guidance) - without;
  EXPECT_FALSE(same_bits(with, without));
  EXPECT_GT(max_abs(zero_guidance_part), 1e-3) << "the guidance embedder contributes when guidance is given";
}

// ---- execution modes and what compiles ----

class Flux2Compiled : public testing::Test {
 protected:
  void SetUp() override {
    clear_executable_cache();
    reset_compile_stats();
    set_executable_cache_dir({});
  }
  void TearDown() override { set_executable_cache_dir({}); }
};

CompileOptions fullgraph() {
  CompileOptions o;
  o.fullgraph = true;
  return o;
}

// The fixture's checkpoint with its one double and one single block repeated `copies` times
// (and a config saying so): blocks of one class share one structure.
fs::path repeated_blocks_model(int copies) {
  const fs::path dir =
      fs::temp_directory_path() / ("kiln_flux2_blocks_" + std::to_string(copies) + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const io::SafetensorsFile file(transformer_dir() / "diffusion_pytorch_model.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& name : file.names()) {
    const Tensor t = file.load(name);
    for (const std::string prefix : {"transformer_blocks.0.", "single_transformer_blocks.0."}) {
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string stem = prefix.substr(0, prefix.size() - 2);
      for (int i = 1; i < copies; ++i)
        tensors.emplace_back(stem + std::to_string(i) + "." + name.substr(prefix.size()), t * double(1 + i));
    }
    tensors.emplace_back(name, t);
  }
  io::save_safetensors(dir / "diffusion_pytorch_model.safetensors", tensors);
  std::ifstream in(transformer_dir() / "config.json");
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const std::string key : {"\"num_layers\": 1", "\"num_single_layers\": 1"}) {
    const size_t at = config.find(key);
    EXPECT_NE(at, std::string::npos) << key;
    config.replace(at, key.size(), key.substr(0, key.size() - 1) + std::to_string(copies));
  }
  std::ofstream(dir / "config.json") << config;
  return dir;
}

TEST_F(Flux2Compiled, AllModesGiveTheStrictEagerBits) {
  const fs::path dir = repeated_blocks_model(2);
  const Flux2Transformer2DModel eager_model = Flux2Transformer2DModel::from_pretrained(dir);
  std::vector<Tensor> want;
  for (int s = 0; s < 2; ++s) want.push_back(run(eager_model, step_inputs(s)));
  Flux2Transformer2DModel whole = eager_model, blocks = eager_model;  // copies share the weights
  whole.compile(fullgraph());
  blocks.compile_repeated_blocks(fullgraph());
  EXPECT_TRUE(whole.is_compiled());
  EXPECT_FALSE(blocks.is_compiled()) << "regional compile leaves forward itself eager";
  for (const std::string mode : {"defer", "whole", "blocks", "blocks+defer"}) {
    const Flux2Transformer2DModel& m = mode == "whole" ? whole : mode == "defer" ? eager_model : blocks;
    EagerModeGuard guard(mode == "defer" || mode == "blocks+defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
    for (int s = 0; s < 2; ++s)
      EXPECT_TRUE(same_bits(run(m, step_inputs(s)), want[size_t(s)])) << mode << " step " << s;
  }
  EXPECT_EQ(compile_stats().eager_fallbacks, 0u);
  fs::remove_all(dir);
}

TEST_F(Flux2Compiled, RepeatedBlocksCompileOncePerBlockClass) {
  const fs::path dir = repeated_blocks_model(3);
  Flux2Transformer2DModel m = Flux2Transformer2DModel::from_pretrained(dir);
  m.compile_repeated_blocks(fullgraph());
  run(m, step_inputs(0));
  const CompileStats s = compile_stats();
  EXPECT_EQ(s.compiles, 2u) << "one executable for the 3 double blocks, one for the 3 single blocks";
  for (const auto& b : m.transformer_blocks()) EXPECT_EQ(b.compiled()->name(), "Flux2TransformerBlock");
  for (const auto& b : m.single_transformer_blocks()) EXPECT_EQ(b.compiled()->name(), "Flux2SingleTransformerBlock");
  const CompileStats before = compile_stats();
  run(m, step_inputs(1));
  EXPECT_EQ(compile_stats().compiles, before.compiles) << "a second step compiles nothing";
  EXPECT_EQ(compile_stats().traces, before.traces);
  fs::remove_all(dir);
}

TEST_F(Flux2Compiled, TheWholeModelCompilesOncePerSignature) {
  Flux2Transformer2DModel m = fixture_model();
  m.compile(fullgraph());
  run(m, step_inputs(0));
  const CompileStats first = compile_stats();
  EXPECT_EQ(first.compiles, 1u);
  run(m, step_inputs(1));
  EXPECT_EQ(compile_stats().compiles, 1u) << "another timestep is a value, not a new graph";
}

// ---- class data and errors ----

TEST(Flux2Transformer, ClassDataAndParameters) {
  EXPECT_EQ(Flux2Transformer2DModel::repeated_blocks(),
            (std::vector<std::string>{"Flux2TransformerBlock", "Flux2SingleTransformerBlock"}));
  const Flux2Transformer2DModel& m = fixture_model();
  const io::SafetensorsFile file(transformer_dir() / "diffusion_pytorch_model.safetensors");
  std::vector<std::string> names;
  for (const auto& [name, t] : m.named_parameters()) names.push_back(name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, file.names()) << "every weight is read, and no other";
  // No biases anywhere.
  for (const std::string& n : names) EXPECT_EQ(n.find(".bias"), std::string::npos) << n;
}

TEST(Flux2Transformer, PlanSplitsEveryPackedBlockOnItsOwn) {
  Flux2TransformerConfig c;  // FLUX.2-dev's widths
  const auto plan = Flux2Transformer2DModel::tp_plan(c);
  const int64_t D = 6144, F = 18432;
  bool seen_qkv_mlp = false, seen_out = false;
  for (const auto& e : plan) {
    if (e.pattern == "single_transformer_blocks.*.attn.to_qkv_mlp_proj") {
      EXPECT_EQ(e.style, "packed_colwise");
      EXPECT_EQ(e.blocks, (std::vector<int64_t>{D, D, D, F, F}));
      seen_qkv_mlp = true;
    }
    if (e.pattern == "single_transformer_blocks.*.attn.to_out") {
      EXPECT_EQ(e.style, "packed_rowwise");
      EXPECT_EQ(e.blocks, (std::vector<int64_t>{D, F}));
      seen_out = true;
    }
  }
  EXPECT_TRUE(seen_qkv_mlp && seen_out);
  EXPECT_EQ(plan.size(), 14u) << "Diffusers' plan; the modulations are replicated unless sharded on request";
  EXPECT_EQ(Flux2Transformer2DModel::tp_plan(c, true).size(), 18u);
}

TEST(Flux2Transformer, ConfigAndCheckpointErrors) {
  const fs::path dir = fs::temp_directory_path() / ("kiln_flux2_bad_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(transformer_dir() / "diffusion_pytorch_model.safetensors", dir);
  std::ifstream in(transformer_dir() / "config.json");
  const std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string c = config;
    c.replace(c.find(from), from.size(), to);
    std::ofstream(dir / "config.json") << c;
  };
  with("\"guidance_embeds\": true", "\"guidance_embeds\": false");
  test::expect_error([&] { Flux2Transformer2DModel::from_pretrained(dir); },
                     {"time_guidance_embed.guidance_embedder.linear_1.weight", "guidance_embeds=false"});
  with("\"axes_dims_rope\": [\n    4,", "\"axes_dims_rope\": [\n    6,");
  test::expect_error([&] { Flux2Transformer2DModel::from_pretrained(dir); }, {"axes_dims_rope", "attention_head_dim"});
  with("\"num_layers\": 1", "\"num_layers\": 2");
  test::expect_error([&] { Flux2Transformer2DModel::from_pretrained(dir); }, {"transformer_blocks.1"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln
