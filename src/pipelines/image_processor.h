// Diffusers' VaeImageProcessor.postprocess with do_normalize=True: the VAE's
// [-1, 1] output becomes [0, 1] floats ("pt") or 8-bit pixels ("pil").
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace kiln::image_processor {

// clamp(x * 0.5 + 0.5, 0, 1), same shape and dtype as `image` ([B, 3, H, W]).
Tensor postprocess(const Tensor& image);

// One image [1, 3, H, W] (or [3, H, W]) in [-1, 1] -> H*W*3 bytes, row-major RGB (HWC), as PIL
// gets them: round_half_to_even(postprocess(x) * 255) with the product in fp32.
std::vector<uint8_t> to_uint8_hwc(const Tensor& image);

}  // namespace kiln::image_processor
