#include "nn/adaptive_norm.h"

#include "exec/ops.h"

namespace kiln::nn {

Tensor layer_norm_no_affine(const Tensor& x) { return layer_norm(x, Tensor(), Tensor(), 1e-6); }

Tensor modulate(const Tensor& normed, const Tensor& scale, const Tensor& shift) {
  return normed * (1.0 + unsqueeze(scale, 1)) + unsqueeze(shift, 1);
}

AdaLayerNormContinuous::AdaLayerNormContinuous(const Weights& w, int64_t dim, bool bias)
    : linear_(w.sub("linear"), dim, 2 * dim, bias) {}

Tensor AdaLayerNormContinuous::operator()(const Tensor& x, const Tensor& temb) const {
  const std::vector<Tensor> m = chunk(linear_(silu(temb)), 2, 1);  // scale first, then shift
  return modulate(layer_norm_no_affine(x), m[0], m[1]);
}

}  // namespace kiln::nn
