// No silent black image (pipelines/pipeline_checks.h): bad values fail with the stage named, in
// every execution mode, and good values pass the same checks untouched.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "exec/compile.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "call_args.h"
#include "golden.h"
#include "io/safetensors.h"
#include "models/flux/flux_transformer.h"
#include "pipelines/flux_pipeline.h"
#include "pipelines/pipeline_checks.h"
#include "test_util.h"

namespace kiln {
namespace {

TEST(PipelineChecks, ProbesAreZeroForFiniteValuesAndNotOtherwise) {
  EXPECT_EQ(item(pipeline_checks::finite_probe(from_vector({1, -2, 3e38f}, {3}))), 0.0);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    const Tensor t = from_vector({1, bad, 3}, {3});
    EXPECT_NE(item(pipeline_checks::finite_probe(t)), 0.0) << bad;
    test::expect_error([&] { pipeline_checks::expect_finite(pipeline_checks::finite_probe(t), "stage x", "", {}, "cause y"); },
                       {"[pipeline] stage x produced NaN/Inf values; likely cause: cause y"});
  }
}

// The scan that names the cause skips the tensors the model never reads (a VAE's encoder half).
TEST(PipelineChecks, TheWeightScanNamesOnlyTensorsTheModelReads) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("kiln_scan_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  io::save_safetensors(dir / "diffusion_pytorch_model.safetensors",
                       {{"decoder.w", from_vector({1, 2}, {2})}, {"encoder.w", from_vector({nan, 1}, {2})}});
  const std::string named = pipeline_checks::nonfinite_weight(dir, {});
  EXPECT_NE(named.find("tensor 'encoder.w'"), std::string::npos) << named;
  EXPECT_EQ(pipeline_checks::nonfinite_weight(dir, {"encoder."}), "");
  std::filesystem::remove_all(dir);
}

TEST(PipelineChecks, NanInitialLatentsFailBeforeAnyWork) {
  const FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny"));
  PipelineCallArgs args = test::fixture_call_args("flux1_tiny");
  Tensor latents = test::golden("flux1_tiny", "latents.initial_packed");
  std::vector<float> v = to_vector(latents);
  v[3] = std::numeric_limits<float>::quiet_NaN();
  args.latents = from_vector(v, latents.shape());
  int steps = 0;
  args.on_step = [&](int64_t, int64_t, double) { ++steps; };
  test::expect_error([&] { pipe(args); }, {"initial latents hold NaN or Inf"});
  EXPECT_EQ(steps, 0);
}

// Latents so large that the first step overflows: the step is named, in strict eager, deferred
// and compiled mode alike, and the good run's latents are the same in all three.
TEST(PipelineChecks, AnOverflowingStepIsNamedInEveryMode) {
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny"));
  PipelineCallArgs args = test::fixture_call_args("flux1_tiny");
  const Tensor good = test::golden("flux1_tiny", "latents.initial_packed");
  std::vector<float> huge = to_vector(good);
  for (float& x : huge) x = std::copysign(3e38f, x);  // finite, but the first linear overflows
  const auto run = [&](const char* mode) {
    SCOPED_TRACE(mode);
    args.latents = from_vector(huge, good.shape());
    test::expect_error([&] { pipe(args); }, {"transformer step 1/2 produced NaN/Inf values; likely cause:"});
    args.latents = good;
    return to_vector(pipe(args).latents);
  };
  const std::vector<float> eager = run("eager");
  std::vector<float> deferred;
  {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    deferred = run("defer");
  }
  CompileOptions options;
  options.fullgraph = true;
  pipe.transformer().compile(options);
  const std::vector<float> compiled = run("compile");
  EXPECT_EQ(deferred, eager);
  EXPECT_EQ(compiled, eager);
}

}  // namespace
}  // namespace kiln
