// FLUX.1 transformer blocks: the double-stream block with joint
// text+image attention and the single-stream block. (The AdaLayerNormContinuous output norm is
// nn/adaptive_norm.h.)
// Every block takes x [B, L_img, D], c [B, L_txt, D], temb [B, D] and the rotary tables of
// the joint sequence (text first) and returns the updated (c, x).
#pragma once
#include <utility>

#include "exec/compile.h"
#include "nn/adaptive_norm.h"
#include "nn/repeated_block.h"
#include "nn/rotary_embedding.h"

namespace kiln::flux {

// The double-stream block's weights: each stream (image or text) owns its modulation, Q/K/V,
// output projection, feed-forward and QK norms; the streams meet only in the joint attention.
struct DoubleStreamWeights {
  static constexpr const char* kClassName = "FluxTransformerBlock";
  struct Stream {
    nn::Linear norm1, q, k, v, out, ff_in, ff_out;
    nn::RMSNorm norm_q, norm_k;
  };
  Stream img, txt;
};

// The single-stream block's weights: one modulation and one attention over the joint sequence,
// with an MLP branch beside the attention and one output projection over both.
struct SingleStreamWeights {
  static constexpr const char* kClassName = "FluxSingleTransformerBlock";
  nn::Linear norm, to_q, to_k, to_v, proj_mlp, proj_out;
  nn::RMSNorm norm_q, norm_k;
};

// A FLUX.1 block. The double- and single-stream blocks differ only in their weights `W` and the
// math over them (forward); the loading, the call (through the compiled executable once compile()
// ran) and the compiled form are one. Defined for the two in flux_blocks.cc.
template <typename W>
class FluxBlock : public nn::CompilableBlock {
 public:
  static constexpr const char* kClassName = W::kClassName;
  FluxBlock() = default;
  FluxBlock(const nn::Weights& w, const nn::BlockDims& dims);
  std::pair<Tensor, Tensor> operator()(const Tensor& x, const Tensor& c, const Tensor& temb,
                                       const nn::RotaryTables& rope) const;
  // The block's math, never through the compiled executable.
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& temb,
                                    const nn::RotaryTables& rope) const;
  const char* class_name() const override { return kClassName; }
  void compile(const CompileOptions& options) override;

 private:
  W w_;
  nn::BlockDims dims_;
};

extern template class FluxBlock<DoubleStreamWeights>;
extern template class FluxBlock<SingleStreamWeights>;

using FluxTransformerBlock = FluxBlock<DoubleStreamWeights>;
using FluxSingleTransformerBlock = FluxBlock<SingleStreamWeights>;

}  // namespace kiln::flux
