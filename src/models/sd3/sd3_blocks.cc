#include "models/sd3/sd3_blocks.h"

#include <cmath>

namespace kiln::sd3 {
namespace {

using nn::layer_norm_no_affine;
using nn::modulate;
using nn::split_heads;

constexpr double kNormEps = 1e-6;  // every LayerNorm and QK RMSNorm in the transformer

// gate [B, D] ⊙ y [B, L, D].
Tensor gated(const Tensor& gate, const Tensor& y) { return unsqueeze(gate, 1) * y; }

// FeedForward(dim, activation "gelu-approximate"): net.2(GELU_tanh(net.0.proj(z))).
Tensor feed_forward(const nn::Linear& in, const nn::Linear& out, const Tensor& z) { return out(gelu(in(z), "tanh")); }

const std::vector<std::string> kArgNames{"hidden_states", "encoder_hidden_states", "temb"};

// The compiled form of a block: traces `forward` of a copy of the block taken before it is
// compiled (so the trace computes the math). A context_pre_only block returns only x: its
// text output does not exist.
std::shared_ptr<const CompiledFunction> compile_block(const JointTransformerBlock& block,
                                                      const CompileOptions& options) {
  return std::make_shared<const CompiledFunction>(
      JointTransformerBlock::kClassName,
      [self = block](const std::vector<Tensor>& a) {
        auto [c, x] = self.forward(a[0], a[1], a[2]);
        if (self.structure().context_pre_only) return std::vector<Tensor>{x};
        return std::vector<Tensor>{c, x};
      },
      options, kArgNames);
}

}  // namespace

Tensor dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t hd = q.dim(3);
  // SDPA wants [B, H, S, hd].
  const Tensor o = scaled_dot_product_attention(transpose(q, 1, 2), transpose(k, 1, 2), transpose(v, 1, 2), Tensor(),
                                                1.0 / std::sqrt(double(hd)));
  return flatten(transpose(o, 1, 2), 2);
}

// ---- construction ----

JointTransformerBlock::JointTransformerBlock(const nn::Weights& w, const nn::BlockDims& d,
                                             const JointBlockStructure& s)
    : dims_(d), structure_(s) {
  const int64_t D = d.dim, hd = d.head_dim, M = d.mlp_hidden;
  norm1_ = nn::Linear(w.sub("norm1").sub("linear"), D, (s.dual_attention ? 9 : 6) * D);
  norm1_context_ = nn::Linear(w.sub("norm1_context").sub("linear"), D, (s.context_pre_only ? 2 : 6) * D);
  // All of attn/attn2's linears have a bias; their Q/K norms are RMSNorm(head_dim, eps 1e-6)
  // with a weight.
  const auto stream = [&](const nn::Weights& a, const char* q, const char* k, const char* v, const char* out,
                          const char* nq, const char* nk, bool has_out) {
    Stream st{nn::Linear(a.sub(q), D, D),
              nn::Linear(a.sub(k), D, D),
              nn::Linear(a.sub(v), D, D),
              has_out ? nn::Linear(a.sub(out), D, D) : nn::Linear(),
              nn::RMSNorm(),
              nn::RMSNorm()};
    if (s.qk_norm) {
      st.norm_q = nn::RMSNorm(a.sub(nq), hd, kNormEps);
      st.norm_k = nn::RMSNorm(a.sub(nk), hd, kNormEps);
    }
    return st;
  };
  const nn::Weights attn = w.sub("attn");
  img_ = stream(attn, "to_q", "to_k", "to_v", "to_out.0", "norm_q", "norm_k", true);
  txt_ = stream(attn, "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "norm_added_q", "norm_added_k",
                !s.context_pre_only);
  if (s.dual_attention) attn2_ = stream(w.sub("attn2"), "to_q", "to_k", "to_v", "to_out.0", "norm_q", "norm_k", true);
  ff_in_ = nn::Linear(w.sub("ff").sub("net").sub("0").sub("proj"), D, M);
  ff_out_ = nn::Linear(w.sub("ff").sub("net").sub("2"), M, D);
  if (!s.context_pre_only) {
    ff_ctx_in_ = nn::Linear(w.sub("ff_context").sub("net").sub("0").sub("proj"), D, M);
    ff_ctx_out_ = nn::Linear(w.sub("ff_context").sub("net").sub("2"), M, D);
  }
}

void JointTransformerBlock::compile(const CompileOptions& options) {
  compiled_.reset();  // the traced copy must run the math, not this executable
  compiled_ = compile_block(*this, options);
}

// ---- forward ----

std::pair<Tensor, Tensor> JointTransformerBlock::operator()(const Tensor& x, const Tensor& c,
                                                            const Tensor& temb) const {
  if (compiled() == nullptr) return forward(x, c, temb);
  const std::vector<Tensor> out = (*compiled())({x, c, temb}, parameters());
  if (structure_.context_pre_only) return {Tensor(), out[0]};
  return {out[0], out[1]};
}

Tensor JointTransformerBlock::query(const Stream& s, const Tensor& x) const {
  const Tensor q = split_heads(s.q(x), dims_.head_dim);
  return structure_.qk_norm ? s.norm_q(q) : q;
}

Tensor JointTransformerBlock::key(const Stream& s, const Tensor& x) const {
  const Tensor k = split_heads(s.k(x), dims_.head_dim);
  return structure_.qk_norm ? s.norm_k(k) : k;
}

Tensor JointTransformerBlock::value(const Stream& s, const Tensor& x) const { return split_heads(s.v(x), dims_.head_dim); }

std::pair<Tensor, Tensor> JointTransformerBlock::forward(const Tensor& x, const Tensor& c, const Tensor& temb) const {
  const JointBlockStructure& st = structure_;
  const int64_t L_img = x.dim(1), S = x.dim(1) + c.dim(1);
  const Tensor act = silu(temb);
  // Image modulation chunks: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp
  // [, shift_msa2, scale_msa2, gate_msa2 with dual attention].
  const std::vector<Tensor> m = chunk(norm1_(act), st.dual_attention ? 9 : 6, 1);
  const Tensor x_normed = layer_norm_no_affine(x);
  const Tensor x_a = modulate(x_normed, m[1], m[0]);
  // Text modulation: AdaLayerNormZero's six chunks, or AdaLayerNormContinuous's (scale, shift).
  const std::vector<Tensor> mc = chunk(norm1_context_(act), st.context_pre_only ? 2 : 6, 1);
  const Tensor c_a = st.context_pre_only ? modulate(layer_norm_no_affine(c), mc[0], mc[1]) : modulate(layer_norm_no_affine(c), mc[1], mc[0]);

  // Joint attention over [image | text] (image first, unlike FLUX).
  const Tensor o = dot_product_attention(concat({query(img_, x_a), query(txt_, c_a)}, 1),
                                         concat({key(img_, x_a), key(txt_, c_a)}, 1),
                                         concat({value(img_, x_a), value(txt_, c_a)}, 1));

  // Image stream, in Diffusers' order: attention, the second attention, feed-forward.
  Tensor xo = x + gated(m[2], img_.out(slice(o, 1, 0, L_img)));
  if (st.dual_attention) {
    // attn2 reads the same normalised block input, modulated by the third chunk triple.
    const Tensor x_b = modulate(x_normed, m[7], m[6]);
    const Tensor a2 = dot_product_attention(query(attn2_, x_b), key(attn2_, x_b), value(attn2_, x_b));
    xo = xo + gated(m[8], attn2_.out(a2));
  }
  xo = xo + gated(m[5], feed_forward(ff_in_, ff_out_, modulate(layer_norm_no_affine(xo), m[4], m[3])));
  if (st.context_pre_only) return {Tensor(), xo};  // the text rows of the attention are dropped

  Tensor co = c + gated(mc[2], txt_.out(slice(o, 1, L_img, S)));
  co = co + gated(mc[5], feed_forward(ff_ctx_in_, ff_ctx_out_, modulate(layer_norm_no_affine(co), mc[4], mc[3])));
  return {co, xo};
}

}  // namespace kiln::sd3
