#include "models/flux/flux_blocks.h"

#include <cmath>
#include <memory>
#include <vector>

#include "nn/activations.h"

namespace kiln::flux {
namespace {

using nn::layer_norm_no_affine;
using nn::modulate;
using nn::split_heads;

constexpr double kNormEps = 1e-6;  // every LayerNorm and QK RMSNorm in the transformer

// Each kind of block's weights, read from its checkpoint view `w`; math() is each kind's forward.
template <typename W>
W load(const nn::Weights& w, const nn::BlockDims& d);

// ---- double-stream block ----

template <>
DoubleStreamWeights load(const nn::Weights& w, const nn::BlockDims& d) {
  const int64_t D = d.dim, hd = d.head_dim, M = d.mlp_hidden;
  const nn::Weights attn = w.sub("attn");
  DoubleStreamWeights s;
  s.img = {nn::Linear(w.sub("norm1").sub("linear"), D, 6 * D),
           nn::Linear(attn.sub("to_q"), D, D),
           nn::Linear(attn.sub("to_k"), D, D),
           nn::Linear(attn.sub("to_v"), D, D),
           nn::Linear(attn.sub("to_out").sub("0"), D, D),
           nn::Linear(w.sub("ff").sub("net").sub("0").sub("proj"), D, M),
           nn::Linear(w.sub("ff").sub("net").sub("2"), M, D),
           nn::RMSNorm(attn.sub("norm_q"), hd, kNormEps),
           nn::RMSNorm(attn.sub("norm_k"), hd, kNormEps)};
  s.txt = {nn::Linear(w.sub("norm1_context").sub("linear"), D, 6 * D),
           nn::Linear(attn.sub("add_q_proj"), D, D),
           nn::Linear(attn.sub("add_k_proj"), D, D),
           nn::Linear(attn.sub("add_v_proj"), D, D),
           nn::Linear(attn.sub("to_add_out"), D, D),
           nn::Linear(w.sub("ff_context").sub("net").sub("0").sub("proj"), D, M),
           nn::Linear(w.sub("ff_context").sub("net").sub("2"), M, D),
           nn::RMSNorm(attn.sub("norm_added_q"), hd, kNormEps),
           nn::RMSNorm(attn.sub("norm_added_k"), hd, kNormEps)};
  return s;
}

std::pair<Tensor, Tensor> math(const DoubleStreamWeights& s, const nn::BlockDims& dims, const Tensor& x,
                               const Tensor& c, const Tensor& temb, const nn::RotaryTables& rope) {
  const auto& img = s.img;
  const auto& txt = s.txt;
  const int64_t hd = dims.head_dim, L_txt = c.dim(1), S = c.dim(1) + x.dim(1);
  // AdaLayerNormZero chunks: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp.
  const Tensor act = silu(temb);
  const std::vector<Tensor> m = chunk(img.norm1(act), 6, 1);
  const std::vector<Tensor> mc = chunk(txt.norm1(act), 6, 1);
  const Tensor x_n = modulate(layer_norm_no_affine(x), m[1], m[0]);
  const Tensor c_n = modulate(layer_norm_no_affine(c), mc[1], mc[0]);

  // Joint attention: each stream projects and RMS-normalises its own Q/K; text comes first.
  const Tensor q = concat({txt.norm_q(split_heads(txt.q(c_n), hd)), img.norm_q(split_heads(img.q(x_n), hd))}, 1);
  const Tensor k = concat({txt.norm_k(split_heads(txt.k(c_n), hd)), img.norm_k(split_heads(img.k(x_n), hd))}, 1);
  const Tensor v = concat({split_heads(txt.v(c_n), hd), split_heads(img.v(x_n), hd)}, 1);
  const Tensor o = nn::rope_attention(q, k, v, rope);
  const Tensor attn_c = txt.out(slice(o, 1, 0, L_txt));
  const Tensor attn_x = img.out(slice(o, 1, L_txt, S));

  // Residual updates in Diffusers' order; FF = net.2(GELU_tanh(net.0.proj(·))).
  Tensor xo = x + unsqueeze(m[2], 1) * attn_x;
  xo = xo + unsqueeze(m[5], 1) * img.ff_out(gelu(img.ff_in(modulate(layer_norm_no_affine(xo), m[4], m[3])), "tanh"));
  Tensor co = c + unsqueeze(mc[2], 1) * attn_c;
  co = co + unsqueeze(mc[5], 1) * txt.ff_out(gelu(txt.ff_in(modulate(layer_norm_no_affine(co), mc[4], mc[3])), "tanh"));
  return {nn::clamp_fp16(co), xo};  // Diffusers clamps only the text stream here
}

// ---- single-stream block ----

template <>
SingleStreamWeights load(const nn::Weights& w, const nn::BlockDims& d) {
  return {nn::Linear(w.sub("norm").sub("linear"), d.dim, 3 * d.dim),
          nn::Linear(w.sub("attn").sub("to_q"), d.dim, d.dim),
          nn::Linear(w.sub("attn").sub("to_k"), d.dim, d.dim),
          nn::Linear(w.sub("attn").sub("to_v"), d.dim, d.dim),
          nn::Linear(w.sub("proj_mlp"), d.dim, d.mlp_hidden),
          nn::Linear(w.sub("proj_out"), d.dim + d.mlp_hidden, d.dim),
          nn::RMSNorm(w.sub("attn").sub("norm_q"), d.head_dim, kNormEps),
          nn::RMSNorm(w.sub("attn").sub("norm_k"), d.head_dim, kNormEps)};
}

std::pair<Tensor, Tensor> math(const SingleStreamWeights& s, const nn::BlockDims& dims, const Tensor& x,
                               const Tensor& c, const Tensor& temb, const nn::RotaryTables& rope) {
  const int64_t hd = dims.head_dim, L_txt = c.dim(1), S = c.dim(1) + x.dim(1);
  const Tensor h = concat({c, x}, 1);  // the residual
  // AdaLayerNormZeroSingle chunks: shift, scale, gate.
  const std::vector<Tensor> m = chunk(s.norm(silu(temb)), 3, 1);
  const Tensor h_n = modulate(layer_norm_no_affine(h), m[1], m[0]);
  // MLP and attention branches read the same h_n; attention has no output projection.
  const Tensor mlp = gelu(s.proj_mlp(h_n), "tanh");
  const Tensor a = nn::rope_attention(s.norm_q(split_heads(s.to_q(h_n), hd)), s.norm_k(split_heads(s.to_k(h_n), hd)),
                                      split_heads(s.to_v(h_n), hd), rope);
  const Tensor out = nn::clamp_fp16(h + unsqueeze(m[2], 1) * s.proj_out(concat({a, mlp}, 2)));
  return {slice(out, 1, 0, L_txt), slice(out, 1, L_txt, S)};
}

}  // namespace

// ---- what both kinds share ----

template <typename W>
FluxBlock<W>::FluxBlock(const nn::Weights& w, const nn::BlockDims& dims) : w_(load<W>(w, dims)), dims_(dims) {}

template <typename W>
std::pair<Tensor, Tensor> FluxBlock<W>::operator()(const Tensor& x, const Tensor& c, const Tensor& temb,
                                                   const nn::RotaryTables& rope) const {
  if (compiled() == nullptr) return forward(x, c, temb, rope);
  std::vector<Tensor> out = (*compiled())(rope.args({x, c, temb}), parameters());
  return {out[0], out[1]};
}

template <typename W>
std::pair<Tensor, Tensor> FluxBlock<W>::forward(const Tensor& x, const Tensor& c, const Tensor& temb,
                                                const nn::RotaryTables& rope) const {
  return math(w_, dims_, x, c, temb, rope);
}

// The compiled form traces `forward` of a copy of the block (taken before it is compiled, so the
// trace computes the math), args (x, c, temb, rope tables).
template <typename W>
void FluxBlock<W>::compile(const CompileOptions& options) {
  compiled_.reset();
  compiled_ = std::make_shared<const CompiledFunction>(
      kClassName,
      [self = *this](const std::vector<Tensor>& a) {
        auto [c, x] = self.forward(a[0], a[1], a[2], nn::RotaryTables::from_args(a, 3));
        return std::vector<Tensor>{c, x};
      },
      options, nn::RotaryTables::arg_names({"hidden_states", "encoder_hidden_states", "temb"}));
}

template class FluxBlock<DoubleStreamWeights>;
template class FluxBlock<SingleStreamWeights>;

}  // namespace kiln::flux
