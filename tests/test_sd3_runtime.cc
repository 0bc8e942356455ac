// Every runtime feature on StableDiffusion3Pipeline, as on FLUX: strict eager, deferred, the
// whole transformer compiled and compile_repeated_blocks give the same image byte for byte;
// blocks compile once per block structure and a new step count compiles nothing; model offload
// gives the same image one component at a time within the plan's bound, and a capacity only
// offload fits fails fast for everything-on-the-device.
#include <cstring>
#include <set>

#include "call_args.h"
#include "devices/runtime.h"
#include "exec/compile.h"
#include "exec/executable_store.h"
#include "exec/mode.h"
#include "exec/profile.h"
#include "golden.h"
#include "models/sd3/sd3_transformer.h"
#include "pipelines/stable_diffusion_3_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

// The fixture's call (manifest "inputs"), from the seed alone.
PipelineCallArgs call_args(const std::string& set) {
  PipelineCallArgs a = test::fixture_call_args(set);
  a.seed = 0;
  return a;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = to_vector(a), y = to_vector(b);
  return a.shape() == b.shape() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

CompileOptions fullgraph() {
  CompileOptions o;
  o.fullgraph = true;
  return o;
}

class SD3Modes : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    clear_executable_cache();
    reset_compile_stats();
    set_executable_cache_dir({});
  }
};

// With skip-layer guidance on one step, so the batch-1 skip pass runs in every mode too.
TEST_P(SD3Modes, EveryModeGivesTheSameImageByteForByte) {
  const std::string set = GetParam();
  PipelineCallArgs args = call_args(set);
  args.skip_guidance_layers = {0};
  args.skip_layer_guidance_start = 0.0;
  args.skip_layer_guidance_stop = 0.5;
  PipelineOutput eager, deferred;
  {
    EagerModeGuard strict(EagerMode::DeferNever);
    eager = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir(set))(args);
  }
  {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    deferred = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir(set))(args);
  }
  EXPECT_EQ(deferred.image, eager.image) << set << " deferred";
  EXPECT_TRUE(same_bits(deferred.latents, eager.latents)) << set << " deferred";
  for (CompileScope scope : {CompileScope::kFull, CompileScope::kRepeatedBlocks}) {
    StableDiffusion3Pipeline pipe = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir(set));
    pipe.compile_transformer(scope, fullgraph());
    const PipelineOutput compiled = pipe(args);
    const char* name = scope == CompileScope::kFull ? "compiled full" : "compiled blocks";
    EXPECT_EQ(compiled.image, eager.image) << set << " " << name;
    EXPECT_TRUE(same_bits(compiled.latents, eager.latents)) << set << " " << name;
  }
  EXPECT_EQ(compile_stats().eager_fallbacks, 0u);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SD3Modes, testing::Values("sd3_tiny", "sd35_tiny_arch"));

std::pair<uint64_t, uint64_t> traces_and_compiles_of(const StableDiffusion3Pipeline& pipe, const PipelineCallArgs& a) {
  const CompileStats before = compile_stats();
  pipe(a);
  const CompileStats after = compile_stats();
  return {after.traces - before.traces, after.compiles - before.compiles};
}

// sd35_tiny_arch has two block structures (block 0: dual attention; block 1: the
// context_pre_only last block); sd3_tiny one (its only block is the last).
TEST_P(SD3Modes, BlocksCompileOncePerBlockStructureAndStepCountsNever) {
  const std::string set = GetParam();
  StableDiffusion3Pipeline pipe = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir(set));
  std::set<std::tuple<bool, bool, bool>> structures;
  for (int64_t i = 0; i < pipe.transformer().config().num_layers; ++i) {
    const auto s = pipe.transformer().config().block_structure(i);
    structures.insert({s.dual_attention, s.context_pre_only, s.qk_norm});
  }
  pipe.compile_transformer(CompileScope::kRepeatedBlocks, fullgraph());
  const PipelineCallArgs base = call_args(set);
  using Pair = std::pair<uint64_t, uint64_t>;
  const Pair first = traces_and_compiles_of(pipe, base);
  EXPECT_EQ(first.second, structures.size()) << set << ": one executable per block structure";
  std::printf("  %-15s compile_repeated_blocks: %zu block structure(s), %llu executable(s) compiled\n", set.c_str(),
              structures.size(), static_cast<unsigned long long>(first.second));
  for (int64_t steps : {1, 5}) {
    PipelineCallArgs a = base;
    a.num_inference_steps = steps;
    EXPECT_EQ(traces_and_compiles_of(pipe, a), Pair(0, 0)) << set << " " << steps << " steps";
  }
  PipelineCallArgs other = base;
  other.seed = 3;
  other.guidance_scale = 2.0;
  other.prompt = "another prompt";
  EXPECT_EQ(traces_and_compiles_of(pipe, other), Pair(0, 0)) << "seed, prompt and guidance are values";

  StableDiffusion3Pipeline whole = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir(set));
  whole.compile_transformer(CompileScope::kFull, fullgraph());
  EXPECT_EQ(traces_and_compiles_of(whole, base), Pair(1, 1)) << set << " whole transformer, first call";
  PipelineCallArgs more = base;
  more.num_inference_steps = 4;
  EXPECT_EQ(traces_and_compiles_of(whole, more), Pair(0, 0)) << set << " a new step count";
}

// kiln warmup's path: the executables a call uses exist before the call, which compiles nothing.
TEST_P(SD3Modes, WarmupCompilesWhatTheCallUses) {
  const std::string set = GetParam();
  StableDiffusion3Pipeline pipe = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir(set));
  pipe.compile_transformer(CompileScope::kFull, fullgraph());
  const PipelineCallArgs base = call_args(set);
  pipe.warmup(*base.height, *base.width, base.max_sequence_length);
  EXPECT_GT(compile_stats().compiles, 0u);
  EXPECT_EQ(traces_and_compiles_of(pipe, base), (std::pair<uint64_t, uint64_t>(0, 0)));
}

// The profile names each of the three encoders, the transformer and the VAE, and the encoders'
// seconds add up to the encode stage (as FLUX's, test_profile.cc).
TEST(SD3Profile, EachComponentIsItsOwnRow) {
  const StableDiffusion3Pipeline pipe = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir("sd35_tiny_arch"));
  const PipelineCallArgs args = call_args("sd35_tiny_arch");
  pipe(args);  // the first call builds kernels and pools memory: profile the second
  reset_profile();
  set_profiling(true);
  const PipelineOutput out = pipe(args);
  set_profiling(false);
  const Profile p = profile();
  double encode = 0;
  for (const char* c : {"text_encoder", "text_encoder_2", "text_encoder_3"}) {
    EXPECT_GT(p.component_seconds(c), 0.0) << c;
    encode += p.component_seconds(c);
  }
  EXPECT_GT(p.component_seconds("transformer"), 0.0);
  EXPECT_GT(p.component_seconds("vae"), 0.0);
  EXPECT_NEAR(encode, out.timings.encode, 0.15 * out.timings.encode);
}

class SD3Offload : public testing::Test {
 protected:
  void TearDown() override { runtime(Device::cpu()).set_memory_capacity(0); }
};

TEST_F(SD3Offload, OneComponentAtATimeTheSameImageWithinThePlan) {
  const char* set = "sd35_tiny_arch";
  const PipelineCallArgs args = call_args(set);
  const PipelineOutput in_place = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir(set))(args);
  StableDiffusion3Pipeline pipe = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir(set));
  pipe.enable_model_cpu_offload();
  const MemoryEstimate estimate = pipe.estimate_memory(args);
  synchronize(Device::cpu());
  runtime(Device::cpu()).reset_peak_memory();
  const PipelineOutput offloaded = pipe(args);
  synchronize(Device::cpu());
  const size_t peak = runtime(Device::cpu()).memory().peak_bytes;
  EXPECT_EQ(offloaded.image, in_place.image);
  EXPECT_TRUE(same_bits(offloaded.latents, in_place.latents));
  std::vector<std::string> onloads;
  std::set<std::string> resident;
  for (const OffloadEvent& e : pipe.offload_events()) {
    if (e.action == "onload") onloads.push_back(e.component), resident.insert(e.component);
    else resident.erase(e.component);
    EXPECT_LE(resident.size(), 1u);
  }
  EXPECT_TRUE(resident.empty());
  // Each encoder reads the prompt and the negative prompt while it is there: it arrives once.
  EXPECT_EQ(onloads, (std::vector<std::string>{"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"}));
  size_t bound = 0;
  for (const ComponentMemory& m : estimate.components) bound = std::max(bound, m.weight_bytes + m.activation_bytes);
  bound += estimate.carried_bytes;
  EXPECT_EQ(estimate.required, bound);
  EXPECT_LE(peak, bound) << "offload peak " << peak << ", largest component + activations + carried " << bound;
  std::printf("  offload peak %zu, plan bound %zu\n", peak, bound);

  // A capacity only offload fits: everything-on-the-device fails before any step.
  pipe.to(Device::cpu());
  const MemoryEstimate all = pipe.estimate_memory(args);
  ASSERT_LT(estimate.required, all.required);
  pipe.enable_model_cpu_offload();
  runtime(Device::cpu()).set_memory_capacity((estimate.required + all.required) / 2);
  PipelineCallArgs counted = args;
  counted.vae_tiling = VaeTilingMode::kOff;
  int steps = 0;
  counted.on_step = [&](int64_t, int64_t, double) { ++steps; };
  {
    StableDiffusion3Pipeline placed = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir(set));
    placed.to(Device::cpu());
    test::expect_error([&] { placed(counted); },
                       {"[memory]", "text_encoder_3 ", "transformer ", "vae ", "--offload model"});
    EXPECT_EQ(steps, 0);
  }  // its device copies go back to the pool
  EXPECT_EQ(pipe(counted).image, in_place.image);
}

}  // namespace
}  // namespace kiln
