// StableDiffusion3Pipeline against Diffusers (tests/fixtures/sd3_tiny: SD3 layout, patch 1;
// sd35_tiny_arch: SD3.5 Medium's architecture, MMDiT-X with qk RMSNorm, patch 2): the three
// tokenizers, CLIP-L/G with projection, T5, encode_prompt, the final latents and the image, from
// the golden noise and from the seed; the pipeline base's dispatch; the errors users hit.
#include <fstream>

#include <nlohmann/json.hpp>

#include "call_args.h"
#include "exec/ops.h"
#include "golden.h"
#include "models/clip/clip_text_model.h"
#include "models/t5/t5_encoder.h"
#include "pipelines/flux_pipeline.h"
#include "pipelines/stable_diffusion_3_pipeline.h"
#include "schedulers/flow_match_euler.h"
#include "test_util.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

nlohmann::json manifest(const std::string& set) {
  std::ifstream in(test::fixture(set) / "manifest.json");
  return nlohmann::json::parse(in);
}

std::vector<int64_t> golden_ids(const std::string& set, const std::string& key) {
  return to_int_vector(test::golden(set, key));
}

class SD3PipelineGolden : public testing::TestWithParam<std::string> {};

TEST_P(SD3PipelineGolden, TokenizersMatchTransformers) {
  const std::string set = GetParam();
  const nlohmann::json m = manifest(set);
  const int64_t t5_len = m["inputs"]["max_sequence_length"].get<int64_t>();
  for (const char* name : {"tokenizer", "tokenizer_2"}) {
    const auto tok = tokenizers::ClipTokenizer::from_pretrained(test::pipeline_dir(set) / name);
    ASSERT_FALSE(m["tokenizer_probes"][name].empty());
    for (const auto& probe : m["tokenizer_probes"][name]) {
      SCOPED_TRACE(std::string(name) + " probe " + probe["text"].dump());
      EXPECT_EQ(tok.encode(probe["text"]), golden_ids(set, probe["key"]));
      EXPECT_EQ(tok.encode_padded(probe["text"]), golden_ids(set, probe["key_padded"]));
    }
  }
  const auto t5 = tokenizers::T5Tokenizer::from_pretrained(test::pipeline_dir(set) / "tokenizer_3");
  ASSERT_FALSE(m["tokenizer_probes"]["tokenizer_3"].empty());
  for (const auto& probe : m["tokenizer_probes"]["tokenizer_3"]) {
    SCOPED_TRACE("tokenizer_3 probe " + probe["text"].dump());
    EXPECT_EQ(t5.encode(probe["text"]), golden_ids(set, probe["key"]));
    EXPECT_EQ(t5.encode_padded(probe["text"], t5_len), golden_ids(set, probe["key_padded"]));
  }
}

// CLIPTextModelWithProjection: hidden_states[-2] (what SD3 reads), the final hidden state and
// text_embeds; T5's last hidden state. Tolerance: the manifest's 1e-5 for f32 text encoders.
TEST_P(SD3PipelineGolden, TextEncodersMatchTransformers) {
  const std::string set = GetParam();
  const fs::path dir = test::pipeline_dir(set);
  const std::pair<const char*, const char*> clips[] = {{"clip_l", "text_encoder"}, {"clip_g", "text_encoder_2"}};
  for (const auto& [key, folder] : clips) {
    const ClipTextModel enc = ClipTextModel::from_pretrained(dir / folder);
    ASSERT_TRUE(enc.config().with_projection) << folder;
    for (const char* which : {"prompt", "negative"}) {
      const std::string k = std::string(key) + "." + which;
      const ClipTextModel::Output o = enc.forward(test::golden(set, k + ".input_ids"), true);
      test::expect_close(o.hidden_states[o.hidden_states.size() - 2], test::golden(set, k + ".penultimate_hidden_state"),
                         1e-5, 0, set + " " + k + " penultimate");
      test::expect_close(o.last_hidden_state, test::golden(set, k + ".last_hidden_state"), 1e-5, 0, set + " " + k);
      test::expect_close(o.text_embeds, test::golden(set, k + ".text_embeds"), 1e-5, 0, set + " " + k + " text_embeds");
    }
  }
  const T5EncoderModel t5 = T5EncoderModel::from_pretrained(dir / "text_encoder_3");
  for (const char* which : {"prompt", "negative"}) {
    const std::string k = std::string("t5.") + which;
    test::expect_close(t5.forward(test::golden(set, k + ".input_ids")).last_hidden_state,
                       test::golden(set, k + ".last_hidden_state"), 1e-5, 0, set + " " + k);
  }
}

TEST_P(SD3PipelineGolden, EncodePromptMatchesDiffusers) {
  const std::string set = GetParam();
  const StableDiffusion3Pipeline pipe = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir(set));
  const PipelineCallArgs a = test::fixture_call_args(set);
  const auto pos = pipe.encode_prompt(a.prompt, a.prompt, a.prompt, *a.max_sequence_length);
  test::expect_close(pos.prompt_embeds, test::golden(set, "encode_prompt.prompt_embeds"), 1e-5, 0, set + " prompt_embeds");
  test::expect_close(pos.pooled_prompt_embeds, test::golden(set, "encode_prompt.pooled_prompt_embeds"), 1e-5, 0,
                     set + " pooled_prompt_embeds");
  const auto neg = pipe.encode_prompt("", "", "", *a.max_sequence_length);
  test::expect_close(neg.prompt_embeds, test::golden(set, "encode_prompt.negative_prompt_embeds"), 1e-5, 0,
                     set + " negative_prompt_embeds");
  test::expect_close(neg.pooled_prompt_embeds, test::golden(set, "encode_prompt.negative_pooled_prompt_embeds"), 1e-5,
                     0, set + " negative_pooled_prompt_embeds");
}

TEST_P(SD3PipelineGolden, SchedulerMatchesDiffusers) {
  const std::string set = GetParam();
  FlowMatchEulerDiscreteScheduler s(
      FlowMatchEulerConfig::load(test::pipeline_dir(set) / "scheduler" / "scheduler_config.json"));
  s.set_timesteps(test::fixture_call_args(set).num_inference_steps);
  EXPECT_EQ(s.timesteps(), to_vector(test::golden(set, "scheduler.timesteps")));
  EXPECT_EQ(s.sigmas(), to_vector(test::golden(set, "scheduler.sigmas")));
}

// Final latents within the manifest's 1e-4, the image within 1 level per channel.
TEST_P(SD3PipelineGolden, MatchesDiffusersFromTheGoldenNoise) {
  const std::string set = GetParam();
  const StableDiffusion3Pipeline pipe = test::on_test_device(StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir(set)));
  PipelineCallArgs args = test::fixture_call_args(set);
  args.latents = test::golden(set, "latents.initial");
  const PipelineOutput out = test::run_checking_each_step(pipe, args, set);
  const std::string last = "latents.after_step" + std::to_string(args.num_inference_steps - 1);
  const Tensor want = test::golden(set, last);
  test::expect_close(out.latents, want, 1e-4, 0, set + " final latents");
  const auto [differ, worst] = test::byte_diff(out.image, test::golden_u8(set, "image.uint8"));
  EXPECT_LE(worst, 1) << set;
  const auto g = to_vector(out.latents), w = to_vector(want);
  double err = 0;
  for (size_t i = 0; i < g.size() && i < w.size(); ++i) err = std::max(err, std::fabs(double(g[i]) - double(w[i])));
  std::printf("  %-15s final latents max abs err %.3g; image: %zu of %zu values differ, by at most %d\n",
              set.c_str(), err, differ, out.image.size(), worst);
  EXPECT_EQ(out.timings.steps.size(), size_t(args.num_inference_steps));
  EXPECT_EQ(out.guidance_scale, *args.guidance_scale);
}

TEST_P(SD3PipelineGolden, SeedZeroGivesDiffusersImage) {
  const std::string set = GetParam();
  const StableDiffusion3Pipeline pipe = test::on_test_device(StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir(set)));
  PipelineCallArgs args = test::fixture_call_args(set);
  args.seed = 0;  // the fixtures' noise came from torch.Generator("cpu").manual_seed(0)
  EXPECT_LE(test::byte_diff(pipe(args).image, test::golden_u8(set, "image.uint8")).second, 1) << set;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SD3PipelineGolden, testing::Values("sd3_tiny", "sd35_tiny_arch"));

TEST(DiffusionPipeline, FromPretrainedBuildsTheClassModelIndexNames) {
  const auto sd3 = DiffusionPipeline::from_pretrained(test::pipeline_dir("sd35_tiny_arch"));
  EXPECT_STREQ(sd3->class_name(), "StableDiffusion3Pipeline");
  EXPECT_EQ(sd3->model_cpu_offload_seq(),
            (std::vector<std::string>{"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"}));
  const auto flux = DiffusionPipeline::from_pretrained(test::pipeline_dir("flux1_tiny"));
  EXPECT_STREQ(flux->class_name(), "FluxPipeline");
  EXPECT_EQ(flux->model_cpu_offload_seq(),
            (std::vector<std::string>{"text_encoder", "text_encoder_2", "transformer", "vae"}));

  const fs::path dir = fs::temp_directory_path() / "kiln_unknown_pipeline";
  fs::remove_all(dir);
  fs::copy(test::pipeline_dir("sd3_tiny"), dir, fs::copy_options::recursive);
  nlohmann::json index = nlohmann::json::parse(std::ifstream(dir / "model_index.json"));
  index["_class_name"] = "StableDiffusionXLPipeline";
  std::ofstream(dir / "model_index.json") << index.dump();
  test::expect_error([&] { DiffusionPipeline::from_pretrained(dir); },
                     {"[pipeline]", "StableDiffusionXLPipeline", "FluxPipeline", "StableDiffusion3Pipeline"});
  fs::remove_all(dir);
}

// The same image through the base class as through the concrete one.
TEST(DiffusionPipeline, CallThroughTheBaseIsTheConcreteCall) {
  const auto base = DiffusionPipeline::from_pretrained(test::pipeline_dir("sd3_tiny"));
  const StableDiffusion3Pipeline pipe = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir("sd3_tiny"));
  const PipelineCallArgs args = test::fixture_call_args("sd3_tiny");
  EXPECT_EQ((*base)(args).image, pipe(args).image);
}

// Without text_encoder_3 (model_index.json [null, null]) the T5 embeddings are zeros, as in
// Diffusers: the call works, and a prompt_3 is reported as unused.
TEST(StableDiffusion3Pipeline, WithoutT5TheTextEmbeddingsAreZeros) {
  const fs::path dir = fs::temp_directory_path() / "kiln_sd3_no_t5";
  fs::remove_all(dir);
  fs::copy(test::pipeline_dir("sd35_tiny_arch"), dir, fs::copy_options::recursive);
  nlohmann::json index = nlohmann::json::parse(std::ifstream(dir / "model_index.json"));
  index["text_encoder_3"] = {nullptr, nullptr};
  index["tokenizer_3"] = {nullptr, nullptr};
  std::ofstream(dir / "model_index.json") << index.dump();
  fs::remove_all(dir / "text_encoder_3");
  const StableDiffusion3Pipeline pipe = StableDiffusion3Pipeline::from_pretrained(dir);
  EXPECT_FALSE(pipe.has_text_encoder_3());
  EXPECT_EQ(pipe.model_cpu_offload_seq(), (std::vector<std::string>{"text_encoder", "text_encoder_2", "transformer", "vae"}));
  const auto e = pipe.encode_prompt("a cat", "a cat", "a cat", 40);
  const std::vector<float> v = to_vector(slice(e.prompt_embeds, 1, 77, 77 + 40));
  EXPECT_EQ(*std::max_element(v.begin(), v.end()), 0.0f);
  EXPECT_EQ(*std::min_element(v.begin(), v.end()), 0.0f);
  PipelineCallArgs args = test::fixture_call_args("sd35_tiny_arch");
  args.prompt_3 = "unused";
  const PipelineOutput out = pipe(args);
  ASSERT_FALSE(out.warnings.empty());
  EXPECT_NE(out.warnings.back().find("text_encoder_3"), std::string::npos) << out.warnings.back();
  fs::remove_all(dir);
}

// Skip-layer guidance: on the steps inside (n·start, n·stop) a third transformer pass without the
// listed blocks pushes the velocity; outside them the image is unchanged.
TEST(StableDiffusion3Pipeline, SkipLayerGuidanceChangesOnlyTheStepsItCovers) {
  const StableDiffusion3Pipeline pipe = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir("sd35_tiny_arch"));
  PipelineCallArgs args = test::fixture_call_args("sd35_tiny_arch");
  args.latents = test::golden("sd35_tiny_arch", "latents.initial");
  const Tensor plain = pipe(args).latents;
  args.skip_guidance_layers = {0};
  args.skip_layer_guidance_start = 0.0;
  args.skip_layer_guidance_stop = 1.0;  // steps 1 and 2 of 3 (strictly inside (0, 3))
  const Tensor slg = pipe(args).latents;
  const auto a = to_vector(plain), b = to_vector(slg);
  float diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(a[i] - b[i]));
  EXPECT_GT(diff, 1e-3f);
  args.skip_layer_guidance_stop = 0.2;  // 0 < i < 0.6: no step
  EXPECT_EQ(to_vector(pipe(args).latents), a);
}

// Components in different dtypes (--dtype f32,text_encoder=bf16): the pooled outputs are joined
// in the wider dtype, as torch.cat promotes, and the call runs.
TEST(StableDiffusion3Pipeline, ComponentsMayHaveTheirOwnDtypes) {
  PipelineOptions options;
  options.dtype = DType::f32;
  options.component_dtype["text_encoder"] = DType::bf16;
  const StableDiffusion3Pipeline pipe = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir("sd35_tiny_arch"), options);
  EXPECT_EQ(pipe.dtypes()[0], (std::pair<std::string, DType>{"text_encoder", DType::bf16}));
  const PipelineCallArgs args = test::fixture_call_args("sd35_tiny_arch");
  const auto e = pipe.encode_prompt(args.prompt, args.prompt, args.prompt, *args.max_sequence_length);
  EXPECT_EQ(e.pooled_prompt_embeds.dtype(), DType::f32);
  // CLIP-L's half computed in bf16: within bf16 precision of Diffusers' f32 embedding.
  test::expect_close(e.pooled_prompt_embeds, test::golden("sd35_tiny_arch", "encode_prompt.pooled_prompt_embeds"), 0,
                     2e-2, "pooled embedding with a bf16 CLIP-L");
  EXPECT_EQ(pipe(args).image.size(), size_t(128 * 128 * 3));
}

TEST(StableDiffusion3Pipeline, ErrorsNameTheArgument) {
  const StableDiffusion3Pipeline pipe = StableDiffusion3Pipeline::from_pretrained(test::pipeline_dir("sd35_tiny_arch"));
  PipelineCallArgs args = test::fixture_call_args("sd35_tiny_arch");
  args.skip_guidance_layers = {7, 8, 9};
  test::expect_error([&] { pipe(args); }, {"[pipeline]", "skip_guidance_layers", "7", "0..1"});
  args = test::fixture_call_args("sd35_tiny_arch");
  args.max_sequence_length = 513;
  test::expect_error([&] { pipe(args); }, {"[pipeline]", "max_sequence_length", "513"});
  args = test::fixture_call_args("sd35_tiny_arch");
  args.num_inference_steps = 1;
  std::string long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt += "squirrel ";
  args.negative_prompt = long_prompt;
  const PipelineOutput out = pipe(args);
  bool named = false;
  for (const std::string& w : out.warnings) named = named || w.rfind("negative_prompt is", 0) == 0;
  EXPECT_TRUE(named) << "expected a warning naming negative_prompt";
  // Diffusers' check_inputs: SD3 refuses a size that is not a multiple of 16 (FLUX rounds it).
  args = test::fixture_call_args("sd35_tiny_arch");
  args.height = 120;
  test::expect_error([&] { pipe(args); }, {"[pipeline]", "divisible by 16", "120"});
  // FLUX takes none of SD3's skip-layer guidance arguments.
  const FluxPipeline flux = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny"));
  PipelineCallArgs f;
  f.prompt = "a cat";
  f.height = f.width = 32;
  f.skip_guidance_layers = {0};
  test::expect_error([&] { flux(f); }, {"[pipeline]", "skip_guidance_layers", "FluxPipeline"});
}

}  // namespace
}  // namespace kiln
