// FLUX.1 transformer embeddings (spec flux1.md §2.5.1, §2.5.2): the sinusoidal timestep
// projection, the time/guidance/pooled-text embedding MLPs, the rotary tables of FluxPosEmbed
// and their application to Q/K.
#pragma once
#include <optional>
#include <vector>

#include "nn/layers.h"

namespace kiln::flux {

// Diffusers' Timesteps(channels, flip_sin_to_cos=True, downscale_freq_shift=0, scale=1) on a
// 1-D tensor of B values -> [B, channels] f32: [cos(t*f_k) | sin(t*f_k)], f_k = exp(-ln(1e4) k/half).
Tensor timestep_sinusoid(const Tensor& t, int64_t channels = 256);

// linear_2(SiLU(linear_1(x))): TimestepEmbedding and PixArtAlphaTextProjection(act "silu")
// have the same structure and key names.
struct MlpEmbedder {
  MlpEmbedder() = default;
  MlpEmbedder(const nn::Weights& w, int64_t in_features, int64_t dim);
  Tensor operator()(const Tensor& x) const { return linear_2(silu(linear_1(x))); }
  void append_parameters(std::vector<Tensor>& out) const {
    linear_1.append_parameters(out);
    linear_2.append_parameters(out);
  }
  nn::Linear linear_1, linear_2;
};

// CombinedTimestepTextProjEmbeddings (schnell) / CombinedTimestepGuidanceTextProjEmbeddings
// (dev), under the key prefix "time_text_embed".
class TimeTextEmbed {
 public:
  TimeTextEmbed() = default;
  TimeTextEmbed(const nn::Weights& w, int64_t dim, int64_t pooled_dim, bool guidance_embeds);
  // ts, gs: [B], already multiplied by 1000; pooled [B, P] -> temb [B, D].
  Tensor operator()(const Tensor& ts, const std::optional<Tensor>& gs, const Tensor& pooled) const;
  bool has_guidance() const { return guidance_embeds_; }
  void append_parameters(std::vector<Tensor>& out) const;

 private:
  MlpEmbedder timestep_embedder_, guidance_embedder_, text_embedder_;
  bool guidance_embeds_ = false;
};

// cos and sin tables [S, head_dim] (f32) for the joint sequence, text rows first.
struct RotaryTables {
  Tensor cos, sin;   // [S, head_dim]
  Tensor pair_sign;  // [head_dim/2, 2] of (-1, 1): rotates a reversed (x[2i+1], x[2i]) pair into (-x[2i+1], x[2i])
  static RotaryTables of(Tensor cos, Tensor sin);
};

// FluxPosEmbed(theta, axes_dim) on ids [S, n_axes]: per axis a, frequencies 1/theta^(2j/d_a)
// and phases pos*freq in float64, cos/sin rounded to f32, each frequency repeated for the
// adjacent pair (2j, 2j+1), axes concatenated along features.
RotaryTables flux_pos_embed(const Tensor& ids, const std::vector<int64_t>& axes_dim, double theta = 10000);

// Rotates adjacent pairs of x [B, S, H, hd] (Q or K): out[2i] = x[2i] c - x[2i+1] s,
// out[2i+1] = x[2i+1] c + x[2i] s, computed in f32 and cast back to x's dtype.
Tensor apply_rotary_emb(const Tensor& x, const RotaryTables& rope);

}  // namespace kiln::flux
