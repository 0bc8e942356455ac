// Diffusers' adaptive normalisation pieces shared by the diffusion transformers
// (diffusers/models/normalization.py): LayerNorm without affine parameters modulated by
// per-sample scale and shift, and AdaLayerNormContinuous (the output norm of FLUX.1 and SD3, and
// SD3's context-pre-only context norm).
#pragma once
#include <vector>

#include "nn/layers.h"

namespace kiln::nn {

// LayerNorm with eps 1e-6 and no affine parameters, as every LN of these transformers is.
Tensor layer_norm_no_affine(const Tensor& x);

// normed·(1 + scale) + shift, scale/shift [B, D] broadcast over the sequence.
Tensor modulate(const Tensor& normed, const Tensor& scale, const Tensor& shift);

// norm_out: AdaLayerNormContinuous(D, D, elementwise_affine=False, eps=1e-6); the modulation
// chunks are (scale, shift), the reverse of AdaLayerNormZero.
class AdaLayerNormContinuous {
 public:
  AdaLayerNormContinuous() = default;
  AdaLayerNormContinuous(const Weights& w, int64_t dim, bool bias = true);  // bias: FLUX.2's has none
  Tensor operator()(const Tensor& x, const Tensor& temb) const;
  void append_parameters(std::vector<Tensor>& out) const { linear_.append_parameters(out); }

 private:
  Linear linear_;
};

}  // namespace kiln::nn
