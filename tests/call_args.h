// The pipeline call a golden fixture was made with (its manifest's "inputs"), and a run of it
// checked step by step, for tests that run a pipeline on a fixture.
#pragma once
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "golden.h"
#include "pipelines/diffusion_pipeline.h"

namespace kiln::test {

// `run`: a fixture with several runs (flux2_klein_tiny's "cfg" and "distilled") takes that run's
// guidance_scale from inputs.runs.
inline PipelineCallArgs fixture_call_args(const std::string& set, const std::string& run = "") {
  std::ifstream in(fixture(set) / "manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in)["inputs"];
  PipelineCallArgs a;
  a.prompt = m["prompt"].get<std::string>();
  a.height = m["height"].get<int64_t>();
  a.width = m["width"].get<int64_t>();
  a.num_inference_steps = m["num_inference_steps"].get<int64_t>();
  a.guidance_scale = (run.empty() ? m : m["runs"][run])["guidance_scale"].get<double>();
  a.max_sequence_length = m["max_sequence_length"].get<int64_t>();
  if (m.contains("text_encoder_out_layers"))
    a.text_encoder_out_layers = m["text_encoder_out_layers"].get<std::vector<int64_t>>();
  return a;
}

// pipe(args), checking every step's latents (Diffusers' callback_on_step_end) against the
// fixture's latents.after_step<i> within the manifest's 1e-4, and that every step reported.
inline PipelineOutput run_checking_each_step(const DiffusionPipeline& pipe, PipelineCallArgs args,
                                             const std::string& set) {
  int64_t seen = 0;
  args.callback_on_step_end = [&](int64_t i, const Tensor& latents) {
    expect_close(latents, golden(set, "latents.after_step" + std::to_string(i)), 1e-4, 0,
                 set + " latents after step " + std::to_string(i));
    ++seen;
  };
  PipelineOutput out = pipe(args);
  EXPECT_EQ(seen, args.num_inference_steps);
  return out;
}

}  // namespace kiln::test
