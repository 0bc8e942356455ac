// A pipeline call's values survive the trip to JSON and back (kiln serve's rank 0 sends them
// to the other ranks under --tp): every field set away from its default comes back equal, and a
// malformed message is an error naming the field.
#include <gtest/gtest.h>

#include "exec/ops.h"
#include "pipelines/call_arguments.h"
#include "test_util.h"

namespace kiln {
namespace {

PipelineCallArgs every_field_set() {
  PipelineCallArgs a;
  a.prompt = "a fox \xe2\x80\x94 in \"snow\"";
  a.prompt_2 = "t5 prompt";
  a.prompt_3 = "third";
  a.negative_prompt = "blurry";
  a.negative_prompt_2 = "n2";
  a.negative_prompt_3 = "n3";
  a.height = 96;
  a.width = 128;
  a.num_inference_steps = 7;
  a.guidance_scale = 0.1 + 0.2;  // not exactly 0.3: the JSON must carry every bit
  a.true_cfg_scale = 4.5;
  a.clip_skip = 2;
  a.max_sequence_length = 77;
  a.skip_guidance_layers = {7, 8, 9};
  a.skip_layer_guidance_scale = 3.1;
  a.skip_layer_guidance_start = 0.02;
  a.skip_layer_guidance_stop = 0.3;
  a.text_encoder_out_layers = {9, 18, 27};
  a.seed = 18446744073709551557ull;  // above 2^63
  a.vae_tiling = VaeTilingMode::kOn;
  a.vae_tile_size = 256;
  return a;
}

TEST(CallArgsJson, EveryValueComesBackEqual) {
  const PipelineCallArgs a = every_field_set();
  const PipelineCallArgs b = call_args_from_json(nlohmann::json::parse(call_args_to_json(a).dump()));
  EXPECT_EQ(b.prompt, a.prompt);
  EXPECT_EQ(b.prompt_2, a.prompt_2);
  EXPECT_EQ(b.prompt_3, a.prompt_3);
  EXPECT_EQ(b.negative_prompt, a.negative_prompt);
  EXPECT_EQ(b.negative_prompt_2, a.negative_prompt_2);
  EXPECT_EQ(b.negative_prompt_3, a.negative_prompt_3);
  EXPECT_EQ(b.height, a.height);
  EXPECT_EQ(b.width, a.width);
  EXPECT_EQ(b.num_inference_steps, a.num_inference_steps);
  EXPECT_EQ(b.guidance_scale, a.guidance_scale);  // bit for bit
  EXPECT_EQ(b.true_cfg_scale, a.true_cfg_scale);
  EXPECT_EQ(b.clip_skip, a.clip_skip);
  EXPECT_EQ(b.max_sequence_length, a.max_sequence_length);
  EXPECT_EQ(b.skip_guidance_layers, a.skip_guidance_layers);
  EXPECT_EQ(b.skip_layer_guidance_scale, a.skip_layer_guidance_scale);
  EXPECT_EQ(b.skip_layer_guidance_start, a.skip_layer_guidance_start);
  EXPECT_EQ(b.skip_layer_guidance_stop, a.skip_layer_guidance_stop);
  EXPECT_EQ(b.text_encoder_out_layers, a.text_encoder_out_layers);
  EXPECT_EQ(b.seed, a.seed);
  EXPECT_EQ(b.vae_tiling, a.vae_tiling);
  EXPECT_EQ(b.vae_tile_size, a.vae_tile_size);
}

TEST(CallArgsJson, DefaultsStayDefaults) {
  const PipelineCallArgs b = call_args_from_json(call_args_to_json(PipelineCallArgs{}));
  EXPECT_FALSE(b.prompt_2 || b.prompt_3 || b.negative_prompt || b.height || b.width || b.guidance_scale ||
               b.max_sequence_length || b.true_cfg_scale || b.clip_skip);
  EXPECT_EQ(b.num_inference_steps, PipelineCallArgs{}.num_inference_steps);
  EXPECT_EQ(b.vae_tiling, VaeTilingMode::kAuto);
}

TEST(CallArgsJson, MalformedMessagesNameTheField) {
  nlohmann::json j = call_args_to_json(every_field_set());
  j.erase("seed");
  test::expect_error([&] { call_args_from_json(j); }, {"field 'seed' is missing"});
  j = call_args_to_json(every_field_set());
  j["height"] = "tall";
  test::expect_error([&] { call_args_from_json(j); }, {"field 'height'"});
  j = call_args_to_json(every_field_set());
  j["vae_tiling"] = 9;
  test::expect_error([&] { call_args_from_json(j); }, {"field 'vae_tiling': expected \"auto\""});
  test::expect_error([] { call_args_from_json(nlohmann::json::array()); }, {"expected a JSON object"});
  PipelineCallArgs with_latents;
  with_latents.latents = zeros({1, 4});
  test::expect_error([&] { call_args_to_json(with_latents); }, {"explicit latents"});
}

}  // namespace
}  // namespace kiln
