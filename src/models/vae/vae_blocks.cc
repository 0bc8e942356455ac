#include "models/vae/vae_blocks.h"

namespace kiln::vae {

ResnetBlock2D::ResnetBlock2D(const nn::Weights& w, int64_t in, int64_t out, NormSpec norm)
    : norm1(w.sub("norm1"), norm.groups, in, norm.eps),
      norm2(w.sub("norm2"), norm.groups, out, norm.eps),
      conv1(w.sub("conv1"), in, out, 3, 1, 1),
      conv2(w.sub("conv2"), out, out, 3, 1, 1) {
  // Diffusers creates the 1x1 shortcut exactly when the channel count changes.
  if (in != out) conv_shortcut.emplace(w.sub("conv_shortcut"), in, out, 1, 1, 0);
}

Tensor ResnetBlock2D::operator()(const Tensor& x) const {
  const Tensor h = conv1(norm1.then_silu(x));
  const Tensor skip = conv_shortcut ? (*conv_shortcut)(x) : x;
  return conv2(norm2.then_silu(h), skip);  // skip + conv2(...); output_scale_factor is 1 in the VAE
}

namespace {
// Old checkpoints name the projections query/key/value/proj_attn (Diffusers renames them on
// load); use the old name only when the new one is absent and the old one is there.
nn::Weights attn_sub(const nn::Weights& w, const std::string& name, const std::string& legacy) {
  return !w.has(name + ".weight") && w.has(legacy + ".weight") ? w.sub(legacy) : w.sub(name);
}
}  // namespace

AttentionBlock::AttentionBlock(const nn::Weights& w, int64_t c, NormSpec norm)
    : group_norm(w.sub("group_norm"), norm.groups, c, norm.eps),
      to_q(attn_sub(w, "to_q", "query"), c, c),
      to_k(attn_sub(w, "to_k", "key"), c, c),
      to_v(attn_sub(w, "to_v", "value"), c, c),
      to_out(attn_sub(w, "to_out.0", "proj_attn"), c, c),
      channels(c) {}

Tensor AttentionBlock::operator()(const Tensor& x) const {
  const int64_t b = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
  // GroupNorm over [B, C, H*W] normalises the same groups as over [B, C, H, W].
  const Tensor s = transpose(reshape(group_norm(x), {b, c, h * w}), 1, 2);  // [B, HW, C]
  // One head of width C: [B, 1, HW, C]; scale 1/sqrt(C) is the SDPA default.
  const Tensor q = unsqueeze(to_q(s), 1), k = unsqueeze(to_k(s), 1), v = unsqueeze(to_v(s), 1);
  const Tensor o = to_out(squeeze(scaled_dot_product_attention(q, k, v), 1));  // [B, HW, C]
  return reshape(transpose(o, 1, 2), {b, c, h, w}) + x;  // residual; rescale_output_factor 1
}

Upsample2D::Upsample2D(const nn::Weights& w, int64_t c) : conv(w.sub("conv"), c, c, 3, 1, 1) {}

Downsample2D::Downsample2D(const nn::Weights& w, int64_t c) : conv(w.sub("conv"), c, c, 3, 2, 0) {}

Tensor Downsample2D::operator()(const Tensor& x) const {
  // F.pad(x, (0, 1, 0, 1)): nothing on the left/top, one zero column/row on the right/bottom.
  return conv(pad(x, {0, 0, 0, 0, 0, 1, 0, 1}));
}

MidBlock2D::MidBlock2D(const nn::Weights& w, int64_t c, NormSpec norm, bool add_attention) {
  resnets.emplace_back(w.sub("resnets", 0), c, c, norm);
  if (add_attention) attention.emplace(w.sub("attentions", 0), c, norm);
  resnets.emplace_back(w.sub("resnets", 1), c, c, norm);
}

Tensor MidBlock2D::operator()(const Tensor& x) const {
  Tensor h = resnets[0](x);
  if (attention) h = (*attention)(h);
  return resnets[1](h);
}

template <typename Sampler>
ResnetSamplerBlock2D<Sampler>::ResnetSamplerBlock2D(const nn::Weights& w, int64_t in, int64_t out,
                                                    int64_t num_layers, bool add_sampler, NormSpec norm) {
  for (int64_t i = 0; i < num_layers; ++i) resnets.emplace_back(w.sub("resnets", i), i == 0 ? in : out, out, norm);
  if (add_sampler) sampler.emplace(w.sub(Sampler::kModuleList, 0), out);
}

template <typename Sampler>
Tensor ResnetSamplerBlock2D<Sampler>::operator()(const Tensor& x) const {
  Tensor h = x;
  for (const auto& r : resnets) h = r(h);
  return sampler ? (*sampler)(h) : h;
}

template struct ResnetSamplerBlock2D<Upsample2D>;
template struct ResnetSamplerBlock2D<Downsample2D>;

}  // namespace kiln::vae
