// What a pipeline call returns (DiffusionPipeline::operator()): the image, the final latents,
// the timings of its stages and the warnings it gave.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

struct PipelineTimings {
  double encode = 0, decode = 0, total = 0;
  std::vector<double> steps;
};

struct PipelineOutput {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> image;  // RGB, row-major HWC
  Tensor latents;              // final latents (FLUX: packed [1, L_img, 4C]; SD3: [1, C, h, w])
  PipelineTimings timings;
  std::vector<std::string> warnings;  // e.g. a size rounded down to a multiple of 16
  int64_t vae_tile_size = 0;          // the decode ran in tiles of this many image pixels (0: untiled)
  // The call's guidance_scale and max_sequence_length after the pipeline's defaults.
  double guidance_scale = 0;
  int64_t max_sequence_length = 0;
};

}  // namespace kiln
