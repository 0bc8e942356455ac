// A pipeline call's values as JSON, and back: what kiln serve's rank 0 sends the other ranks
// under --tp so that every rank runs the same call. Callbacks stay behind; explicit latents are
// refused (a request cannot set them).
#pragma once
#include <nlohmann/json.hpp>

#include "pipelines/diffusion_pipeline.h"

namespace kiln {

nlohmann::json call_args_to_json(const PipelineCallArgs& args);
// `j` as call_args_to_json wrote it; an error naming the field otherwise.
PipelineCallArgs call_args_from_json(const nlohmann::json& j);

}  // namespace kiln
