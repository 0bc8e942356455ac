// The realistic-width FLUX.1 transformer fixture (schnell widths: 24 heads x 128, joint dim
// 4096, pooled 768, rope 16/56/56; 1 double + 2 single blocks) against Diffusers' forward.
// Its weights are regenerated from the fixture's deterministic rule (deterministic_weights.h),
// checked first against the manifest's per-tensor checksums.
#include <fstream>

#include <nlohmann/json.hpp>

#include "deterministic_weights.h"
#include "golden.h"
#include "io/json_config.h"
#include "models/flux/flux_transformer.h"

namespace kiln {
namespace {

const std::string kSet = "flux1_transformer_mid";

nlohmann::json manifest() {
  std::ifstream in(test::fixture(kSet) / "manifest.json");
  return nlohmann::json::parse(in);
}

std::map<std::string, Shape> parameter_shapes(const nlohmann::json& m) {
  std::map<std::string, Shape> shapes;
  for (const auto& [name, info] : m["weights"]["per_tensor_checksums"].items())
    shapes[name] = info["shape"].get<Shape>();
  return shapes;
}

// Relative L2 error ||got - want|| / ||want||.
double relative_l2(const Tensor& got, const Tensor& want) {
  const auto g = to_vector(got), w = to_vector(want);
  double num = 0, den = 0;
  for (size_t i = 0; i < w.size(); ++i) num += (double(g[i]) - w[i]) * (double(g[i]) - w[i]), den += double(w[i]) * w[i];
  return std::sqrt(num / den);
}

TEST(FluxTransformerMid, GeneratedWeightsMatchTheManifestChecksums) {
  const nlohmann::json m = manifest();
  int checked = 0;
  for (const auto& [name, info] : m["weights"]["per_tensor_checksums"].items()) {
    if (info["shape"].size() != 1 && checked > 3) continue;  // all vectors, a few matrices
    const auto v = test::det_param_values(name, info["shape"].get<Shape>());
    double sum = 0;
    for (float x : v) sum += x;
    EXPECT_NEAR(sum, info["sum"].get<double>(), 1e-6 * info["abs_sum"].get<double>() + 1e-9) << name;
    for (int i = 0; i < 4; ++i) EXPECT_EQ(v[size_t(i)], float(info["first4"][size_t(i)].get<double>())) << name;
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

// Tolerance (manifest suggested_tolerances.fp32): relative L2 error <= 1e-4 and max abs error
// <= 1e-3 of the output's max magnitude.
TEST(FluxTransformerMid, MatchesDiffusersForward) {
  const nlohmann::json m = manifest();
  const auto config =
      FluxTransformerConfig::from_json(io::JsonConfig(test::fixture(kSet) / "transformer" / "config.json"));
  FluxTransformer2DModel model(config, nn::Weights(std::make_shared<const test::GeneratedWeights>(parameter_shapes(m))));
  auto g = [](const std::string& key) { return test::golden(kSet, key); };
  const Tensor out = model.forward(g("in.hidden_states"), g("in.encoder_hidden_states"), g("in.pooled_projections"),
                                   g("in.timestep"), g("in.img_ids"), g("in.txt_ids"), std::nullopt);
  const Tensor want = g("out");
  EXPECT_LE(relative_l2(out, want), 1e-4);
  double peak = 0;
  for (float x : to_vector(want)) peak = std::max(peak, double(std::fabs(x)));
  test::expect_close(out, want, 1e-3 * peak, 0, "mid transformer output");
  // Compiled mode at realistic widths: the same bits as the eager forward above.
  model.compile();
  const Tensor compiled = model.forward(g("in.hidden_states"), g("in.encoder_hidden_states"),
                                        g("in.pooled_projections"), g("in.timestep"), g("in.img_ids"),
                                        g("in.txt_ids"), std::nullopt);
  EXPECT_EQ(to_vector(compiled), to_vector(out)) << "compiled forward differs from eager";
}

}  // namespace
}  // namespace kiln
