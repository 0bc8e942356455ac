// FLUX.1 transformer blocks (spec flux1.md §2.5.3-§2.5.5): the double-stream block with joint
// text+image attention, the single-stream block, and the AdaLayerNormContinuous output norm.
// Every block takes x [B, L_img, D], c [B, L_txt, D], temb [B, D] and the rotary tables of
// the joint sequence (text first) and returns the updated (c, x).
#pragma once
#include <memory>
#include <utility>

#include "exec/compile.h"

#include "models/flux/flux_embeddings.h"

namespace kiln::flux {

// The dims a block needs. Heads are inferred from the projection width / head_dim at run
// time (runtime.md §6.6) so the same code runs with all heads or a tensor-parallel share.
struct BlockDims {
  int64_t dim = 0;       // D = heads * head_dim
  int64_t head_dim = 0;  // hd
  int64_t mlp_hidden = 0;  // 4 D
};

// Attention over the joint sequence: q, k (already RMS-normalised) and v as [B, S, H, hd];
// RoPE on q and k, SDPA with scale 1/sqrt(hd), no mask -> [B, S, H*hd].
Tensor rope_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RotaryTables& rope);

// What a repeated block shares with compiled mode (runtime.md §5): calls go through its
// CompiledFunction once compile() was called; the block's tensors are the executable's runtime
// arguments (parameters()), so every block of the same structure runs one shared executable.
// The executable's args are (x, c, temb, rope.cos, rope.sin, rope.pair_sign).
class CompilableBlock {
 public:
  bool is_compiled() const { return compiled_ != nullptr; }
  const CompiledFunction* compiled() const { return compiled_.get(); }

 protected:
  std::shared_ptr<const CompiledFunction> compiled_;
};

class FluxTransformerBlock : public CompilableBlock {
 public:
  static constexpr const char* kClassName = "FluxTransformerBlock";
  FluxTransformerBlock() = default;
  FluxTransformerBlock(const nn::Weights& w, const BlockDims& dims);
  std::pair<Tensor, Tensor> operator()(const Tensor& x, const Tensor& c, const Tensor& temb,
                                       const RotaryTables& rope) const;
  // The block's math, never through the compiled executable.
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& temb,
                                    const RotaryTables& rope) const;
  std::vector<Tensor> parameters() const;  // every tensor forward reads besides its args, fixed order
  void compile(const CompileOptions& options);

 private:
  struct Stream {  // the weights one stream (image or text) owns
    nn::Linear norm1, q, k, v, out, ff_in, ff_out;
    nn::RMSNorm norm_q, norm_k;
  };
  Stream img_, txt_;
  BlockDims dims_;
};

class FluxSingleTransformerBlock : public CompilableBlock {
 public:
  static constexpr const char* kClassName = "FluxSingleTransformerBlock";
  FluxSingleTransformerBlock() = default;
  FluxSingleTransformerBlock(const nn::Weights& w, const BlockDims& dims);
  std::pair<Tensor, Tensor> operator()(const Tensor& x, const Tensor& c, const Tensor& temb,
                                       const RotaryTables& rope) const;
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& temb,
                                    const RotaryTables& rope) const;
  std::vector<Tensor> parameters() const;
  void compile(const CompileOptions& options);

 private:
  nn::Linear norm_, to_q_, to_k_, to_v_, proj_mlp_, proj_out_;
  nn::RMSNorm norm_q_, norm_k_;
  BlockDims dims_;
};

// norm_out: AdaLayerNormContinuous(D, D, elementwise_affine=False, eps=1e-6); the modulation
// chunks are (scale, shift), the reverse of AdaLayerNormZero.
class AdaLayerNormContinuous {
 public:
  AdaLayerNormContinuous() = default;
  AdaLayerNormContinuous(const nn::Weights& w, int64_t dim);
  Tensor operator()(const Tensor& x, const Tensor& temb) const;
  void append_parameters(std::vector<Tensor>& out) const { linear_.append_parameters(out); }

 private:
  nn::Linear linear_;
};

}  // namespace kiln::flux
