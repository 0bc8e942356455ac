// The body of an image-generation request (`kiln serve`: POST /v1/images/generations and
// POST /v1/jobs), parsed and checked against the server's limits before it is queued: the
// OpenAI images API's fields (prompt, n, size "WxH", response_format) and kiln's own (the
// pipeline call arguments by their Diffusers names). A bad body is a RequestError naming the
// field, never a crash and never a job.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "pipelines/diffusion_pipeline.h"

namespace kiln::server {

// What the server accepts (its flags); every bound is inclusive.
struct RequestLimits {
  size_t max_prompt_chars = 4096;  // each prompt field, in bytes of UTF-8
  int64_t max_n = 4;               // images per request
  int64_t max_side = 2048;         // pixels per image side (and at least 16, a multiple of 16)
  int64_t max_steps = 100;
};

// A request the server refuses: the HTTP status (400, 413, ...), the field it names ("size",
// "prompt", "body", ...) and what was expected.
class RequestError : public std::runtime_error {
 public:
  RequestError(int status, std::string field, const std::string& message)
      : std::runtime_error(message), status_(status), field_(std::move(field)) {}
  int status() const { return status_; }
  const std::string& field() const { return field_; }

 private:
  int status_;
  std::string field_;
};

struct GenerationRequest {
  PipelineCallArgs call;  // prompt, sizes, steps, seed, ... (no callbacks, no latents)
  int64_t n = 1;          // images: seeds seed, seed + 1, ..., one pipeline call each
  bool size_given = false;
};

// Parses a JSON body. Fields: prompt (required), n, size ("WIDTHxHEIGHT", as OpenAI's),
// response_format ("b64_json" only: the image travels in the answer), steps (or
// num_inference_steps), and every pipeline call argument a request takes, by its Diffusers name
// (pipelines/call_arguments.h: negative_prompt, guidance_scale, ...); OpenAI's model,
// user, quality and style are accepted and ignored. Any other field is an error naming it.
// Fields the body leaves out keep `defaults`' values (the server's: the pipeline's, or the
// bundled checkpoint's call).
GenerationRequest parse_generation_request(const std::string& body, const RequestLimits& limits,
                                           const PipelineCallArgs& defaults = {});

}  // namespace kiln::server
