// The call argument table (pipelines/call_arguments.h): it is consistent, and a pipeline
// refuses every argument it does not take, naming it.
#include <set>

#include <gtest/gtest.h>

#include "exec/ops.h"
#include "golden.h"
#include "pipelines/flux_pipeline.h"
#include "pipelines/stable_diffusion_3_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

TEST(CallArguments, TheTableIsConsistent) {
  std::set<std::string> names, flags;
  const auto& classes = DiffusionPipeline::supported_classes();
  const PipelineCallArgs none;
  for (const CallArgument& a : call_arguments()) {
    EXPECT_TRUE(names.insert(a.name).second) << a.name;
    EXPECT_TRUE(flags.insert(a.flag).second) << a.flag;
    EXPECT_EQ(std::string(a.flag).rfind("--", 0), 0u) << a.flag;
    EXPECT_EQ(call_argument_named(a.name), &a);
    EXPECT_EQ(call_argument_of_flag(a.flag), &a);
    EXPECT_FALSE(is_set(none, a)) << a.name << ": PipelineCallArgs{} sets it";
    for (const std::string& c : a.pipelines)
      EXPECT_NE(std::find(classes.begin(), classes.end(), c), classes.end()) << a.name << ": " << c;
    for (const auto& [c, value] : a.defaults) {
      EXPECT_TRUE(takes(a, c)) << a.name << ": a default for " << c << ", which does not take it";
      EXPECT_EQ(call_argument_default(a.name, c), value);
    }
  }
  test::expect_error([] { call_argument_default("seed", FluxPipeline::kClassName); }, {"states no default"});
}

// Every argument a class does not take, set to a value in its bounds, is refused before any work,
// naming it, its flag and the classes that take it.
TEST(CallArguments, APipelineRefusesEveryArgumentItDoesNotTake) {
  const auto refuses_others = [](const DiffusionPipeline& pipe) {
    int refused = 0;
    for (const CallArgument& a : call_arguments()) {
      if (takes(a, pipe.class_name())) continue;
      PipelineCallArgs args;
      args.prompt = "x";
      args.num_inference_steps = 1;
      args.height = args.width = 64;
      const bool text = std::holds_alternative<std::optional<std::string> PipelineCallArgs::*>(a.field);
      set_from_text(args, a, text ? "x" : std::to_string(int64_t(a.lo)));
      ASSERT_TRUE(is_set(args, a)) << a.name;
      test::expect_error([&] { pipe(args); }, {std::string(a.name) + " (" + a.flag + ") is not an argument of " +
                                              pipe.class_name()});
      ++refused;
    }
    EXPECT_GT(refused, 0) << pipe.class_name();
  };
  refuses_others(FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny_arch")));
  refuses_others(StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir("sd35_tiny_arch")));
  const FluxPipeline flux = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny_arch"));
  PipelineCallArgs args;
  args.prompt = "x";
  args.prompt_3 = "x";
  test::expect_error([&] { flux(args); },
                     {"[pipeline] prompt_3 (--prompt-3) is not an argument of FluxPipeline; StableDiffusion3Pipeline "
                      "takes it"});
}

}  // namespace
}  // namespace kiln
