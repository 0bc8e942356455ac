// FluxPipeline end to end against Diffusers: final latents and the decoded image, from the
// golden initial noise and from the seed that produced it; the errors users hit.
#include "exec/ops.h"
#include "call_args.h"
#include "golden.h"
#include "pipelines/flux_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class FluxPipelineGolden : public testing::TestWithParam<std::string> {};

// Tolerances: final latents max abs error <= 1e-4 (manifest fp32_final_latents); image within
// 1 level per channel (rounding at .5 boundaries).
TEST_P(FluxPipelineGolden, MatchesDiffusersFromTheGoldenNoise) {
  const std::string set = GetParam();
  const FluxPipeline pipe = test::on_test_device(FluxPipeline::from_pretrained(test::pipeline_dir(set)));
  PipelineCallArgs args = test::fixture_call_args(set);
  args.latents = test::golden(set, "latents.initial_packed");
  const PipelineOutput out = test::run_checking_each_step(pipe, args, set);
  const std::string last = "latents.after_step" + std::to_string(args.num_inference_steps - 1);
  test::expect_close(out.latents, test::golden(set, last), 1e-4, 0, set + " final latents");
  EXPECT_LE(test::byte_diff(out.image, test::golden_u8(set, "image.uint8")).second, 1) << set;
  EXPECT_EQ(out.timings.steps.size(), size_t(args.num_inference_steps));
}

TEST_P(FluxPipelineGolden, SeedZeroGivesDiffusersImage) {
  const std::string set = GetParam();
  const FluxPipeline pipe = test::on_test_device(FluxPipeline::from_pretrained(test::pipeline_dir(set)));
  PipelineCallArgs args = test::fixture_call_args(set);
  args.seed = 0;  // the fixtures' noise came from torch.Generator("cpu").manual_seed(0)
  const PipelineOutput out = pipe(args);
  EXPECT_LE(test::byte_diff(out.image, test::golden_u8(set, "image.uint8")).second, 1) << set;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FluxPipelineGolden, testing::Values("flux1_tiny", "flux1_tiny_arch"));

TEST(FluxPipeline, PackAndUnpackAreInverse) {
  const Tensor x = test::random_tensor({1, 3, 4, 6}, 7);
  const Tensor packed = FluxPipeline::pack_latents(x);
  EXPECT_EQ(packed.shape(), (Shape{1, 6, 12}));
  EXPECT_EQ(to_vector(FluxPipeline::unpack_latents(packed, 4, 6)), to_vector(x));
  // packed[b, i*(w/2)+j, c*4 + dy*2 + dx] = x[b, c, 2i+dy, 2j+dx]
  const auto p = to_vector(packed), xs = to_vector(x);
  const int64_t i = 1, j = 2, c = 1, dy = 1, dx = 0;  // token i*3+j, feature c*4+dy*2+dx
  EXPECT_EQ(p[size_t((i * 3 + j) * 12 + c * 4 + dy * 2 + dx)], xs[size_t((c * 4 + 2 * i + dy) * 6 + 2 * j + dx)]);
}

TEST(FluxPipeline, ErrorsNameWhatIsWrong) {
  const fs::path dir = fs::temp_directory_path() / "kiln_pipe_errors";
  fs::remove_all(dir);
  fs::copy(test::pipeline_dir("flux1_tiny"), dir, fs::copy_options::recursive);
  fs::remove_all(dir / "vae");
  test::expect_error([&] { FluxPipeline::from_pretrained(dir); }, {"[pipeline]", "vae", "missing"});
  fs::remove_all(dir);
  const FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny"));
  PipelineCallArgs args = test::fixture_call_args("flux1_tiny");
  args.num_inference_steps = 0;
  test::expect_error([&] { pipe(args); }, {"num_inference_steps must be at least 1, got 0"});
  args = test::fixture_call_args("flux1_tiny");
  args.latents = zeros({1, 5, 4});
  test::expect_error([&] { pipe(args); }, {"initial latents have shape [1,5,4]", "[1,256,4]"});
}

TEST(FluxPipeline, SizesAreRoundedDownWithAWarning) {
  const FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny"));
  PipelineCallArgs args = test::fixture_call_args("flux1_tiny");
  args.height = 37;  // vae_scale_factor 1: multiples of 2
  args.width = 33;
  args.num_inference_steps = 1;
  const PipelineOutput out = pipe(args);
  EXPECT_EQ(out.height, 36);
  EXPECT_EQ(out.width, 32);
  ASSERT_EQ(out.warnings.size(), 1u);
  EXPECT_NE(out.warnings[0].find("rounded down to 36x32"), std::string::npos) << out.warnings[0];
}

}  // namespace
}  // namespace kiln
