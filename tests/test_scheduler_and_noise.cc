// FlowMatchEulerDiscreteScheduler schedules and torch-compatible seeded noise, against the
// values Diffusers/PyTorch produced (fixture goldens).
#include <fstream>

#include <nlohmann/json.hpp>

#include "exec/ops.h"
#include "golden.h"
#include "pipelines/torch_generator.h"
#include "schedulers/flow_match_euler.h"
#include "test_util.h"

namespace kiln {
namespace {

nlohmann::json manifest(const std::string& set) {
  std::ifstream in(test::fixture(set) / "manifest.json");
  return nlohmann::json::parse(in);
}

// Every scheduler probe of the fixture: sigmas and timesteps equal Diffusers' fp32 values
// (tolerance: 1 ulp of fp32, i.e. 1.2e-7 relative; the computation mirrors Diffusers' order).
TEST(FlowMatchEuler, MatchesDiffusersSchedules) {
  const nlohmann::json m = manifest("flux1_tiny");
  int probes = 0;
  for (const auto& probe : m["scheduler_probes"]) {
    FlowMatchEulerConfig c;
    const auto& sc = probe["scheduler_config"];
    c.shift = sc["shift"].get<double>();
    c.use_dynamic_shifting = sc["use_dynamic_shifting"].get<bool>();
    FlowMatchEulerDiscreteScheduler s(c);
    const int64_t seq = probe["image_seq_len"].get<int64_t>();
    EXPECT_NEAR(s.calculate_shift(seq), probe["mu"].get<double>(), 1e-12);
    s.set_timesteps(probe["num_inference_steps"].get<int64_t>(), s.calculate_shift(seq));
    const std::string prefix = probe["key_prefix"].get<std::string>();
    const auto sig = to_vector(test::golden("flux1_tiny", prefix + ".sigmas"));
    const auto ts = to_vector(test::golden("flux1_tiny", prefix + ".timesteps"));
    ASSERT_EQ(s.sigmas().size(), sig.size()) << prefix;
    for (size_t i = 0; i < sig.size(); ++i) EXPECT_NEAR(s.sigmas()[i], sig[i], 1.2e-7 * std::fabs(sig[i])) << prefix;
    for (size_t i = 0; i < ts.size(); ++i) EXPECT_NEAR(s.timesteps()[i], ts[i], 1.2e-7 * std::fabs(ts[i])) << prefix;
    ++probes;
  }
  EXPECT_GE(probes, 10);
}

TEST(FlowMatchEuler, ReadsTheFixtureConfigAndRejectsUnsupportedOptions) {
  const auto c = FlowMatchEulerConfig::load(test::pipeline_dir("flux1_tiny_arch") / "scheduler" / "scheduler_config.json");
  EXPECT_FALSE(c.use_dynamic_shifting);
  EXPECT_EQ(c.shift, 1.0);
  const auto dir = std::filesystem::temp_directory_path() / "kiln_sched_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "scheduler_config.json") << R"({"use_karras_sigmas": true})";
  test::expect_error([&] { FlowMatchEulerConfig::load(dir / "scheduler_config.json"); },
                     {"[scheduler]", "scheduler_config.json", "use_karras_sigmas"});
  std::filesystem::remove_all(dir);
  FlowMatchEulerDiscreteScheduler s(c);
  test::expect_error([&] { s.set_timesteps(0, 0.5); }, {"num_inference_steps must be at least 1, got 0"});
}

TEST(FlowMatchEuler, StepIsAnEulerUpdate) {
  FlowMatchEulerDiscreteScheduler s{FlowMatchEulerConfig{}};
  s.set_timesteps(4, 0.5);  // sigmas 1, .75, .5, .25, 0
  const Tensor x = from_vector({1, 2, 3}, {3}), v = from_vector({4, -8, 0.5f}, {3});
  const auto y = to_vector(s.step(v, x));
  EXPECT_FLOAT_EQ(y[0], 1 - 0.25f * 4);
  EXPECT_FLOAT_EQ(y[1], 2 + 0.25f * 8);
  EXPECT_EQ(s.step_index(), 1);
}

// torch.Generator("cpu").manual_seed(0); torch.randn(...) check values (flux1.md Appendix A).
TEST(TorchGenerator, MatchesTorchRandnForSmallAndLargeTensors) {
  const auto big = TorchGenerator(0).randn(64);
  const float want_big[] = {-1.1258398f, -1.1523602f, -0.25057858f, -0.4338788f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(big[size_t(i)], want_big[i], 2e-6);
  const auto small = TorchGenerator(0).randn(5);
  const float want_small[] = {1.5409961f, -0.2934289f, -2.1787894f, 0.56843126f, -1.0845224f};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(small[size_t(i)], want_small[i], 1e-6);
}

// The fixtures' initial noise was drawn by Diffusers with torch.Generator("cpu").manual_seed(0).
TEST(TorchGenerator, ReproducesTheGoldenInitialNoise) {
  for (const std::string set : {"flux1_tiny", "flux1_tiny_arch"}) {
    const Tensor want = test::golden(set, "latents.initial_unpacked");
    const auto noise = TorchGenerator(0).randn(want.numel());
    test::expect_close(from_vector(noise, want.shape()), want, 2e-6, 0, set + " seed-0 noise");
  }
}

}  // namespace
}  // namespace kiln
