// The server's request parser (server/generation_request.h): fields land in the pipeline call,
// defaults stay where the body is silent, and any bad body — including random mutations of good
// ones — is a RequestError naming a field, never another exception or a crash.
#include <random>

#include <nlohmann/json.hpp>

#include "server/generation_request.h"
#include "test_util.h"

namespace kiln::server {
namespace {

TEST(GenerationRequest, FieldsLandInTheCallAndDefaultsStay) {
  PipelineCallArgs defaults;
  defaults.num_inference_steps = 4;
  defaults.height = defaults.width = 128;
  const GenerationRequest plain = parse_generation_request(R"({"prompt": "a cat"})", {}, defaults);
  EXPECT_EQ(plain.call.prompt, "a cat");
  EXPECT_EQ(plain.call.num_inference_steps, 4);
  EXPECT_EQ(plain.call.height, 128);
  EXPECT_EQ(plain.n, 1);
  EXPECT_FALSE(plain.size_given);

  const GenerationRequest r = parse_generation_request(
      R"({"prompt": "a cat", "size": "1024x512", "n": 2, "steps": 9, "seed": 12345678901, "guidance_scale": 3.5,
          "max_sequence_length": 77, "negative_prompt": "blur", "prompt_2": "t5 prompt", "skip_guidance_layers": [7, 8],
          "skip_layer_guidance_scale": 2.5, "response_format": "b64_json", "model": "any", "user": "me"})",
      {}, defaults);
  EXPECT_EQ(r.call.width, 1024);  // OpenAI's size is WIDTHxHEIGHT
  EXPECT_EQ(r.call.height, 512);
  EXPECT_TRUE(r.size_given);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.call.num_inference_steps, 9);
  EXPECT_EQ(r.call.seed, 12345678901u);
  EXPECT_EQ(r.call.guidance_scale, 3.5);
  EXPECT_EQ(r.call.max_sequence_length, 77);
  EXPECT_EQ(r.call.negative_prompt, "blur");
  EXPECT_EQ(r.call.prompt_2, "t5 prompt");
  EXPECT_EQ(r.call.skip_guidance_layers, (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(r.call.skip_layer_guidance_scale, 2.5);
  EXPECT_EQ(parse_generation_request(R"({"prompt": "x", "num_inference_steps": 3})", {}).call.num_inference_steps, 3);
}

TEST(GenerationRequest, BadBodiesNameTheirField) {
  RequestLimits limits;
  limits.max_prompt_chars = 10;
  limits.max_side = 1024;
  const std::vector<std::tuple<std::string, int, std::string>> cases = {
      {"", 400, "body"},
      {"not json", 400, "body"},
      {"\"a string\"", 400, "body"},
      {"{}", 400, "prompt"},
      {R"({"prompt": null})", 400, "prompt"},
      {R"({"prompt": "this prompt is too long"})", 413, "prompt"},
      {R"({"prompt": "x", "negative_prompt": ["a"]})", 400, "negative_prompt"},
      {R"({"prompt": "x", "size": "2048x2048"})", 400, "size"},
      {R"({"prompt": "x", "size": "512x"})", 400, "size"},
      {R"({"prompt": "x", "size": "-512x512"})", 400, "size"},
      {R"({"prompt": "x", "size": "512X512"})", 400, "size"},
      {R"({"prompt": "x", "size": "99999999999999999999x16"})", 400, "size"},
      {R"({"prompt": "x", "n": 0})", 400, "n"},
      {R"({"prompt": "x", "n": 18446744073709551615})", 400, "n"},
      {R"({"prompt": "x", "steps": 101})", 400, "steps"},
      {R"({"prompt": "x", "steps": 2, "num_inference_steps": 2})", 400, "steps"},
      {R"({"prompt": "x", "seed": 1.5})", 400, "seed"},
      {R"({"prompt": "x", "guidance_scale": 1e999})", 400, "body"},
      {R"({"prompt": "x", "guidance_scale": -1})", 400, "guidance_scale"},
      {R"({"prompt": "x", "skip_guidance_layers": [1, "2"]})", 400, "skip_guidance_layers"},
      {R"({"prompt": "x", "skip_layer_guidance_start": 2})", 400, "skip_layer_guidance_start"},
      {R"({"prompt": "x", "model": 3})", 400, "model"},
      {R"({"prompt": "x", "latents": [0]})", 400, "latents"},
      // Control characters: a NUL would fail the PNG only after the run; escapes reach terminals.
      {R"({"prompt": "a\u0000b"})", 400, "prompt"},
      {R"({"prompt": "\u001b[2J"})", 400, "prompt"},
      {R"({"prompt": "x", "prompt_2": "del\u007f"})", 400, "prompt_2"},
      {R"({"prompt": "x", "negative_prompt": "c1 \u009b"})", 400, "negative_prompt"},
  };
  for (const auto& [body, status, field] : cases) {
    try {
      parse_generation_request(body, limits);
      ADD_FAILURE() << body << " was accepted";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.status(), status) << body << ": " << e.what();
      EXPECT_EQ(e.field(), field) << body << ": " << e.what();
      EXPECT_EQ(std::string(e.what()).rfind(field + ": ", 0), 0u) << e.what();
    }
  }
}

// Random byte edits of good bodies: each parses or is a RequestError; nothing else escapes.
// Only tab and line breaks among the control characters: prompts are often pasted paragraphs.
TEST(GenerationRequest, TabsAndLineBreaksStayInPrompts) {
  const GenerationRequest r = parse_generation_request(R"({"prompt": "a fox\n\tin snow\r\n", "prompt_2": "é ∑"})", {});
  EXPECT_EQ(r.call.prompt, "a fox\n\tin snow\r\n");
  EXPECT_EQ(r.call.prompt_2, "é ∑");
}

TEST(GenerationRequest, FuzzedBodiesAreAcceptedOrRefusedNeverThrowOtherwise) {
  const std::vector<std::string> seeds = {
      R"({"prompt": "a cat", "size": "512x512", "n": 2, "steps": 4, "seed": 3})",
      R"({"prompt": "ü日本", "guidance_scale": 3.5, "skip_guidance_layers": [7, 8, 9], "negative_prompt": ""})",
      R"({"prompt": "x", "max_sequence_length": 256, "response_format": "b64_json", "text_encoder_out_layers": [1]})"};
  const std::string alphabet = "{}[]\":,0123456789.-eE xnul\\\x00\xff";
  std::mt19937 rng(1234);
  int accepted = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string body = seeds[size_t(i) % seeds.size()];
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits && !body.empty(); ++e) {
      const size_t at = rng() % body.size();
      switch (rng() % 3) {
        case 0: body[at] = alphabet[rng() % alphabet.size()]; break;
        case 1: body.erase(at, 1 + rng() % 3); break;
        default: body.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
      }
    }
    try {
      parse_generation_request(body, {});
      ++accepted;
    } catch (const RequestError& e) {
      EXPECT_FALSE(e.field().empty()) << body;
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "body " << nlohmann::json(body).dump() << " threw " << e.what();
    }
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 10000);
}

// A server started with limits above what any call takes (serve's --max-steps and --max-size are
// not bounded above) still refuses such a request as a bad field, not in the pipeline later.
TEST(GenerationRequest, RequestsStayWithinWhatAnyCallTakes) {
  RequestLimits limits;
  limits.max_steps = int64_t(1) << 40;
  limits.max_side = int64_t(1) << 40;
  for (const char* body : {R"({"prompt": "x", "steps": 2147483648})", R"({"prompt": "x", "num_inference_steps": 10001})"}) {
    try {
      parse_generation_request(body, limits);
      ADD_FAILURE() << body << " was accepted";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.status(), 400) << e.what();
      EXPECT_NE(std::string(e.what()).find("expected an integer in [1, 10000]"), std::string::npos) << e.what();
    }
  }
  try {
    parse_generation_request(R"({"prompt": "x", "size": "16x2000000"})", limits);
    ADD_FAILURE() << "a side of 2000000 was accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.field(), "size");
    EXPECT_NE(std::string(e.what()).find("in [16, 1048576]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_generation_request(R"({"prompt": "x", "steps": 10000})", limits).call.num_inference_steps, 10000);
}

}  // namespace
}  // namespace kiln::server
