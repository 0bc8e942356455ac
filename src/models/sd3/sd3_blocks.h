// Stable Diffusion 3 / 3.5 transformer blocks: JointTransformerBlock, the
// MMDiT block. Image and text streams each modulate their own LayerNorm from temb, attend
// jointly (image tokens first, then text: the reverse of FLUX) and update their residuals with
// gated attention and GELU-tanh feed-forward outputs. Two variants change its structure:
//  - MMDiT-X dual attention (SD3.5 Medium's dual_attention_layers): a 9-chunk modulation
//    (SD35AdaLayerNormZeroX) and a second, image-only self-attention `attn2`;
//  - context_pre_only (the model's last block): the text stream is only read (its modulation is
//    AdaLayerNormContinuous, scale first), no to_add_out / ff_context, no text output.
#pragma once
#include <utility>
#include <vector>

#include "nn/adaptive_norm.h"
#include "nn/repeated_block.h"

namespace kiln::sd3 {

// Which variant a block is; with the dims (nn::BlockDims: D, head_dim, 4D) it fixes the
// block's graph, so blocks of the same structure and sizes share one compiled executable.
struct JointBlockStructure {
  bool dual_attention = false;    // SD35AdaLayerNormZeroX + attn2
  bool context_pre_only = false;  // the last block
  bool qk_norm = false;           // per-head RMSNorm of Q and K (qk_norm "rms_norm")
};

// softmax(q kᵀ / sqrt(hd)) v, no mask, over q [B, Sq, H, hd], k and v [B, Sk, H, hd]
// -> [B, Sq, H*hd]. H is whatever the (possibly tensor-parallel) projections produced.
Tensor dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v);

// A JointTransformerBlock. Calls go through its compiled executable once compile() was called
// (nn::CompilableBlock); the executable's args are (hidden_states, encoder_hidden_states, temb)
// and its outputs (encoder_hidden_states, hidden_states), or (hidden_states) alone for a
// context_pre_only block.
class JointTransformerBlock : public nn::CompilableBlock {
 public:
  static constexpr const char* kClassName = "JointTransformerBlock";
  JointTransformerBlock() = default;
  // `w` holds the block's tensors ("transformer_blocks.<i>."); shapes are checked against dims.
  JointTransformerBlock(const nn::Weights& w, const nn::BlockDims& dims, const JointBlockStructure& structure);

  // x [B, L_img, D], c [B, L_txt, D], temb [B, D] -> (c, x). After a context_pre_only block
  // c is an undefined Tensor (Diffusers returns None).
  std::pair<Tensor, Tensor> operator()(const Tensor& x, const Tensor& c, const Tensor& temb) const;
  // The block's math, never through the compiled executable.
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& c, const Tensor& temb) const;
  const char* class_name() const override { return kClassName; }
  void compile(const CompileOptions& options) override;
  const JointBlockStructure& structure() const { return structure_; }

 private:
  // One attention input stream: its Q/K/V projections, output projection (absent for the text
  // stream of a context_pre_only block) and per-head Q/K RMSNorms (when qk_norm).
  struct Stream {
    nn::Linear q, k, v, out;
    nn::RMSNorm norm_q, norm_k;
  };
  // [B, L, D] -> normalised Q, K and V heads [B, L, H, hd].
  Tensor query(const Stream& s, const Tensor& x) const;
  Tensor key(const Stream& s, const Tensor& x) const;
  Tensor value(const Stream& s, const Tensor& x) const;

  nn::Linear norm1_;                   // image modulation: 6 chunks, 9 with dual attention
  nn::Linear norm1_context_;           // text modulation: 6 chunks, 2 (scale, shift) when context_pre_only
  Stream img_;                         // attn.to_q/to_k/to_v/to_out.0, norm_q/norm_k
  Stream txt_;                         // attn.add_q_proj/add_k_proj/add_v_proj/to_add_out, norm_added_q/norm_added_k
  Stream attn2_;                       // attn2.* (dual attention only)
  nn::Linear ff_in_, ff_out_;          // ff.net.0.proj, ff.net.2
  nn::Linear ff_ctx_in_, ff_ctx_out_;  // ff_context.* (not context_pre_only)
  nn::BlockDims dims_;
  JointBlockStructure structure_;
};

}  // namespace kiln::sd3
