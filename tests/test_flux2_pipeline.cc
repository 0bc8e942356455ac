// Flux2Pipeline and Flux2KleinPipeline against Diffusers: flux2_tiny (Diffusers' own golden of
// Flux2Pipeline: Mistral3 text encoder, guidance embedder) and flux2_klein_tiny (made by
// tests/fixtures/generate/flux2_klein_tiny.py with Diffusers 0.42.1: Qwen3 text encoder with GQA
// and q/k norms, real classifier-free guidance, and its step-distilled twin). Prompt encoding,
// the schedule, the latents after every step, the VAE input and the image, from the golden noise
// and from the seed; modes; offload; the errors users hit.
// Tolerances: the manifests' 1e-4 (f32), images within 1 level.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "call_args.h"
#include "exec/executable_store.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "golden.h"
#include "models/flux2/flux2_transformer.h"
#include "pipelines/flux2_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDev = "flux2_tiny";
constexpr const char* kKlein = "flux2_klein_tiny";

nlohmann::json manifest(const std::string& set) {
  std::ifstream in(test::fixture(set) / "manifest.json");
  return nlohmann::json::parse(in);
}
Tensor g(const std::string& set, const std::string& key) { return test::golden(set, key); }

PipelineOptions options_with_layers(const std::string& set) {
  PipelineOptions o;
  o.text_encoder_out_layers = manifest(set)["inputs"]["text_encoder_out_layers"].get<std::vector<int64_t>>();
  return o;
}

// The klein fixture's distilled twin: the same components with model_index.json's is_distilled true
// (made once, removed when the test process exits).
fs::path distilled_klein_dir() {
  static const test::ScopedTempDir scoped("klein_distilled");
  const fs::path& dir = scoped.path();
  if (!fs::exists(dir / "model_index.json")) {
    fs::copy(test::pipeline_dir(kKlein), dir, fs::copy_options::recursive);
    fs::copy_file(test::fixture(kKlein) / "pipeline_distilled" / "model_index.json", dir / "model_index.json",
                  fs::copy_options::overwrite_existing);
  }
  return dir;
}

const Flux2Pipeline& dev_pipe() {
  static const Flux2Pipeline p =
      test::on_test_device(Flux2Pipeline::from_pretrained(test::pipeline_dir(kDev), options_with_layers(kDev)));
  return p;
}
const Flux2KleinPipeline& klein_pipe() {
  static const Flux2KleinPipeline p =
      test::on_test_device(Flux2KleinPipeline::from_pretrained(test::pipeline_dir(kKlein), options_with_layers(kKlein)));
  return p;
}

// The fixture's call, from Diffusers' initial noise.
PipelineCallArgs call_args(const std::string& set, const std::string& run = "") {
  PipelineCallArgs a = test::fixture_call_args(set, run);
  a.latents = g(set, "latents.initial_patchified");
  return a;
}

// The run's latents after every step (Diffusers' callback_on_step_end), then the image.
PipelineOutput run_checked(const DiffusionPipeline& pipe, PipelineCallArgs args, const std::string& set,
                           const std::string& prefix) {
  int64_t seen = 0;
  args.callback_on_step_end = [&](int64_t i, const Tensor& latents) {
    test::expect_close(latents, g(set, prefix + "latents.after_step" + std::to_string(i)), 1e-4, 0,
                       set + " " + prefix + "latents after step " + std::to_string(i));
    ++seen;
  };
  PipelineOutput out = pipe(args);
  EXPECT_EQ(seen, args.num_inference_steps);
  return out;
}

// ---- prompt encoding ----

TEST(Flux2PipelineGolden, DevPromptEncodingMatchesDiffusers) {
  const Flux2Pipeline& pipe = dev_pipe();
  const nlohmann::json m = manifest(kDev);
  EXPECT_EQ(pipe.chat_text(m["inputs"]["prompt"].get<std::string>()),
            m["derived"]["chat_template_rendered"].get<std::string>());
  const auto e = pipe.encode_prompt(m["inputs"]["prompt"].get<std::string>(),
                                    m["inputs"]["max_sequence_length"].get<int64_t>(), {1});
  EXPECT_EQ(e.input_ids, to_int_vector(g(kDev, "mistral.input_ids")));
  EXPECT_EQ(e.attention_mask, to_int_vector(g(kDev, "mistral.attention_mask")));
  test::expect_close(e.prompt_embeds, g(kDev, "encode_prompt.prompt_embeds"), 1e-5, 0, "dev prompt_embeds");
  EXPECT_EQ(to_int_vector(e.text_ids), to_int_vector(g(kDev, "encode_prompt.text_ids")));
}

TEST(Flux2PipelineGolden, KleinPromptEncodingMatchesDiffusers) {
  const Flux2KleinPipeline& pipe = klein_pipe();
  const nlohmann::json m = manifest(kKlein);
  const int64_t msl = m["inputs"]["max_sequence_length"].get<int64_t>();
  const auto layers = m["inputs"]["text_encoder_out_layers"].get<std::vector<int64_t>>();
  for (const auto& [which, text, embeds] :
       {std::tuple{"prompt", m["inputs"]["prompt"].get<std::string>(), "encode_prompt.prompt_embeds"},
        std::tuple{"negative", std::string(), "encode_prompt.negative_prompt_embeds"}}) {
    SCOPED_TRACE(which);
    const auto e = pipe.encode_prompt(text, msl, layers);
    EXPECT_EQ(e.chat_text, m["derived"][std::string("chat_template_rendered_") + which].get<std::string>());
    EXPECT_EQ(e.input_ids, to_int_vector(g(kKlein, std::string("qwen3.") + which + ".input_ids")));
    EXPECT_EQ(e.attention_mask, to_int_vector(g(kKlein, std::string("qwen3.") + which + ".attention_mask")));
    test::expect_close(e.prompt_embeds, g(kKlein, embeds), 1e-5, 0, "klein prompt_embeds");
  }
}

TEST(Flux2PipelineGolden, EmpiricalMuAndSchedule) {
  const nlohmann::json m = manifest(kKlein);
  EXPECT_DOUBLE_EQ(Flux2Pipeline::compute_empirical_mu(m["derived"]["image_seq_len"].get<int64_t>(),
                                                       m["inputs"]["num_inference_steps"].get<int64_t>()),
                   m["derived"]["mu"].get<double>());
  EXPECT_DOUBLE_EQ(Flux2Pipeline::compute_empirical_mu(256, 2), manifest(kDev)["derived"]["mu"].get<double>());
  // The spec's worked values (flux2.md §5.1).
  EXPECT_NEAR(Flux2Pipeline::compute_empirical_mu(4096, 50), 2.0233512, 1e-6);
  EXPECT_NEAR(Flux2Pipeline::compute_empirical_mu(1024, 50), 1.7019562, 1e-6);
  EXPECT_NEAR(Flux2Pipeline::compute_empirical_mu(8192, 50), 0.00016927 * 8192 + 0.45666666, 1e-12);
}

// ---- whole runs ----

TEST(Flux2PipelineGolden, DevRunMatchesDiffusersStepByStep) {
  const PipelineOutput out = run_checked(dev_pipe(), call_args(kDev), kDev, "");
  EXPECT_LE(test::byte_diff(out.image, test::golden_u8(kDev, "image.uint8")).second, 1);
}

TEST(Flux2PipelineGolden, KleinWithClassifierFreeGuidanceMatchesDiffusers) {
  EXPECT_FALSE(klein_pipe().is_distilled());
  const PipelineOutput out = run_checked(klein_pipe(), call_args(kKlein, "cfg"), kKlein, "cfg.");
  EXPECT_LE(test::byte_diff(out.image, test::golden_u8(kKlein, "cfg.image.uint8")).second, 1);
}

TEST(Flux2PipelineGolden, DistilledKleinRunsOneCallPerStepAndWarnsAboutGuidance) {
  const Flux2KleinPipeline pipe = Flux2KleinPipeline::from_pretrained(distilled_klein_dir(), options_with_layers(kKlein));
  EXPECT_TRUE(pipe.is_distilled());
  PipelineOutput out = run_checked(pipe, call_args(kKlein, "distilled"), kKlein, "distilled.");
  EXPECT_LE(test::byte_diff(out.image, test::golden_u8(kKlein, "distilled.image.uint8")).second, 1);
  EXPECT_TRUE(out.warnings.empty());
  PipelineCallArgs guided = call_args(kKlein, "distilled");
  guided.guidance_scale = 4.0;  // Diffusers ignores it (and logs a warning): the same image
  const PipelineOutput out4 = pipe(guided);
  EXPECT_EQ(out4.image, out.image);
  ASSERT_EQ(out4.warnings.size(), 1u);
  EXPECT_NE(out4.warnings[0].find("is_distilled"), std::string::npos) << out4.warnings[0];
}

TEST(Flux2PipelineGolden, SeedZeroGivesDiffusersImage) {
  PipelineCallArgs dev = call_args(kDev);
  dev.latents = Tensor();
  dev.seed = 0;
  EXPECT_LE(test::byte_diff(dev_pipe()(dev).image, test::golden_u8(kDev, "image.uint8")).second, 1);
  PipelineCallArgs klein = call_args(kKlein, "cfg");
  klein.latents = Tensor();
  klein.seed = 0;  // the fixture's noise is torch.Generator("cpu").manual_seed(0)'s
  EXPECT_LE(test::byte_diff(klein_pipe()(klein).image, test::golden_u8(kKlein, "cfg.image.uint8")).second, 1);
}

TEST(Flux2PipelineGolden, FromPretrainedBuildsTheClassModelIndexNames) {
  const auto dev = DiffusionPipeline::from_pretrained(test::pipeline_dir(kDev), options_with_layers(kDev));
  EXPECT_STREQ(dev->class_name(), "Flux2Pipeline");
  EXPECT_EQ(dev->model_cpu_offload_seq(), (std::vector<std::string>{"text_encoder", "transformer", "vae"}));
  const auto klein = DiffusionPipeline::from_pretrained(test::pipeline_dir(kKlein), options_with_layers(kKlein));
  EXPECT_STREQ(klein->class_name(), "Flux2KleinPipeline");
}

// ---- runtime: modes, compile, offload ----

class Flux2PipelineRuntime : public testing::Test {
 protected:
  void SetUp() override {
    clear_executable_cache();
    reset_compile_stats();
    set_executable_cache_dir({});
  }
};

TEST_F(Flux2PipelineRuntime, ModesAndCompileGiveTheSameImageByteForByte) {
  const fs::path dir = test::pipeline_dir(kKlein);
  const PipelineCallArgs args = call_args(kKlein, "cfg");
  std::vector<uint8_t> want;
  {
    EagerModeGuard strict(EagerMode::DeferNever);
    want = klein_pipe()(args).image;
  }
  {
    EagerModeGuard deferred(EagerMode::DeferAndFuse);
    EXPECT_EQ(klein_pipe()(args).image, want) << "deferred and fused";
  }
  for (const CompileScope scope : {CompileScope::kFull, CompileScope::kRepeatedBlocks}) {
    Flux2KleinPipeline pipe = Flux2KleinPipeline::from_pretrained(dir, options_with_layers(kKlein));
    pipe.compile_transformer(scope);
    const CompileStats before = compile_stats();
    EXPECT_EQ(pipe(args).image, want) << (scope == CompileScope::kFull ? "whole transformer" : "repeated blocks");
    const uint64_t compiles = compile_stats().compiles - before.compiles;
    EXPECT_EQ(compiles, scope == CompileScope::kFull ? 1u : 2u) << "one per signature / per block class";
    PipelineCallArgs more_steps = args;
    more_steps.num_inference_steps = 5;
    const uint64_t at = compile_stats().compiles;
    pipe(more_steps);
    EXPECT_EQ(compile_stats().compiles, at) << "a new step count never recompiles";
  }
}

TEST_F(Flux2PipelineRuntime, ModelOffloadGivesTheSameImageAndMovesEachComponentOnce) {
  const PipelineCallArgs args = call_args(kKlein, "cfg");
  const std::vector<uint8_t> want = klein_pipe()(args).image;
  Flux2KleinPipeline pipe = Flux2KleinPipeline::from_pretrained(test::pipeline_dir(kKlein), options_with_layers(kKlein));
  pipe.enable_model_cpu_offload();
  EXPECT_EQ(pipe(args).image, want);
  std::vector<std::string> onloads;
  for (const OffloadEvent& e : pipe.offload_events())
    if (e.action == "onload") onloads.push_back(e.component);
  EXPECT_EQ(onloads, (std::vector<std::string>{"text_encoder", "transformer", "vae"}));
}

// ---- errors ----

TEST(Flux2PipelineErrors, ArgumentsFlux2DoesNotTake) {
  PipelineCallArgs a = call_args(kKlein, "cfg");
  a.negative_prompt = "blurry";
  test::expect_error([&] { klein_pipe()(a); }, {"negative_prompt", "Flux2KleinPipeline"});
  a = call_args(kDev);
  a.prompt_2 = "x";
  test::expect_error([&] { dev_pipe()(a); }, {"prompt_2", "Flux2Pipeline"});
}

TEST(Flux2PipelineErrors, OutLayersBeyondWhatWasLoadedAreNamed) {
  PipelineCallArgs a = call_args(kKlein, "cfg");
  a.text_encoder_out_layers = {1, 2, 4};
  test::expect_error([&] { klein_pipe()(a); }, {"text_encoder_out_layers"});
  a.text_encoder_out_layers = {1, 2};
  test::expect_error([&] { klein_pipe()(a); }, {"text_encoder_out_layers", "2 layers"});
}

TEST(Flux2PipelineErrors, LatentsOfTheWrongShapeAreNamed) {
  PipelineCallArgs a = call_args(kKlein, "cfg");
  a.latents = zeros({1, 8, 4, 4});
  test::expect_error([&] { klein_pipe()(a); }, {"initial latents", "[1,8,8,8]", "[1,64,8]"});
}

// Weights read in place must fit the machine: a component larger than its memory would be
// re-read from disk page by page (FLUX.2-dev's 64 GB transformer on a 23 GB machine, say). The
// check names the component, the checkpoint's bytes and what would run it, before any work.
TEST(Flux2PipelineErrors, AComponentLargerThanTheMachineFailsBeforeAnyWork) {
  const Flux2KleinPipeline& pipe = klein_pipe();
  const MemoryEstimate e = pipe.estimate_memory(call_args(kKlein, "cfg"));
  ASSERT_EQ(e.placement, "host");
  const ComponentMemory* worst = &e.components[0];
  for (const ComponentMemory& m : e.components)
    if (m.weight_bytes + m.activation_bytes > worst->weight_bytes + worst->activation_bytes) worst = &m;
  const size_t need = worst->weight_bytes + worst->activation_bytes + e.carried_bytes;
  EXPECT_EQ(pipe.host_working_set_misfit(e, need), std::nullopt) << "exactly enough memory";
  const auto msg = pipe.host_working_set_misfit(e, need - 1);
  ASSERT_TRUE(msg.has_value());
  for (const std::string& part :
       std::vector<std::string>{"Flux2KleinPipeline reads its " + worst->name, format_bytes(worst->weight_bytes),
                                "text_encoder", "transformer", "vae", "--tp N", "KILN_HOST_MEMORY_CHECK=0"})
    EXPECT_NE(msg->find(part), std::string::npos) << part << " in: " << *msg;
  MemoryEstimate offloaded = e;
  offloaded.placement = "model offload";  // the device-memory check covers the other placements
  EXPECT_EQ(pipe.host_working_set_misfit(offloaded, 1), std::nullopt);
}

}  // namespace
}  // namespace kiln
