// FLUX.1 transformer blocks: the double-stream block with joint
// text+image attention and the single-stream block. (The AdaLayerNormContinuous output norm is
// nn/adaptive_norm.h.)
// Every block takes x [B, L_img, D], c [B, L_txt, D], temb [B, D] and the rotary tables of
// the joint sequence (text first) and returns the updated (c, x).
#pragma once
#include <memory>
#include <utility>

#include "exec/compile.h"
#include "nn/adaptive_norm.h"
#include "nn/repeated_block.h"
#include "nn/rotary_embedding.h"

namespace kiln::flux {

class FluxTransformerBlock : public nn::CompilableBlock {
 public:
  static constexpr const char* kClassName = "FluxTransformerBlock";
  FluxTransformerBlock() = default;
  FluxTransformerBlock(const nn::Weights& w, const nn::BlockDims& dims);
  std::pair<Tensor, Tensor> operator()(const Tensor& x, const Tensor& c, const Tensor& temb,
                                       const nn::RotaryTables& rope) const;
  // The block's math, never through the compiled executable.
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& temb,
                                    const nn::RotaryTables& rope) const;
  const char* class_name() const override { return kClassName; }
  void compile(const CompileOptions& options) override;

 private:
  struct Stream {  // the weights one stream (image or text) owns
    nn::Linear norm1, q, k, v, out, ff_in, ff_out;
    nn::RMSNorm norm_q, norm_k;
  };
  Stream img_, txt_;
  nn::BlockDims dims_;
};

class FluxSingleTransformerBlock : public nn::CompilableBlock {
 public:
  static constexpr const char* kClassName = "FluxSingleTransformerBlock";
  FluxSingleTransformerBlock() = default;
  FluxSingleTransformerBlock(const nn::Weights& w, const nn::BlockDims& dims);
  std::pair<Tensor, Tensor> operator()(const Tensor& x, const Tensor& c, const Tensor& temb,
                                       const nn::RotaryTables& rope) const;
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& temb,
                                    const nn::RotaryTables& rope) const;
  const char* class_name() const override { return kClassName; }
  void compile(const CompileOptions& options) override;

 private:
  nn::Linear norm_, to_q_, to_k_, to_v_, proj_mlp_, proj_out_;
  nn::RMSNorm norm_q_, norm_k_;
  nn::BlockDims dims_;
};

}  // namespace kiln::flux
