// Diffusers' embedding modules shared by the diffusion transformers (FLUX.1's and SD3's
// `time_text_embed`): the sinusoidal timestep projection and the timestep / guidance / pooled-text
// embedding MLPs (diffusers/models/embeddings.py).
#pragma once
#include <optional>
#include <vector>

#include "nn/layers.h"

namespace kiln::nn {

// Diffusers' Timesteps(channels, flip_sin_to_cos=True, downscale_freq_shift=0, scale=1) on a
// 1-D tensor of B values -> [B, channels] f32: [cos(t*f_k) | sin(t*f_k)], f_k = exp(-ln(1e4) k/half).
Tensor timestep_sinusoid(const Tensor& t, int64_t channels = 256);

// linear_2(SiLU(linear_1(x))): TimestepEmbedding and PixArtAlphaTextProjection(act "silu")
// have the same structure and key names.
struct MlpEmbedder {
  MlpEmbedder() = default;
  MlpEmbedder(const Weights& w, int64_t in_features, int64_t dim, bool bias = true);
  Tensor operator()(const Tensor& x) const { return linear_2(silu(linear_1(x))); }
  void append_parameters(std::vector<Tensor>& out) const {
    linear_1.append_parameters(out);
    linear_2.append_parameters(out);
  }
  Linear linear_1, linear_2;
};

// CombinedTimestepTextProjEmbeddings (schnell) / CombinedTimestepGuidanceTextProjEmbeddings
// (dev), under the key prefix "time_text_embed".
class TimeTextEmbed {
 public:
  TimeTextEmbed() = default;
  TimeTextEmbed(const Weights& w, int64_t dim, int64_t pooled_dim, bool guidance_embeds);
  // ts, gs: [B], already multiplied by 1000; pooled [B, P] -> temb [B, D].
  Tensor operator()(const Tensor& ts, const std::optional<Tensor>& gs, const Tensor& pooled) const;
  bool has_guidance() const { return guidance_embeds_; }
  void append_parameters(std::vector<Tensor>& out) const;

 private:
  MlpEmbedder timestep_embedder_, guidance_embedder_, text_embedder_;
  bool guidance_embeds_ = false;
};

}  // namespace kiln::nn
