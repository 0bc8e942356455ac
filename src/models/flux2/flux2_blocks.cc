#include "models/flux2/flux2_blocks.h"

#include "nn/activations.h"
#include "nn/rotary_embedding.h"

namespace kiln::flux2 {
namespace {

using nn::rope_attention;
using nn::layer_norm_no_affine;
using nn::modulate;
using nn::split_heads;
using nn::clamp_fp16;

constexpr double kNormEps = 1e-6;  // every LayerNorm and QK RMSNorm in the transformer


// A [B, k·D] modulation as its k chunks [B, D].
std::vector<Tensor> chunks(const Tensor& mod, int64_t k) { return chunk(mod, k, 1); }
Tensor gate(const Tensor& g, const Tensor& y) { return unsqueeze(g, 1) * y; }


}  // namespace

Tensor swiglu(const Tensor& u) {
  const std::vector<Tensor> h = chunk(u, 2, -1);
  return silu(h[0]) * h[1];
}

// ---- double-stream block ----

Flux2TransformerBlock::Flux2TransformerBlock(const nn::Weights& w, const nn::BlockDims& d) : dims_(d) {
  const int64_t D = d.dim, hd = d.head_dim, F = d.mlp_hidden;
  const nn::Weights attn = w.sub("attn");
  const auto stream = [&](const char* q, const char* k, const char* v, const nn::Weights& out, const char* ff,
                          const char* nq, const char* nk) {
    return Stream{nn::Linear(attn.sub(q), D, D, false),
                  nn::Linear(attn.sub(k), D, D, false),
                  nn::Linear(attn.sub(v), D, D, false),
                  nn::Linear(out, D, D, false),
                  nn::Linear(w.sub(ff).sub("linear_in"), D, 2 * F, false),
                  nn::Linear(w.sub(ff).sub("linear_out"), F, D, false),
                  nn::RMSNorm(attn.sub(nq), hd, kNormEps),
                  nn::RMSNorm(attn.sub(nk), hd, kNormEps)};
  };
  img_ = stream("to_q", "to_k", "to_v", attn.sub("to_out").sub("0"), "ff", "norm_q", "norm_k");
  txt_ = stream("add_q_proj", "add_k_proj", "add_v_proj", attn.sub("to_add_out"), "ff_context", "norm_added_q",
                "norm_added_k");
}

std::pair<Tensor, Tensor> Flux2TransformerBlock::operator()(const Tensor& x, const Tensor& c, const Tensor& mod_img,
                                                            const Tensor& mod_txt, const RotaryTables& rope) const {
  if (compiled() == nullptr) return forward(x, c, mod_img, mod_txt, rope);
  const std::vector<Tensor> out =
      (*compiled())(rope.args({x, c, mod_img, mod_txt}), parameters());
  return {out[0], out[1]};
}

void Flux2TransformerBlock::compile(const CompileOptions& options) {
  compiled_.reset();  // the copy below traces the math
  compiled_ = std::make_shared<const CompiledFunction>(
      kClassName,
      [self = *this](const std::vector<Tensor>& a) {
        auto [c, x] = self.forward(a[0], a[1], a[2], a[3], RotaryTables::from_args(a, 4));
        return std::vector<Tensor>{c, x};
      },
      options, RotaryTables::arg_names({"hidden_states", "encoder_hidden_states", "temb_mod_img", "temb_mod_txt"}));
}

std::pair<Tensor, Tensor> Flux2TransformerBlock::forward(const Tensor& x, const Tensor& c, const Tensor& mod_img,
                                                         const Tensor& mod_txt, const RotaryTables& rope) const {
  const int64_t hd = dims_.head_dim, L_txt = c.dim(1), S = c.dim(1) + x.dim(1);
  // Chunks: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp.
  const std::vector<Tensor> m = chunks(mod_img, 6), mc = chunks(mod_txt, 6);
  const Tensor x_n = modulate(layer_norm_no_affine(x), m[1], m[0]);
  const Tensor c_n = modulate(layer_norm_no_affine(c), mc[1], mc[0]);

  // Joint attention: each stream projects and RMS-normalises its own Q/K; text comes first.
  const Tensor q = concat({txt_.norm_q(split_heads(txt_.q(c_n), hd)), img_.norm_q(split_heads(img_.q(x_n), hd))}, 1);
  const Tensor k = concat({txt_.norm_k(split_heads(txt_.k(c_n), hd)), img_.norm_k(split_heads(img_.k(x_n), hd))}, 1);
  const Tensor v = concat({split_heads(txt_.v(c_n), hd), split_heads(img_.v(x_n), hd)}, 1);
  const Tensor o = rope_attention(q, k, v, rope);

  Tensor xo = x + gate(m[2], img_.out(slice(o, 1, L_txt, S)));
  xo = xo + gate(m[5], img_.ff_out(swiglu(img_.ff_in(modulate(layer_norm_no_affine(xo), m[4], m[3])))));
  Tensor co = c + gate(mc[2], txt_.out(slice(o, 1, 0, L_txt)));
  co = co + gate(mc[5], txt_.ff_out(swiglu(txt_.ff_in(modulate(layer_norm_no_affine(co), mc[4], mc[3])))));
  return {clamp_fp16(co), xo};  // Diffusers clamps only the text stream here
}

// ---- single-stream block ----

Flux2SingleTransformerBlock::Flux2SingleTransformerBlock(const nn::Weights& w, const nn::BlockDims& d)
    : to_qkv_mlp_proj_(w.sub("attn").sub("to_qkv_mlp_proj"), d.dim, 3 * d.dim + 2 * d.mlp_hidden, false),
      to_out_(w.sub("attn").sub("to_out"), d.dim + d.mlp_hidden, d.dim, false),
      norm_q_(w.sub("attn").sub("norm_q"), d.head_dim, kNormEps),
      norm_k_(w.sub("attn").sub("norm_k"), d.head_dim, kNormEps),
      dims_(d) {}

Tensor Flux2SingleTransformerBlock::operator()(const Tensor& s, const Tensor& mod, const RotaryTables& rope) const {
  if (compiled() == nullptr) return forward(s, mod, rope);
  return (*compiled())(rope.args({s, mod}), parameters())[0];
}

void Flux2SingleTransformerBlock::compile(const CompileOptions& options) {
  compiled_.reset();
  compiled_ = std::make_shared<const CompiledFunction>(
      kClassName,
      [self = *this](const std::vector<Tensor>& a) {
        return std::vector<Tensor>{self.forward(a[0], a[1], RotaryTables::from_args(a, 2))};
      },
      options, RotaryTables::arg_names({"hidden_states", "temb_mod"}));
}

Tensor Flux2SingleTransformerBlock::forward(const Tensor& s, const Tensor& mod, const RotaryTables& rope) const {
  const int64_t hd = dims_.head_dim, D = dims_.dim, F = dims_.mlp_hidden;
  const std::vector<Tensor> m = chunks(mod, 3);  // shift, scale, gate
  const Tensor u = to_qkv_mlp_proj_(modulate(layer_norm_no_affine(s), m[1], m[0]));
  // [Q | K | V | gate | up], split by the global ratio 3D : 2F so a tensor-parallel share (each
  // block sliced on its own) splits the same way.
  const int64_t width = u.dim(2), d_local = width * D / (3 * D + 2 * F);
  const std::vector<Tensor> parts = split(u, {d_local, d_local, d_local, width - 3 * d_local}, 2);
  const Tensor a = rope_attention(norm_q_(split_heads(parts[0], hd)), norm_k_(split_heads(parts[1], hd)),
                                  split_heads(parts[2], hd), rope);
  return clamp_fp16(s + gate(m[2], to_out_(concat({a, swiglu(parts[3])}, 2))));
}

}  // namespace kiln::flux2
