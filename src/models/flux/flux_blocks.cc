#include "models/flux/flux_blocks.h"

#include <cmath>

#include "nn/activations.h"

namespace kiln::flux {
namespace {

using nn::layer_norm_no_affine;
using nn::modulate;
using nn::split_heads;

constexpr double kNormEps = 1e-6;  // every LayerNorm and QK RMSNorm in the transformer


// The compiled form of a block: traces `forward` of a copy of the block (taken before it is
// compiled, so the trace computes the math), args (x, c, temb, rope tables).
template <typename Block>
std::shared_ptr<const CompiledFunction> compile_block(const Block& block, const CompileOptions& options) {
  return std::make_shared<const CompiledFunction>(
      Block::kClassName,
      [self = block](const std::vector<Tensor>& a) {
        auto [c, x] = self.forward(a[0], a[1], a[2], nn::RotaryTables::from_args(a, 3));
        return std::vector<Tensor>{c, x};
      },
      options, nn::RotaryTables::arg_names({"hidden_states", "encoder_hidden_states", "temb"}));
}

template <typename Block>
std::pair<Tensor, Tensor> call_block(const Block& block, const CompiledFunction* compiled, const Tensor& x,
                                     const Tensor& c, const Tensor& temb, const nn::RotaryTables& rope) {
  if (compiled == nullptr) return block.forward(x, c, temb, rope);
  std::vector<Tensor> out = (*compiled)(rope.args({x, c, temb}), block.parameters());
  return {out[0], out[1]};
}

}  // namespace

// ---- double-stream block ----

FluxTransformerBlock::FluxTransformerBlock(const nn::Weights& w, const nn::BlockDims& d) : dims_(d) {
  const int64_t D = d.dim, hd = d.head_dim, M = d.mlp_hidden;
  const nn::Weights attn = w.sub("attn");
  img_ = Stream{nn::Linear(w.sub("norm1").sub("linear"), D, 6 * D),
                nn::Linear(attn.sub("to_q"), D, D),
                nn::Linear(attn.sub("to_k"), D, D),
                nn::Linear(attn.sub("to_v"), D, D),
                nn::Linear(attn.sub("to_out").sub("0"), D, D),
                nn::Linear(w.sub("ff").sub("net").sub("0").sub("proj"), D, M),
                nn::Linear(w.sub("ff").sub("net").sub("2"), M, D),
                nn::RMSNorm(attn.sub("norm_q"), hd, kNormEps),
                nn::RMSNorm(attn.sub("norm_k"), hd, kNormEps)};
  txt_ = Stream{nn::Linear(w.sub("norm1_context").sub("linear"), D, 6 * D),
                nn::Linear(attn.sub("add_q_proj"), D, D),
                nn::Linear(attn.sub("add_k_proj"), D, D),
                nn::Linear(attn.sub("add_v_proj"), D, D),
                nn::Linear(attn.sub("to_add_out"), D, D),
                nn::Linear(w.sub("ff_context").sub("net").sub("0").sub("proj"), D, M),
                nn::Linear(w.sub("ff_context").sub("net").sub("2"), M, D),
                nn::RMSNorm(attn.sub("norm_added_q"), hd, kNormEps),
                nn::RMSNorm(attn.sub("norm_added_k"), hd, kNormEps)};
}

std::pair<Tensor, Tensor> FluxTransformerBlock::operator()(const Tensor& x, const Tensor& c, const Tensor& temb,
                                                           const nn::RotaryTables& rope) const {
  return call_block(*this, compiled(), x, c, temb, rope);
}

void FluxTransformerBlock::compile(const CompileOptions& options) {
  compiled_.reset();
  compiled_ = compile_block(*this, options);
}

std::pair<Tensor, Tensor> FluxTransformerBlock::forward(const Tensor& x, const Tensor& c, const Tensor& temb,
                                                        const nn::RotaryTables& rope) const {
  const int64_t hd = dims_.head_dim, L_txt = c.dim(1), S = c.dim(1) + x.dim(1);
  // AdaLayerNormZero chunks: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp.
  const Tensor act = silu(temb);
  const std::vector<Tensor> m = chunk(img_.norm1(act), 6, 1);
  const std::vector<Tensor> mc = chunk(txt_.norm1(act), 6, 1);
  const Tensor x_n = modulate(layer_norm_no_affine(x), m[1], m[0]);
  const Tensor c_n = modulate(layer_norm_no_affine(c), mc[1], mc[0]);

  // Joint attention: each stream projects and RMS-normalises its own Q/K; text comes first.
  const Tensor q = concat({txt_.norm_q(split_heads(txt_.q(c_n), hd)), img_.norm_q(split_heads(img_.q(x_n), hd))}, 1);
  const Tensor k = concat({txt_.norm_k(split_heads(txt_.k(c_n), hd)), img_.norm_k(split_heads(img_.k(x_n), hd))}, 1);
  const Tensor v = concat({split_heads(txt_.v(c_n), hd), split_heads(img_.v(x_n), hd)}, 1);
  const Tensor o = nn::rope_attention(q, k, v, rope);
  const Tensor attn_c = txt_.out(slice(o, 1, 0, L_txt));
  const Tensor attn_x = img_.out(slice(o, 1, L_txt, S));

  // Residual updates in Diffusers' order; FF = net.2(GELU_tanh(net.0.proj(·))).
  Tensor xo = x + unsqueeze(m[2], 1) * attn_x;
  xo = xo + unsqueeze(m[5], 1) * img_.ff_out(gelu(img_.ff_in(modulate(layer_norm_no_affine(xo), m[4], m[3])), "tanh"));
  Tensor co = c + unsqueeze(mc[2], 1) * attn_c;
  co = co + unsqueeze(mc[5], 1) * txt_.ff_out(gelu(txt_.ff_in(modulate(layer_norm_no_affine(co), mc[4], mc[3])), "tanh"));
  return {nn::clamp_fp16(co), xo};  // Diffusers clamps only the text stream here
}

// ---- single-stream block ----

FluxSingleTransformerBlock::FluxSingleTransformerBlock(const nn::Weights& w, const nn::BlockDims& d)
    : norm_(w.sub("norm").sub("linear"), d.dim, 3 * d.dim),
      to_q_(w.sub("attn").sub("to_q"), d.dim, d.dim),
      to_k_(w.sub("attn").sub("to_k"), d.dim, d.dim),
      to_v_(w.sub("attn").sub("to_v"), d.dim, d.dim),
      proj_mlp_(w.sub("proj_mlp"), d.dim, d.mlp_hidden),
      proj_out_(w.sub("proj_out"), d.dim + d.mlp_hidden, d.dim),
      norm_q_(w.sub("attn").sub("norm_q"), d.head_dim, kNormEps),
      norm_k_(w.sub("attn").sub("norm_k"), d.head_dim, kNormEps),
      dims_(d) {}

std::pair<Tensor, Tensor> FluxSingleTransformerBlock::operator()(const Tensor& x, const Tensor& c,
                                                                 const Tensor& temb,
                                                                 const nn::RotaryTables& rope) const {
  return call_block(*this, compiled(), x, c, temb, rope);
}

void FluxSingleTransformerBlock::compile(const CompileOptions& options) {
  compiled_.reset();
  compiled_ = compile_block(*this, options);
}

std::pair<Tensor, Tensor> FluxSingleTransformerBlock::forward(const Tensor& x, const Tensor& c, const Tensor& temb,
                                                              const nn::RotaryTables& rope) const {
  const int64_t hd = dims_.head_dim, L_txt = c.dim(1), S = c.dim(1) + x.dim(1);
  const Tensor h = concat({c, x}, 1);  // the residual
  // AdaLayerNormZeroSingle chunks: shift, scale, gate.
  const std::vector<Tensor> m = chunk(norm_(silu(temb)), 3, 1);
  const Tensor h_n = modulate(layer_norm_no_affine(h), m[1], m[0]);
  // MLP and attention branches read the same h_n; attention has no output projection.
  const Tensor mlp = gelu(proj_mlp_(h_n), "tanh");
  const Tensor a = nn::rope_attention(norm_q_(split_heads(to_q_(h_n), hd)), norm_k_(split_heads(to_k_(h_n), hd)),
                                  split_heads(to_v_(h_n), hd), rope);
  const Tensor out = nn::clamp_fp16(h + unsqueeze(m[2], 1) * proj_out_(concat({a, mlp}, 2)));
  return {slice(out, 1, 0, L_txt), slice(out, 1, L_txt, S)};
}

// ---- output norm ----

}  // namespace kiln::flux
