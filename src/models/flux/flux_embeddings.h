// FLUX.1 transformer embeddings (spec flux1.md §2.5.2): the rotary tables of FluxPosEmbed and
// their application to Q/K. (The time/guidance/pooled-text embeddings are nn/embeddings.h.)
#pragma once
#include <vector>

#include "nn/layers.h"

namespace kiln::flux {

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
