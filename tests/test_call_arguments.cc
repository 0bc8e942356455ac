// The call argument table (pipelines/call_arguments.h): it is consistent, a pipeline refuses
// every argument it does not take naming it, and the arguments added through it alone —
// SD3's clip_skip, FLUX.1's negative_prompt with true_cfg_scale (real classifier-free
// guidance) — give Diffusers' latents and image (tests/fixtures/generate/call_arguments.py),
// the same in strict eager and deferred modes.
#include <cmath>
#include <set>

#include <gtest/gtest.h>

#include "call_args.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "golden.h"
#include "io/safetensors.h"
#include "models/flux/flux_transformer.h"
#include "pipelines/flux_pipeline.h"
#include "pipelines/stable_diffusion_3_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

// A reference file the generator wrote beside a fixture's golden.safetensors.
const io::SafetensorsFile& reference(const std::string& set, const std::string& file) {
  static std::map<std::string, std::unique_ptr<io::SafetensorsFile>> files;
  auto& f = files[set + "/" + file];
  if (!f) f = std::make_unique<io::SafetensorsFile>(test::fixture(set) / file);
  return *f;
}

// Diffusers' float image [1, H, W, 3] in [0, 1], as the uint8 PIL image it saves.
std::vector<uint8_t> as_u8(const Tensor& image) {
  std::vector<uint8_t> out;
  for (float v : to_vector(image)) out.push_back(uint8_t(std::lround(std::clamp(v, 0.0f, 1.0f) * 255.0f)));
  return out;
}

// The final latents within the fixtures' 1e-4, the image within one level.
void expect_reference(const PipelineOutput& out, const io::SafetensorsFile& ref, const std::string& prefix,
                      const std::string& what) {
  test::expect_close(out.latents, ref.load(prefix + "latents.final"), 1e-4, 0, what + " final latents");
  const auto [differ, worst] = test::byte_diff(out.image, as_u8(ref.load(prefix + "image")));
  EXPECT_LE(worst, 1) << what << ": " << differ << " image values differ";
}

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

// clip_skip 1: both CLIP encoders' prompt embeddings are hidden_states[-3] (the negative prompt's
// stay hidden_states[-2], as Diffusers), with and without classifier-free guidance.
TEST(CallArguments, Sd3ClipSkipMatchesDiffusers) {
  const std::string set = "sd35_tiny_arch";
  const auto& ref = reference(set, "clip_skip.safetensors");
  const StableDiffusion3Pipeline pipe = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir(set));
  for (const auto& [prefix, guidance] : {std::pair{"cfg.", 4.5}, {"nocfg.", 1.0}}) {
    PipelineCallArgs args = test::fixture_call_args(set);
    args.guidance_scale = guidance;
    args.clip_skip = 1;
    args.latents = ref.load(std::string(prefix) + "latents.initial");
    const PipelineOutput out = pipe(args);
    expect_reference(out, ref, prefix, set + " clip_skip 1, " + prefix);
    // Without it the image is the plain one: the argument is what changed it.
    args.clip_skip.reset();
    EXPECT_GT(test::byte_diff(pipe(args).image, out.image).second, 2) << prefix;
  }
  PipelineCallArgs args = test::fixture_call_args(set);
  args.clip_skip = 3;  // the tiny CLIP encoders have 3 layers: 0 to 2
  test::expect_error([&] { pipe(args); }, {"clip_skip is 3, expected 0 to 2"});
}

// negative_prompt + true_cfg_scale 4: two transformer passes per step combined as
// neg + 4 * (pos - neg), the same image in strict eager and deferred modes; either alone is a
// warning and the plain call's image.
TEST(CallArguments, FluxTrueCfgMatchesDiffusers) {
  const std::string set = "flux1_tiny_arch";
  const auto& ref = reference(set, "true_cfg.safetensors");
  const FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(set));
  PipelineCallArgs args = test::fixture_call_args(set);
  args.latents = ref.load("cfg.latents.initial");
  args.negative_prompt = "blurry, low quality";
  args.true_cfg_scale = 4.0;
  const PipelineOutput eager = pipe(args);
  expect_reference(eager, ref, "cfg.", set + " true CFG");
  {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    EXPECT_EQ(pipe(args).image, eager.image) << "deferred";
  }
  PipelineCallArgs plain = test::fixture_call_args(set);
  plain.latents = args.latents;
  const PipelineOutput want = pipe(plain);
  for (const bool negative : {true, false}) {
    PipelineCallArgs half = plain;
    if (negative) half.negative_prompt = "blurry";  // true_cfg_scale stays 1
    else half.true_cfg_scale = 4.0;                 // no negative prompt
    const PipelineOutput out = pipe(half);
    EXPECT_EQ(out.image, want.image) << negative;
    ASSERT_EQ(out.warnings.size(), 1u) << negative;
    EXPECT_NE(out.warnings[0].find(negative ? "negative_prompt is not used" : "true_cfg_scale 4.000000 is not used"),
              std::string::npos)
        << out.warnings[0];
  }
}

// The memory plan counts what true CFG keeps: the negative prompt's T5 and pooled embeddings,
// carried across the components like the prompt's (f32).
TEST(CallArguments, FluxTrueCfgIsInTheMemoryEstimate) {
  const std::string set = "flux1_tiny_arch";
  const FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(set));
  const PipelineCallArgs plain = test::fixture_call_args(set);
  PipelineCallArgs cfg = plain;
  cfg.negative_prompt = "blurry";
  cfg.true_cfg_scale = 4.0;
  const MemoryEstimate a = pipe.estimate_memory(plain), b = pipe.estimate_memory(cfg);
  const FluxTransformerConfig tc =
      FluxTransformerConfig::from_json(io::JsonConfig(test::pipeline_dir(set) / "transformer" / "config.json"));
  const size_t negative = size_t(*plain.max_sequence_length * tc.joint_attention_dim + tc.pooled_projection_dim) * 4;
  EXPECT_EQ(b.carried_bytes, a.carried_bytes + negative);
  EXPECT_EQ(b.required, a.required + negative);
  PipelineCallArgs unused = plain;  // a negative prompt without true_cfg_scale > 1 keeps nothing
  unused.negative_prompt = "blurry";
  EXPECT_EQ(pipe.estimate_memory(unused).carried_bytes, a.carried_bytes);
}

}  // namespace
}  // namespace kiln
