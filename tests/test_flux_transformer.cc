// FluxTransformer2DModel against Diffusers' own outputs (tests/fixtures/<set>/golden.safetensors):
// the embeddings, every block fed with Diffusers' inputs, and the whole forward for two steps.
// Tolerance: the manifests' suggested_tolerances "fp32_transformer_step: max abs err <= 1e-4".
#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>

#include <fstream>

#include "exec/counters.h"
#include "exec/ops.h"
#include "golden.h"
#include "models/flux/flux_transformer.h"
#include "test_util.h"

namespace kiln {
namespace {

constexpr double kAtol = 1e-4;  // fp32_transformer_step

std::string module_key(const std::string& name) { return "transformer.step0.module." + name; }

class FluxTransformerGolden : public ::testing::TestWithParam<std::string> {
 protected:
  Tensor g(const std::string& key) const { return test::golden(GetParam(), key); }
  const FluxTransformer2DModel& model() const {
    static std::map<std::string, FluxTransformer2DModel> models;
    auto it = models.find(GetParam());
    if (it == models.end())
      it = models.emplace(GetParam(), FluxTransformer2DModel::from_pretrained(test::pipeline_dir(GetParam()) /
                                                                              "transformer"))
               .first;
    return it->second;
  }
  // Neither fixture is a dev (guidance_embeds) model; a dev fixture would store the guidance.
  std::optional<Tensor> guidance() const {
    if (!model().config().guidance_embeds) return std::nullopt;
    return g("transformer.in.guidance");
  }
  Tensor temb() const { return g(module_key("time_text_embed")); }
  nn::RotaryTables rope() const { return nn::RotaryTables::of(g(module_key("pos_embed.cos")), g(module_key("pos_embed.sin"))); }
};

TEST_P(FluxTransformerGolden, Embeddings) {
  const auto& m = model();
  test::expect_close(m.x_embedder(g("transformer.step0.in.hidden_states")), g(module_key("x_embedder")), kAtol, 0,
                     "x_embedder");
  test::expect_close(m.context_embedder(g("transformer.in.encoder_hidden_states")),
                     g(module_key("context_embedder")), kAtol, 0, "context_embedder");
  test::expect_close(m.time_text_embed(g("transformer.step0.in.timestep"), g("transformer.in.pooled_projections"),
                                       guidance()),
                     temb(), kAtol, 0, "time_text_embed");
  const nn::RotaryTables r = m.pos_embed(g("transformer.in.img_ids"), g("transformer.in.txt_ids"));
  test::expect_close(r.cos, g(module_key("pos_embed.cos")), 1e-6, 0, "pos_embed.cos");
  test::expect_close(r.sin, g(module_key("pos_embed.sin")), 1e-6, 0, "pos_embed.sin");
}

// Each block, fed the outputs Diffusers' previous module produced, against its outputs.
TEST_P(FluxTransformerGolden, BlocksFromGoldenInputs) {
  const auto& m = model();
  Tensor x = g(module_key("x_embedder")), c = g(module_key("context_embedder"));
  const auto check = [&](const std::string& name, const std::pair<Tensor, Tensor>& got) {
    test::expect_close(got.first, g(module_key(name + ".encoder_hidden_states")), kAtol, 0, name + " context");
    test::expect_close(got.second, g(module_key(name + ".hidden_states")), kAtol, 0, name + " hidden");
    c = g(module_key(name + ".encoder_hidden_states"));
    x = g(module_key(name + ".hidden_states"));
  };
  for (size_t i = 0; i < m.transformer_blocks().size(); ++i)
    check("transformer_blocks." + std::to_string(i), m.transformer_blocks()[i](x, c, temb(), rope()));
  for (size_t i = 0; i < m.single_transformer_blocks().size(); ++i)
    check("single_transformer_blocks." + std::to_string(i), m.single_transformer_blocks()[i](x, c, temb(), rope()));
  const Tensor normed = m.norm_out(x, temb());
  test::expect_close(normed, g(module_key("norm_out")), kAtol, 0, "norm_out");
  test::expect_close(m.proj_out(normed), g(module_key("proj_out")), kAtol, 0, "proj_out");
}

TEST_P(FluxTransformerGolden, ForwardMatchesDiffusersSteps) {
  for (const std::string step : {"step0", "step1"}) {
    const Tensor out = model().forward(g("transformer." + step + ".in.hidden_states"),
                                       g("transformer.in.encoder_hidden_states"),
                                       g("transformer.in.pooled_projections"), g("transformer." + step + ".in.timestep"),
                                       g("transformer.in.img_ids"), g("transformer.in.txt_ids"), guidance());
    test::expect_close(out, g("transformer." + step + ".out"), kAtol, 0, GetParam() + " " + step);
  }
}

// A batch of two (the same sample twice) gives the single-sample result in each row.
TEST_P(FluxTransformerGolden, BatchOfTwo) {
  const auto twice = [](const Tensor& t) { return concat({t, t}, 0); };
  std::optional<Tensor> gs = guidance();
  if (gs) gs = twice(*gs);
  const Tensor out = model().forward(twice(g("transformer.step0.in.hidden_states")),
                                     twice(g("transformer.in.encoder_hidden_states")),
                                     twice(g("transformer.in.pooled_projections")),
                                     twice(g("transformer.step0.in.timestep")), g("transformer.in.img_ids"),
                                     g("transformer.in.txt_ids"), gs);
  const Tensor want = g("transformer.step0.out");
  test::expect_close(slice(out, 0, 0, 1), want, kAtol, 0, "batch row 0");
  test::expect_close(slice(out, 0, 1, 2), want, kAtol, 0, "batch row 1");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FluxTransformerGolden, ::testing::Values("flux1_tiny", "flux1_tiny_arch"));

// Spec §2.5.1 sanity vector (t = 1000, cos half first).
TEST(FluxTransformer, TimestepSinusoidSanity) {
  const auto e = to_vector(nn::timestep_sinusoid(from_vector({1000.0f}, {1})));
  ASSERT_EQ(e.size(), 256u);
  const std::vector<std::pair<size_t, float>> want{{0, 0.5623791f},   {1, 0.7896267f},   {2, 0.4399279f},
                                                   {127, 0.9942316f}, {128, 0.8268796f}, {129, 0.6135876f},
                                                   {255, 0.1072541f}};
  for (const auto& [i, v] : want) EXPECT_NEAR(e[i], v, 2e-6) << "channel " << i;
}

// Spec §2.5.2 sanity values (d = 56, pos = 3), each frequency repeated for the pair.
TEST(FluxTransformer, RopeTablesSanity) {
  const nn::RotaryTables r = nn::flux_pos_embed(from_vector({3.0f}, {1, 1}), {56});
  const auto c = to_vector(r.cos), s = to_vector(r.sin);
  const float wc[] = {-0.989992497f, -0.554914920f, 0.016953111f}, ws[] = {0.141120008f, 0.831907105f, 0.999856286f};
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_FLOAT_EQ(c[2 * j], wc[j]);
    EXPECT_FLOAT_EQ(c[2 * j + 1], wc[j]);
    EXPECT_FLOAT_EQ(s[2 * j], ws[j]);
    EXPECT_FLOAT_EQ(s[2 * j + 1], ws[j]);
  }
}

TEST(FluxTransformer, ClassData) {
  EXPECT_EQ(FluxTransformer2DModel::repeated_blocks(),
            (std::vector<std::string>{"FluxTransformerBlock", "FluxSingleTransformerBlock"}));
  const auto& plan = FluxTransformer2DModel::tp_plan();
  EXPECT_EQ(plan.size(), 17u);
  EXPECT_EQ(plan.back().pattern, "single_transformer_blocks.*.proj_out");
  EXPECT_EQ(plan.back().blocks, (std::vector<int64_t>{1, 4}));
}

// A copy of flux1_tiny's transformer folder with an edited config.json.
std::filesystem::path edited_transformer(const std::string& name, const std::string& from, const std::string& to) {
  const auto src = test::pipeline_dir("flux1_tiny") / "transformer";
  const auto dir = std::filesystem::temp_directory_path() / ("kiln_flux_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ifstream in(src / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  std::ofstream(dir / "config.json") << text;
  std::filesystem::create_symlink(std::filesystem::absolute(src / "diffusion_pytorch_model.safetensors"),
                                  dir / "diffusion_pytorch_model.safetensors");
  return dir;
}

TEST(FluxTransformer, ConfigWeightShapeDisagreementNamesTheTensor) {
  const auto dir = edited_transformer("shape", "\"joint_attention_dim\": 32", "\"joint_attention_dim\": 48");
  test::expect_error([&] { FluxTransformer2DModel::from_pretrained(dir); },
                     {"context_embedder.weight", "[32,32]", "[32,48]"});
  std::filesystem::remove_all(dir);
}

TEST(FluxTransformer, ConfigErrors) {
  auto dir = edited_transformer("axes", "\"axes_dims_rope\": [\n    4,", "\"axes_dims_rope\": [\n    6,");
  test::expect_error([&] { FluxTransformer2DModel::from_pretrained(dir); },
                     {"config.json", "sum(axes_dims_rope) = 18", "attention_head_dim = 16"});
  std::filesystem::remove_all(dir);
  // The checkpoint holds one double-stream block; a config claiming none would drop it silently.
  dir = edited_transformer("layers", "\"num_layers\": 1", "\"num_layers\": 0");
  test::expect_error([&] { FluxTransformer2DModel::from_pretrained(dir); },
                     {"transformer_blocks.0.norm1.linear.weight", "num_layers=0"});
  std::filesystem::remove_all(dir);
}

TEST(FluxTransformer, GuidanceOnASchnellModelIsAnError) {
  const auto m = FluxTransformer2DModel::from_pretrained(test::pipeline_dir("flux1_tiny") / "transformer");
  const auto g = [](const std::string& k) { return test::golden("flux1_tiny", k); };
  test::expect_error(
      [&] {
        m.forward(g("transformer.step0.in.hidden_states"), g("transformer.in.encoder_hidden_states"),
                  g("transformer.in.pooled_projections"), g("transformer.step0.in.timestep"),
                  g("transformer.in.img_ids"), g("transformer.in.txt_ids"), from_vector({3.5f}, {1}));
      },
      {"guidance_embeds=false"});
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The RoPE tables need the ids on the host; a pipeline passes the same id tensors at every
// step, so only the first forward reads them: later steps run without a host sync.
TEST(FluxTransformer, LaterStepsWithTheSameIdsDoNotSync) {
  const auto m = FluxTransformer2DModel::from_pretrained(test::pipeline_dir("flux1_tiny") / "transformer");
  const auto g = [](const std::string& k) { return test::golden("flux1_tiny", k); };
  const Tensor img_ids = g("transformer.in.img_ids"), txt_ids = g("transformer.in.txt_ids");
  auto step = [&](const std::string& s) {
    return m.forward(g("transformer." + s + ".in.hidden_states"), g("transformer.in.encoder_hidden_states"),
                     g("transformer.in.pooled_projections"), g("transformer." + s + ".in.timestep"), img_ids, txt_ids);
  };
  wait(step("step0"));
  reset_counters();
  const Tensor out = step("step1");
  EXPECT_EQ(counters().sync_points, 0u);
  test::expect_close(out, g("transformer.step1.out"), 1e-4, 0, "step 1 with cached RoPE tables");
  // New id tensors (even with equal values) rebuild the tables, once.
  reset_counters();
  wait(m.forward(g("transformer.step1.in.hidden_states"), g("transformer.in.encoder_hidden_states"),
                 g("transformer.in.pooled_projections"), g("transformer.step1.in.timestep"),
                 contiguous(transpose(transpose(img_ids, 0, 1), 0, 1)) + 0.0, txt_ids));
  EXPECT_GE(counters().sync_points, 2u);
}

}  // namespace
}  // namespace kiln
