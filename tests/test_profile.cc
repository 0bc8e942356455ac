// The profile (exec/profile.h, `kiln generate --profile`): on the bundled model each stage's
// profiled seconds (its components' launches plus the device's idle time between them) add up
// to the stage's measured time, every launch is counted once, bytes are the operands', and
// turning the profile on changes nothing in the image.
#include <gtest/gtest.h>

#include <cstdio>

#include "exec/counters.h"
#include "exec/dispatch.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "exec/profile.h"
#include "call_args.h"
#include "golden.h"
#include "pipelines/flux_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

struct Profiled {
  PipelineOutput out;
  Profile profile;
};

Profiled run_bundled(bool profile_on, EagerMode mode = EagerMode::DeferNever) {
  const EagerModeGuard guard(mode);
  const FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny_arch"));
  PipelineCallArgs args = test::fixture_call_args("flux1_tiny_arch");
  args.seed = 0;
  pipe(args);  // the first call builds kernels and pools memory: time the second
  reset_profile();
  set_profiling(profile_on);
  Profiled r{pipe(args), profile()};
  set_profiling(false);
  return r;
}

double total(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

TEST(Profile, StageSecondsAddUpToTheStageTimes) {
  for (const EagerMode mode : {EagerMode::DeferNever, EagerMode::DeferAndFuse}) {
    const Profiled r = run_bundled(true, mode);
    const Profile& p = r.profile;
    const double encode = p.component_seconds("text_encoder") + p.component_seconds("text_encoder_2");
    const double steps = p.component_seconds("transformer"), decode = p.component_seconds("vae");
    const std::string m = eager_mode_name(mode);
    EXPECT_NEAR(encode, r.out.timings.encode, 0.1 * r.out.timings.encode) << m;
    EXPECT_NEAR(steps, total(r.out.timings.steps), 0.1 * total(r.out.timings.steps)) << m;
    EXPECT_NEAR(decode, r.out.timings.decode, 0.1 * r.out.timings.decode) << m;
    std::printf("[ info ] %s: profiled / measured seconds: encode %.3f, steps %.3f, decode %.3f\n", m.c_str(),
                encode / r.out.timings.encode, steps / total(r.out.timings.steps), decode / r.out.timings.decode);
    // Every kernel of the call is in some row, once (the launch counters count the same launches).
    uint64_t launches = 0;
    for (const auto& [key, row] : p.by_op) launches += row.launches;
    EXPECT_GT(p.by_op.count({"vae", "conv2d"}) + p.by_op.count({"vae", "conv2d+epilogue"}), 0u) << m;
    EXPECT_GT(launches, 100u) << m;
  }
}

TEST(Profile, CountsEachLaunchOnceWithItsOperandBytes) {
  const Tensor a = test::random_tensor({64, 32}, 1), b = test::random_tensor({64, 32}, 2);
  wait(a);
  wait(b);
  reset_counters();
  reset_profile();
  set_profiling(true, ProfileDetail::shapes);
  {
    const ProfileScope scope("unit");
    wait(a + b);
    wait(silu(a));
  }
  set_profiling(false);
  const Profile p = profile();
  ASSERT_EQ(p.by_op.count({"unit", "add"}), 1u);
  EXPECT_EQ(p.by_op.at({"unit", "add"}).launches, 1u);
  EXPECT_EQ(p.by_op.at({"unit", "add"}).bytes, 3u * 64 * 32 * 4);  // two inputs, one output
  EXPECT_EQ(p.by_op.at({"unit", "silu"}).bytes, 2u * 64 * 32 * 4);
  EXPECT_EQ(kernels_by_name().at("add"), 1u);
  ASSERT_EQ(p.launches.size(), 2u);
  EXPECT_EQ(p.launches[0].signature(), "add f32[64,32] f32[64,32] f32[64,32]");
  // Off: nothing is recorded.
  reset_profile();
  wait(a + b);
  EXPECT_TRUE(profile().by_op.empty());
}

TEST(Profile, TurningItOnChangesNothingInTheImage) {
  for (const EagerMode mode : {EagerMode::DeferNever, EagerMode::DeferAndFuse}) {
    const Profiled off = run_bundled(false, mode), on = run_bundled(true, mode);
    EXPECT_TRUE(off.profile.by_op.empty());
    EXPECT_FALSE(on.profile.by_op.empty());
    EXPECT_EQ(on.out.image, off.out.image) << eager_mode_name(mode);
    EXPECT_EQ(to_vector(on.out.latents), to_vector(off.out.latents)) << eager_mode_name(mode);
  }
}

}  // namespace
}  // namespace kiln
