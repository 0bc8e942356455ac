#include "pipelines/image_processor.h"

#include <cmath>

#include "core/error.h"
#include "exec/host.h"
#include "exec/ops.h"

namespace kiln::image_processor {

Tensor postprocess(const Tensor& image) {
  // image * 0.5 equals image / 2 exactly, so this matches both Diffusers spellings.
  return clamp(image * 0.5 + 0.5, 0.0, 1.0);
}

std::vector<uint8_t> to_uint8_hwc(const Tensor& image) {
  KILN_CHECK((image.rank() == 4 && image.dim(0) == 1 && image.dim(1) == 3) || (image.rank() == 3 && image.dim(0) == 3),
             "image_processor", "to_uint8_hwc expects one RGB image [1, 3, H, W], got ", to_string(image.shape()));
  const int64_t h = image.dim(-2), w = image.dim(-1);
  // Postprocess in the image's dtype as Diffusers does, then read back as f32 (pt_to_numpy's .float()).
  const std::vector<float> chw = to_vector(postprocess(image));
  std::vector<uint8_t> out(size_t(h * w * 3));
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t i = 0; i < h * w; ++i) {
      // NumPy: (img * 255) stays float32, .round() rounds half to even (nearbyint in the
      // default rounding mode), then astype(uint8); values are already in [0, 255].
      const float scaled = chw[size_t(c * h * w + i)] * 255.0f;
      out[size_t(i * 3 + c)] = std::isnan(scaled) ? 0 : uint8_t(std::nearbyint(scaled));
    }
  return out;
}

}  // namespace kiln::image_processor
