// The pipeline call a golden fixture was made with (its manifest's "inputs"), for tests
// that run the pipeline on a fixture.
#pragma once
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "golden.h"
#include "pipelines/diffusion_pipeline.h"

namespace kiln::test {

inline PipelineCallArgs fixture_call_args(const std::string& set) {
  std::ifstream in(fixture(set) / "manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in)["inputs"];
  PipelineCallArgs a;
  a.prompt = m["prompt"].get<std::string>();
  a.height = m["height"].get<int64_t>();
  a.width = m["width"].get<int64_t>();
  a.num_inference_steps = m["num_inference_steps"].get<int64_t>();
  a.guidance_scale = m["guidance_scale"].get<double>();
  a.max_sequence_length = m["max_sequence_length"].get<int64_t>();
  return a;
}

}  // namespace kiln::test
