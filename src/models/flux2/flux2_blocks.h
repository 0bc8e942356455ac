// FLUX.2 transformer blocks: the double-stream block with joint
// text+image attention and SwiGLU feed-forwards, and the single-stream block with its one fused
// Q/K/V/gate/up projection. Neither owns its modulation: the model computes the shared
// modulations once per forward and hands every block the same ones.
#pragma once
#include <utility>

#include "exec/compile.h"
#include "nn/rotary_embedding.h"
#include "nn/adaptive_norm.h"
#include "nn/repeated_block.h"

namespace kiln::flux2 {

using nn::RotaryTables;

// SwiGLU(u) = silu(u[..., :F]) * u[..., F:] (the first half is the gate).
Tensor swiglu(const Tensor& u);

class Flux2TransformerBlock : public nn::CompilableBlock {
 public:
  static constexpr const char* kClassName = "Flux2TransformerBlock";
  Flux2TransformerBlock() = default;
  Flux2TransformerBlock(const nn::Weights& w, const nn::BlockDims& dims);
  // x [B, L_img, D], c [B, L_txt, D], mod_img / mod_txt [B, 6D] (shift, scale, gate of the
  // attention, then of the MLP), rope over the joint sequence (text first) -> (c, x).
  std::pair<Tensor, Tensor> operator()(const Tensor& x, const Tensor& c, const Tensor& mod_img, const Tensor& mod_txt,
                                       const RotaryTables& rope) const;
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& mod_img, const Tensor& mod_txt,
                                    const RotaryTables& rope) const;
  const char* class_name() const override { return kClassName; }
  void compile(const CompileOptions& options) override;

 private:
  struct Stream {  // the weights one stream (image or text) owns
    nn::Linear q, k, v, out, ff_in, ff_out;
    nn::RMSNorm norm_q, norm_k;
  };
  Stream img_, txt_;
  nn::BlockDims dims_;
};

class Flux2SingleTransformerBlock : public nn::CompilableBlock {
 public:
  static constexpr const char* kClassName = "Flux2SingleTransformerBlock";
  Flux2SingleTransformerBlock() = default;
  Flux2SingleTransformerBlock(const nn::Weights& w, const nn::BlockDims& dims);
  // s = [c | x] [B, L_txt + L_img, D], mod [B, 3D] (shift, scale, gate) -> s.
  Tensor operator()(const Tensor& s, const Tensor& mod, const RotaryTables& rope) const;
  Tensor forward(const Tensor& s, const Tensor& mod, const RotaryTables& rope) const;
  const char* class_name() const override { return kClassName; }
  void compile(const CompileOptions& options) override;

 private:
  nn::Linear to_qkv_mlp_proj_, to_out_;
  nn::RMSNorm norm_q_, norm_k_;
  nn::BlockDims dims_;
};

}  // namespace kiln::flux2
