// The building blocks of Diffusers' AutoencoderKL, loaded under the Diffusers
// state-dict names. In the VAE every GroupNorm has the config's norm_num_groups and eps 1e-6,
// the activation is SiLU and there is no time embedding.
#pragma once
#include <optional>
#include <vector>

#include "nn/layers.h"

namespace kiln::vae {

// Shared by every block of one VAE.
struct NormSpec {
  int64_t groups = 32;
  double eps = 1e-6;
};

// y = skip(x) + conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))); skip is a 1x1 conv when in != out.
struct ResnetBlock2D {
  ResnetBlock2D(const nn::Weights& w, int64_t in_channels, int64_t out_channels, NormSpec norm);
  Tensor operator()(const Tensor& x) const;

  nn::GroupNorm norm1, norm2;
  nn::Conv2d conv1, conv2;
  std::optional<nn::Conv2d> conv_shortcut;
};

// Single-head self-attention over the H*W positions with a GroupNorm in front and a residual
// (Diffusers' Attention with group_norm, heads = 1, head dim = C).
struct AttentionBlock {
  AttentionBlock(const nn::Weights& w, int64_t channels, NormSpec norm);
  Tensor operator()(const Tensor& x) const;

  nn::GroupNorm group_norm;
  nn::Linear to_q, to_k, to_v, to_out;
  int64_t channels;
};

// Nearest-neighbour x2, then a 3x3 conv (padding 1).
struct Upsample2D {
  static constexpr const char* kModuleList = "upsamplers";  // what UpDecoderBlock2D keeps it under
  Upsample2D(const nn::Weights& w, int64_t channels);
  Tensor operator()(const Tensor& x) const { return conv(upsample_nearest2x(x)); }
  nn::Conv2d conv;
};

// Zero pad right and bottom by one (Diffusers' padding=0 case), then a 3x3 conv with stride 2.
struct Downsample2D {
  static constexpr const char* kModuleList = "downsamplers";  // what DownEncoderBlock2D keeps it under
  Downsample2D(const nn::Weights& w, int64_t channels);
  Tensor operator()(const Tensor& x) const;
  nn::Conv2d conv;
};

// UNetMidBlock2D: resnets.0 -> attentions.0 (when add_attention) -> resnets.1, all C -> C.
struct MidBlock2D {
  MidBlock2D(const nn::Weights& w, int64_t channels, NormSpec norm, bool add_attention);
  Tensor operator()(const Tensor& x) const;

  std::vector<ResnetBlock2D> resnets;
  std::optional<AttentionBlock> attention;
};

// The decoder's and the encoder's blocks differ only in the sampler after their resnets:
// `num_layers` resnets (the first in -> out), then an optional Sampler (Upsample2D or
// Downsample2D) at Sampler::kModuleList.0. Defined for those two in vae_blocks.cc.
template <typename Sampler>
struct ResnetSamplerBlock2D {
  ResnetSamplerBlock2D(const nn::Weights& w, int64_t in_channels, int64_t out_channels, int64_t num_layers,
                       bool add_sampler, NormSpec norm);
  Tensor operator()(const Tensor& x) const;

  std::vector<ResnetBlock2D> resnets;
  std::optional<Sampler> sampler;
};

using UpDecoderBlock2D = ResnetSamplerBlock2D<Upsample2D>;      // Diffusers' UpDecoderBlock2D
using DownEncoderBlock2D = ResnetSamplerBlock2D<Downsample2D>;  // Diffusers' DownEncoderBlock2D

}  // namespace kiln::vae
