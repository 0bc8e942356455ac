// SD3Transformer2DModel against Diffusers' own outputs (tests/fixtures/<set>/golden.safetensors):
// sd3_tiny (SD3: patch 1, one context_pre_only block, no QK norm) and sd35_tiny_arch (SD3.5
// Medium's architecture: patch 2, a dual-attention block then the context_pre_only block, QK
// RMSNorm, a 16×16 positional table cropped to 8×8). The embeddings, every block fed with
// Diffusers' inputs, the whole forward at every step of the pipeline run, skip_layers, the
// execution modes (bitwise equal), what compiles, config errors and the tensor-parallel plan.
// Tolerance: the manifests suggest "fp32_transformer_step: max abs err <= 1e-4"; the observed
// errors are below 1e-6, so parity is checked at 1e-5 (tensor-parallel sums at 1e-4).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "distributed/process_group.h"
#include "exec/compile.h"
#include "exec/executable_store.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "golden.h"
#include "io/safetensors.h"
#include "models/sd3/sd3_transformer.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr double kAtol = 1e-5;    // f32 parity with Diffusers, one process
constexpr double kTpAtol = 1e-4;  // fp32_transformer_step: ranks' partial sums reorder additions

std::string module_key(const std::string& name) { return "transformer.step0.module." + name; }

double max_abs_err(const Tensor& got, const Tensor& want) {
  const std::vector<float> g = to_vector(got), w = to_vector(want);
  double worst = 0;
  for (size_t i = 0; i < g.size() && i < w.size(); ++i) worst = std::max(worst, std::fabs(double(g[i]) - double(w[i])));
  return worst;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = to_vector(a), y = to_vector(b);
  return a.shape() == b.shape() && x.size() == y.size() &&
         std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

fs::path transformer_dir(const std::string& set) { return test::pipeline_dir(set) / "transformer"; }

// One model per fixture for the whole binary (loading is cheap, but there is no need to repeat it).
const SD3Transformer2DModel& fixture_model(const std::string& set) {
  static std::map<std::string, SD3Transformer2DModel> models;
  auto it = models.find(set);
  if (it == models.end()) it = models.emplace(set, SD3Transformer2DModel::from_pretrained(transformer_dir(set))).first;
  return it->second;
}

// The pipeline runs of the fixtures: sd3_tiny 2 steps, sd35_tiny_arch 3 (manifest inputs).
int steps_of(const std::string& set) { return set == "sd35_tiny_arch" ? 3 : 2; }

// The transformer inputs of step `s` of `set`.
struct StepInputs {
  Tensor hidden_states, encoder_hidden_states, pooled_projections, timestep;
};
StepInputs step_inputs(const std::string& set, int s) {
  const std::string step = "transformer.step" + std::to_string(s);
  return {test::golden(set, step + ".in.hidden_states"), test::golden(set, "transformer.in.encoder_hidden_states"),
          test::golden(set, "transformer.in.pooled_projections"), test::golden(set, step + ".in.timestep")};
}
Tensor run(const SD3Transformer2DModel& m, const StepInputs& in, const std::vector<int64_t>& skip = {}) {
  return m.forward(in.hidden_states, in.encoder_hidden_states, in.pooled_projections, in.timestep, skip);
}

// ---- Diffusers parity ----

class SD3TransformerGolden : public ::testing::TestWithParam<std::string> {
 protected:
  Tensor g(const std::string& key) const { return test::golden(GetParam(), key); }
  const SD3Transformer2DModel& model() const { return fixture_model(GetParam()); }
  Tensor temb() const { return g(module_key("time_text_embed")); }
  // Checks and prints the error (the figures are reported in the change description).
  void check(const Tensor& got, const Tensor& want, const std::string& what) const {
    test::expect_close(got, want, kAtol, 0, GetParam() + " " + what);
    std::printf("[ parity   ] %s %s: max abs err %.3g\n", GetParam().c_str(), what.c_str(), max_abs_err(got, want));
  }
};

TEST_P(SD3TransformerGolden, Embeddings) {
  const auto& m = model();
  check(m.pos_embed(g("transformer.step0.in.hidden_states")), g(module_key("pos_embed")), "pos_embed");
  check(m.time_text_embed(g("transformer.step0.in.timestep"), g("transformer.in.pooled_projections")), temb(),
        "time_text_embed");
  check(m.context_embedder(g("transformer.in.encoder_hidden_states")), g(module_key("context_embedder")),
        "context_embedder");
}

// Each block fed the outputs Diffusers' previous module produced, then norm_out and proj_out.
TEST_P(SD3TransformerGolden, BlocksFromGoldenInputs) {
  const auto& m = model();
  ASSERT_EQ(m.transformer_blocks().size(), size_t(m.config().num_layers));
  Tensor x = g(module_key("pos_embed")), c = g(module_key("context_embedder"));
  for (size_t i = 0; i < m.transformer_blocks().size(); ++i) {
    const auto& block = m.transformer_blocks()[i];
    const std::string name = "transformer_blocks." + std::to_string(i);
    const auto [c_out, x_out] = block(x, c, temb());
    check(x_out, g(module_key(name + ".hidden_states")), name + ".hidden_states");
    x = g(module_key(name + ".hidden_states"));
    if (block.structure().context_pre_only) {
      EXPECT_FALSE(c_out.defined()) << "the last block has no text output";
    } else {
      check(c_out, g(module_key(name + ".encoder_hidden_states")), name + ".encoder_hidden_states");
      c = g(module_key(name + ".encoder_hidden_states"));
    }
  }
  EXPECT_TRUE(m.transformer_blocks().back().structure().context_pre_only);
  const Tensor normed = m.norm_out(x, temb());
  check(normed, g(module_key("norm_out")), "norm_out");
  check(m.proj_out(g(module_key("norm_out"))), g(module_key("proj_out")), "proj_out");
}

TEST_P(SD3TransformerGolden, ForwardMatchesDiffusersSteps) {
  for (int s = 0; s < steps_of(GetParam()); ++s)
    check(run(model(), step_inputs(GetParam(), s)), g("transformer.step" + std::to_string(s) + ".out"),
          "step" + std::to_string(s) + ".out");
}

// Each batch row alone (timestep [1]) gives that row of the batched result: rows never mix.
TEST_P(SD3TransformerGolden, EachBatchRowAlone) {
  const StepInputs in = step_inputs(GetParam(), 0);
  const Tensor want = g("transformer.step0.out");
  for (int64_t r = 0; r < 2; ++r) {
    const auto row = [&](const Tensor& t) { return slice(t, 0, r, r + 1); };
    const Tensor out = run(
        model(), {row(in.hidden_states), row(in.encoder_hidden_states), row(in.pooled_projections), row(in.timestep)});
    test::expect_close(out, row(want), kAtol, 0, "batch row " + std::to_string(r));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SD3TransformerGolden, ::testing::Values("sd3_tiny", "sd35_tiny_arch"));

// ---- skip_layers ----

// The model's forward by hand from its public sub-steps, running only the blocks in `blocks`.
Tensor forward_with_blocks(const SD3Transformer2DModel& m, const StepInputs& in, const std::vector<size_t>& blocks) {
  Tensor x = m.pos_embed(in.hidden_states);
  const Tensor temb = m.time_text_embed(in.timestep, in.pooled_projections);
  Tensor c = m.context_embedder(in.encoder_hidden_states);
  for (size_t i : blocks) std::tie(c, x) = m.transformer_blocks()[i](x, c, temb);
  return m.unpatchify(m.proj_out(m.norm_out(x, temb)), in.hidden_states.dim(2), in.hidden_states.dim(3));
}

TEST(SD3Transformer, SkipLayersSkipsTheBlocksEntirely) {
  const SD3Transformer2DModel& m = fixture_model("sd35_tiny_arch");
  const StepInputs in = step_inputs("sd35_tiny_arch", 0);
  const Tensor full = run(m, in);
  EXPECT_TRUE(same_bits(full, forward_with_blocks(m, in, {0, 1})));
  // Diffusers' skip_layers=[0] test: the output must change.
  const Tensor skip0 = run(m, in, {0});
  EXPECT_GT(max_abs_err(skip0, full), 1e-2);
  EXPECT_TRUE(same_bits(skip0, forward_with_blocks(m, in, {1}))) << "skip_layers={0} = the model without block 0";
  EXPECT_TRUE(same_bits(run(m, in, {1}), forward_with_blocks(m, in, {0}))) << "the last block can be skipped too";
  EXPECT_TRUE(same_bits(run(m, in, {1, 0, 1}), forward_with_blocks(m, in, {}))) << "order and repeats do not matter";
  test::expect_error([&] { run(m, in, {2}); }, {"skip_layers entry 2", "2 blocks"});
  test::expect_error([&] { run(m, in, {-1}); }, {"skip_layers entry -1"});
}

// ---- execution modes and what compiles ----

// Every test starts with empty process caches, fresh counters and no persistent cache.
class SD3Compiled : public testing::Test {
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

// {traces, compiles} during f().
template <typename F>
std::pair<uint64_t, uint64_t> traces_and_compiles_of(F&& f) {
  const CompileStats before = compile_stats();
  f();
  const CompileStats after = compile_stats();
  return {after.traces - before.traces, after.compiles - before.compiles};
}

// Strict eager, deferred-and-fused, the whole model compiled and its blocks compiled give the
// same bits, at every step and with skip_layers.
TEST_F(SD3Compiled, AllModesGiveTheStrictEagerBits) {
  for (const std::string set : {"sd3_tiny", "sd35_tiny_arch"}) {
    const SD3Transformer2DModel& eager_model = fixture_model(set);
    const std::vector<std::vector<int64_t>> skips =
        set == "sd35_tiny_arch" ? std::vector<std::vector<int64_t>>{{}, {0}} : std::vector<std::vector<int64_t>>{{}};
    std::vector<Tensor> want;
    for (int s = 0; s < steps_of(set); ++s)
      for (const auto& skip : skips) want.push_back(run(eager_model, step_inputs(set, s), skip));

    SD3Transformer2DModel whole = eager_model, blocks = eager_model;  // copies share the weights
    whole.compile(fullgraph());
    blocks.compile_repeated_blocks(fullgraph());
    EXPECT_TRUE(whole.is_compiled());
    EXPECT_FALSE(blocks.is_compiled()) << "regional compile leaves forward itself eager";
    for (const std::string mode : {"defer", "whole", "blocks", "blocks+defer"}) {
      const SD3Transformer2DModel& m = mode == "whole" ? whole : mode == "defer" ? eager_model : blocks;
      EagerModeGuard guard(mode == "defer" || mode == "blocks+defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
      size_t k = 0;
      for (int s = 0; s < steps_of(set); ++s)
        for (const auto& skip : skips) {
          const Tensor got = run(m, step_inputs(set, s), skip);
          EXPECT_TRUE(same_bits(got, want[k])) << set << " " << mode << " step " << s << " skip " << to_string(skip)
                                               << ": max abs diff " << max_abs_err(got, want[k]);
          ++k;
        }
    }
    EXPECT_EQ(compile_stats().eager_fallbacks, 0u) << set;
  }
}

TEST_F(SD3Compiled, TheWholeModelCompilesOncePerSignatureAndSkipSet) {
  SD3Transformer2DModel m = fixture_model("sd35_tiny_arch");
  m.compile(fullgraph());
  const StepInputs s0 = step_inputs("sd35_tiny_arch", 0), s1 = step_inputs("sd35_tiny_arch", 1);
  EXPECT_EQ(traces_and_compiles_of([&] { run(m, s0); }), std::make_pair(uint64_t(1), uint64_t(1))) << "first call";
  EXPECT_EQ(traces_and_compiles_of([&] { run(m, s1); }), std::make_pair(uint64_t(0), uint64_t(0)))
      << "another step: the timestep is a value";
  EXPECT_EQ(traces_and_compiles_of([&] { run(m, s0, {0}); }), std::make_pair(uint64_t(1), uint64_t(1)))
      << "skip_layers is another graph";
  EXPECT_EQ(traces_and_compiles_of([&] { run(m, s1, {0}); }), std::make_pair(uint64_t(0), uint64_t(0)));
  const auto row = [](const Tensor& t) { return slice(t, 0, 0, 1); };
  EXPECT_EQ(
      traces_and_compiles_of([&] {
        run(m, {row(s0.hidden_states), row(s0.encoder_hidden_states), row(s0.pooled_projections), row(s0.timestep)});
      }),
      std::make_pair(uint64_t(1), uint64_t(1)))
      << "a new batch size";
}

// sd35_tiny_arch's two blocks have different structures (dual attention; context_pre_only):
// two executables, and a second forward compiles nothing.
TEST_F(SD3Compiled, RepeatedBlocksCompileOneExecutablePerBlockStructure) {
  SD3Transformer2DModel m = fixture_model("sd35_tiny_arch");
  m.compile_repeated_blocks(fullgraph());
  const StepInputs s0 = step_inputs("sd35_tiny_arch", 0);
  run(m, s0);
  const CompileStats s = compile_stats();
  EXPECT_EQ(s.traces, 2u);
  EXPECT_EQ(s.compiles, 2u) << "dual-attention block 0 and context_pre_only block 1";
  EXPECT_EQ(s.shared_hits, 0u);
  for (const auto& b : m.transformer_blocks()) {
    ASSERT_NE(b.compiled(), nullptr);
    EXPECT_EQ(b.compiled()->name(), "JointTransformerBlock");
    EXPECT_EQ(b.compiled()->signatures(), 1u);
  }
  EXPECT_EQ(traces_and_compiles_of([&] { run(m, step_inputs("sd35_tiny_arch", 1)); }),
            std::make_pair(uint64_t(0), uint64_t(0)))
      << "a second forward";
  EXPECT_EQ(traces_and_compiles_of([&] { run(m, s0, {0}); }), std::make_pair(uint64_t(0), uint64_t(0)))
      << "skipping a block needs no new executable";
  std::printf("[ compile  ] sd35_tiny_arch repeated blocks: %llu executables for %zu blocks\n",
              (unsigned long long)s.compiles, m.transformer_blocks().size());
}

// ---- a synthetic SD3.5-Medium-shaped model (4 blocks: 2 dual, 1 plain, 1 last) ----

// Writes a transformer folder with random weights; `dual` lists the dual-attention blocks.
fs::path synthetic_transformer(const std::string& name, int64_t layers, const std::vector<int64_t>& dual) {
  const int64_t heads = 2, hd = 16, D = heads * hd, C = 4, p = 2, joint = 24, pooled = 16, M = 8;
  const fs::path dir = fs::temp_directory_path() / ("kiln_sd3_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string dual_json;
  for (int64_t i : dual) dual_json += (dual_json.empty() ? "" : ", ") + std::to_string(i);
  std::ofstream(dir / "config.json") << "{\"_class_name\": \"SD3Transformer2DModel\", \"attention_head_dim\": " << hd
                                     << ", \"caption_projection_dim\": " << D << ", \"dual_attention_layers\": ["
                                     << dual_json << "], \"in_channels\": " << C
                                     << ", \"joint_attention_dim\": " << joint << ", \"num_attention_heads\": " << heads
                                     << ", \"num_layers\": " << layers << ", \"out_channels\": " << C
                                     << ", \"patch_size\": " << p << ", \"pooled_projection_dim\": " << pooled
                                     << ", \"pos_embed_max_size\": " << M
                                     << ", \"qk_norm\": \"rms_norm\", \"sample_size\": 16}";
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint32_t seed = 1;
  const auto add = [&](const std::string& key, const Shape& shape) {
    const double scale = shape.size() >= 2 ? 1.0 / std::sqrt(double(numel(shape) / shape[0])) : 0.1;
    tensors.emplace_back(key, test::random_tensor(shape, seed++, DType::f32, -scale, scale));
  };
  const auto linear = [&](const std::string& prefix, int64_t in, int64_t out) {
    add(prefix + ".weight", {out, in});
    add(prefix + ".bias", {out});
  };
  add("pos_embed.proj.weight", {D, C, p, p});
  add("pos_embed.proj.bias", {D});
  add("pos_embed.pos_embed", {1, M * M, D});
  linear("time_text_embed.timestep_embedder.linear_1", 256, D);
  linear("time_text_embed.timestep_embedder.linear_2", D, D);
  linear("time_text_embed.text_embedder.linear_1", pooled, D);
  linear("time_text_embed.text_embedder.linear_2", D, D);
  linear("context_embedder", joint, D);
  for (int64_t i = 0; i < layers; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    const bool is_dual = std::find(dual.begin(), dual.end(), i) != dual.end(), last = i == layers - 1;
    linear(b + "norm1.linear", D, (is_dual ? 9 : 6) * D);
    linear(b + "norm1_context.linear", D, (last ? 2 : 6) * D);
    for (const char* l : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0"})
      linear(b + "attn." + l, D, D);
    if (!last) linear(b + "attn.to_add_out", D, D);
    for (const char* n : {"norm_q", "norm_k", "norm_added_q", "norm_added_k"}) add(b + "attn." + n + ".weight", {hd});
    if (is_dual) {
      for (const char* l : {"to_q", "to_k", "to_v", "to_out.0"}) linear(b + "attn2." + l, D, D);
      for (const char* n : {"norm_q", "norm_k"}) add(b + "attn2." + n + ".weight", {hd});
    }
    for (const std::string ff : {"ff", "ff_context"}) {
      if (ff == "ff_context" && last) continue;
      linear(b + ff + ".net.0.proj", D, 4 * D);
      linear(b + ff + ".net.2", 4 * D, D);
    }
  }
  linear("norm_out.linear", D, 2 * D);
  linear("proj_out", D, p * p * C);
  synchronize(Device::cpu());
  io::save_safetensors(dir / "diffusion_pytorch_model.safetensors", tensors);
  return dir;
}

StepInputs synthetic_inputs(const SD3TransformerConfig& c, int64_t batch, int64_t h, int64_t w, int64_t l_txt) {
  return {test::random_tensor({batch, c.in_channels, h, w}, 101),
          test::random_tensor({batch, l_txt, c.joint_attention_dim}, 102),
          test::random_tensor({batch, c.pooled_projection_dim}, 103),
          from_vector(std::vector<float>(size_t(batch), 937.5f), {batch})};
}

// SD3.5 Medium's layout in miniature: blocks of one structure share an executable, so 4 blocks
// of 3 structures compile 3 executables; warmup compiles them without running anything.
TEST_F(SD3Compiled, BlocksOfTheSameStructureShareOneExecutable) {
  const fs::path dir = synthetic_transformer("shared", 4, {0, 1});
  SD3Transformer2DModel eager = SD3Transformer2DModel::from_pretrained(dir);
  const StepInputs in = synthetic_inputs(eager.config(), 2, 12, 16, 7);  // 6×8 patches of the 8×8 table
  const Tensor want = run(eager, in);

  SD3Transformer2DModel m = eager;
  m.compile_repeated_blocks(fullgraph());
  m.warmup(2, 12, 16, 7);
  CompileStats s = compile_stats();
  EXPECT_EQ(s.traces, 4u) << "each block traced once";
  EXPECT_EQ(s.compiles, 3u) << "dual, plain and context_pre_only";
  EXPECT_EQ(s.shared_hits, 1u) << "block 1 reuses block 0's executable";
  EXPECT_EQ(s.calls, 0u) << "warmup runs nothing";
  EXPECT_EQ(traces_and_compiles_of([&] { EXPECT_TRUE(same_bits(run(m, in), want)); }),
            std::make_pair(uint64_t(0), uint64_t(0)))
      << "the forward after warmup";

  SD3Transformer2DModel whole = eager;
  whole.compile(fullgraph());
  EXPECT_EQ(traces_and_compiles_of([&] { whole.warmup(2, 12, 16, 7); }), std::make_pair(uint64_t(1), uint64_t(1)));
  EXPECT_EQ(traces_and_compiles_of([&] { EXPECT_TRUE(same_bits(run(whole, in), want)); }),
            std::make_pair(uint64_t(0), uint64_t(0)));

  // The op-by-op activation estimate grows with the image.
  const size_t small = eager.activation_bytes(1, 8, 8, 7), large = eager.activation_bytes(1, 16, 16, 7);
  EXPECT_GT(small, 0u);
  EXPECT_GT(large, small);
  fs::remove_all(dir);
}

TEST_F(SD3Compiled, RegionalCompileNeedsBlocks) {
  const fs::path dir = synthetic_transformer("noblocks", 0, {});
  SD3Transformer2DModel m = SD3Transformer2DModel::from_pretrained(dir);
  test::expect_error([&] { m.compile_repeated_blocks(); }, {"regional compilation failed", "JointTransformerBlock"});
  // With no blocks the model is patch embed, norm_out and proj_out; it still runs.
  const StepInputs in = synthetic_inputs(m.config(), 1, 4, 4, 3);
  EXPECT_EQ(run(m, in).shape(), Shape({1, 4, 4, 4}));
  fs::remove_all(dir);
}

// ---- class data, config ----

TEST(SD3Transformer, ClassData) {
  EXPECT_EQ(SD3Transformer2DModel::repeated_blocks(), std::vector<std::string>{"JointTransformerBlock"});
  EXPECT_TRUE(SD3Transformer2DModel::checkpoint_keys_not_loaded().empty());
  EXPECT_EQ(SD3Transformer2DModel::tp_plan().size(), 16u);
  EXPECT_EQ(SD3Transformer2DModel::tp_plan({}, true).size(), 19u);
  EXPECT_EQ(fixture_model("sd35_tiny_arch").dtype(), DType::f32);
  // Every weight the model reads is one of its parameters, and the checkpoint has no others.
  const SD3Transformer2DModel& m = fixture_model("sd35_tiny_arch");
  const io::SafetensorsFile file(transformer_dir("sd35_tiny_arch") / "diffusion_pytorch_model.safetensors");
  EXPECT_EQ(m.parameters().size(), file.names().size());
}

TEST(SD3Transformer, ConfigDefaultsAndNulls) {
  const auto parse = [](const std::string& text) {
    return SD3TransformerConfig::from_json(io::JsonConfig::from_string(text, "config.json"));
  };
  // Older SD3 configs omit dual_attention_layers and qk_norm; the class defaults apply.
  SD3TransformerConfig c =
      parse("{\"num_attention_heads\": 4, \"attention_head_dim\": 8, \"caption_projection_dim\": 32}");
  EXPECT_TRUE(c.dual_attention_layers.empty());
  EXPECT_FALSE(c.qk_norm.has_value());
  EXPECT_EQ(c.out_channels, 16);
  EXPECT_EQ(c.patch_size, 2);
  EXPECT_EQ(c.pos_embed_max_size, 96);
  EXPECT_EQ(c.num_layers, 18);
  c = parse(
      "{\"num_attention_heads\": 4, \"attention_head_dim\": 8, \"caption_projection_dim\": 32, "
      "\"in_channels\": 8, \"out_channels\": null, \"qk_norm\": null, \"num_layers\": 3, "
      "\"dual_attention_layers\": [0, 1]}");
  EXPECT_EQ(c.out_channels, 8) << "null out_channels is in_channels";
  EXPECT_FALSE(c.qk_norm.has_value());
  EXPECT_TRUE(c.block_structure(0).dual_attention);
  EXPECT_FALSE(c.block_structure(2).dual_attention);
  EXPECT_TRUE(c.block_structure(2).context_pre_only);
  EXPECT_FALSE(c.block_structure(1).context_pre_only);
}

TEST(SD3Transformer, ConfigErrorsNameTheField) {
  const auto parse = [](const std::string& fields) {
    SD3TransformerConfig::from_json(io::JsonConfig::from_string(
        "{\"num_attention_heads\": 4, \"attention_head_dim\": 8, \"num_layers\": 2" + fields + "}", "config.json"));
  };
  test::expect_error([&] { parse(", \"caption_projection_dim\": 32, \"qk_norm\": \"layer_norm\""); },
                     {"config.json", "'qk_norm'", "\"layer_norm\""});
  test::expect_error([&] { parse(", \"caption_projection_dim\": 32, \"qk_norm\": 1"); }, {"config.json", "qk_norm"});
  test::expect_error(
      [&] { parse(", \"caption_projection_dim\": 48"); },
      {"config.json", "'caption_projection_dim' (48)", "num_attention_heads * attention_head_dim", "32"});
  test::expect_error([&] { parse(", \"caption_projection_dim\": 32, \"dual_attention_layers\": [2]"); },
                     {"'dual_attention_layers' entry 2", "num_layers = 2"});
  test::expect_error([&] { parse(", \"caption_projection_dim\": 32, \"pos_embed_max_size\": null"); },
                     {"'pos_embed_max_size' null"});
  test::expect_error([&] { parse(", \"caption_projection_dim\": 32, \"patch_size\": 0"); }, {"'patch_size'"});
}

// A copy of sd35_tiny_arch's transformer folder with an edited config.json.
fs::path edited_transformer(const std::string& name, const std::string& from, const std::string& to) {
  const fs::path src = transformer_dir("sd35_tiny_arch");
  const fs::path dir = fs::temp_directory_path() / ("kiln_sd3_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ifstream in(src / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  std::ofstream(dir / "config.json") << text;
  fs::create_symlink(fs::absolute(src / "diffusion_pytorch_model.safetensors"),
                     dir / "diffusion_pytorch_model.safetensors");
  return dir;
}

// A config that disagrees with its checkpoint is an error naming the tensor, never a silently
// different model.
TEST(SD3Transformer, ConfigCheckpointDisagreementsNameTheTensor) {
  const struct {
    const char* name;
    std::string from, to;
    std::vector<std::string> parts;
  } cases[] = {
      {"qk",
       "\"qk_norm\": \"rms_norm\"",
       "\"qk_norm\": null",
       {"transformer_blocks.0.attn.norm_q.weight", "qk_norm=null"}},
      {"dual",
       "\"dual_attention_layers\": [\n    0\n  ]",
       "\"dual_attention_layers\": []",
       {"transformer_blocks.0.attn2.to_q.weight", "does not list block 0"}},
      {"layers",
       "\"num_layers\": 2",
       "\"num_layers\": 1",
       {"transformer_blocks.1.norm1.linear.weight", "num_layers=1"}},
      {"table",
       "\"pos_embed_max_size\": 16",
       "\"pos_embed_max_size\": 12",
       {"pos_embed.pos_embed", "[1,256,64]", "[1,144,64]"}},
      {"caption",
       "\"caption_projection_dim\": 64",
       "\"caption_projection_dim\": 48",
       {"'caption_projection_dim' (48)"}},
      {"qkbad",
       "\"qk_norm\": \"rms_norm\"",
       "\"qk_norm\": \"rms_norm_across_heads\"",
       {"'qk_norm'", "rms_norm_across_heads"}},
  };
  for (const auto& c : cases) {
    const fs::path dir = edited_transformer(c.name, c.from, c.to);
    test::expect_error([&] { SD3Transformer2DModel::from_pretrained(dir); }, c.parts);
    fs::remove_all(dir);
  }
}

// torch_dtype bfloat16: the weights and the positional table are held in bf16 and the model
// computes in it (the timestep sinusoid in f32, cast to the pooled projections' dtype); the
// result stays near the f32 reference, within bf16 rounding.
TEST(SD3Transformer, Bfloat16RunsNearTheF32Result) {
  for (const std::string set : {"sd3_tiny", "sd35_tiny_arch"}) {
    const SD3Transformer2DModel m = SD3Transformer2DModel::from_pretrained(transformer_dir(set), DType::bf16);
    EXPECT_EQ(m.dtype(), DType::bf16);
    for (const Tensor& t : m.parameters()) EXPECT_EQ(t.dtype(), DType::bf16);
    const StepInputs in = step_inputs(set, 0);
    const Tensor out = run(m, {cast(in.hidden_states, DType::bf16), cast(in.encoder_hidden_states, DType::bf16),
                               cast(in.pooled_projections, DType::bf16), in.timestep});
    EXPECT_EQ(out.dtype(), DType::bf16);
    const double err = max_abs_err(out, test::golden(set, "transformer.step0.out"));
    EXPECT_LT(err, 0.05) << set;
    std::printf("[ bf16     ] %s step0.out: max abs err %.3g vs the f32 reference\n", set.c_str(), err);
  }
}

TEST(SD3Transformer, InputErrors) {
  const SD3Transformer2DModel& m = fixture_model("sd35_tiny_arch");
  const StepInputs in = step_inputs("sd35_tiny_arch", 0);
  test::expect_error(
      [&] {
        run(m, {slice(in.hidden_states, 2, 0, 15), in.encoder_hidden_states, in.pooled_projections, in.timestep});
      },
      {"multiples of patch_size = 2"});
  const Tensor big = zeros({2, 16, 34, 16});
  test::expect_error(
      [&] {
        run(m, {big, in.encoder_hidden_states, in.pooled_projections, in.timestep});
      },
      {"17x8 patches", "pos_embed_max_size = 16"});
  test::expect_error(
      [&] {
        run(m, {in.hidden_states, in.encoder_hidden_states, in.pooled_projections, zeros({3})});
      },
      {"timestep must be [2]"});
}

// ---- tensor parallelism (TensorParallelPlan.*: also run under mpirun -np 2) ----

TensorParallelConfig tp_for(std::shared_ptr<ProcessGroup> group) {
  return TensorParallelConfig{DeviceMesh(std::move(group))};
}

size_t parameter_bytes(const SD3Transformer2DModel& m) {
  size_t n = 0;
  for (const Tensor& t : m.parameters()) n += t.nbytes();
  return n;
}

TEST(TensorParallelPlan, SD3EachRankHoldsItsShareOfTheHeads) {
  const fs::path dir = transformer_dir("sd35_tiny_arch");
  const SD3Transformer2DModel& whole = fixture_model("sd35_tiny_arch");
  for (int rank = 0; rank < 2; ++rank) {
    const SD3Transformer2DModel part =
        SD3Transformer2DModel::from_pretrained(dir, tp_for(ProcessGroup::detached(rank, 2)));
    const double held = double(parameter_bytes(part)) / double(parameter_bytes(whole));
    // Replicated: the patch embedding and its table, the embedders, the QK norms and proj_out.
    EXPECT_LT(held, 0.6) << "rank " << rank;
    std::printf("[ tp       ] sd35_tiny_arch rank %d of 2 holds %.3f of the transformer's bytes\n", rank, held);
  }
  test::expect_error([&] { SD3Transformer2DModel::from_pretrained(dir, tp_for(ProcessGroup::detached(0, 3))); },
                     {"[tp]", "tp_degree (3) must divide the number of attention heads (4)"});
}

// With this process's world: one rank in the unit-test run (the plan path, whole weights), two
// under CTest's tensor_parallel_two_ranks (each rank half the heads, all-reduced), where the
// result must still match Diffusers (the sum over ranks only reorders additions).
TEST(TensorParallelPlan, SD3ShardedForwardMatchesDiffusers) {
  const std::string world = ProcessGroup::world()->describe();
  for (const std::string set : {"sd3_tiny", "sd35_tiny_arch"}) {
    const SD3Transformer2DModel m =
        SD3Transformer2DModel::from_pretrained(transformer_dir(set), tp_for(ProcessGroup::world()));
    SD3Transformer2DModel blocks = m, whole = m;
    blocks.compile_repeated_blocks(fullgraph());
    whole.compile(fullgraph());
    for (const std::string mode : {"eager", "defer", "compile blocks", "compile whole"}) {
      const SD3Transformer2DModel& model = mode == "compile blocks" ? blocks : mode == "compile whole" ? whole : m;
      EagerModeGuard guard(mode == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
      for (int s = 0; s < steps_of(set); ++s) {
        const Tensor want = test::golden(set, "transformer.step" + std::to_string(s) + ".out");
        const Tensor got = run(model, step_inputs(set, s));
        test::expect_close(got, want, kTpAtol, 0, set + " " + mode + " step " + std::to_string(s));
        std::printf("[ tp       ] %s %s %s step%d: max abs err %.3g\n", world.c_str(), set.c_str(), mode.c_str(), s,
                    max_abs_err(got, want));
      }
    }
  }
}

}  // namespace
}  // namespace kiln
