// Stable Diffusion 3 / 3.5 patch embedding: Diffusers' PatchEmbed
// with pos_embed_max_size. The latents are cut into p×p patches by a Conv2d (kernel = stride = p),
// flattened to tokens row by row, and the centre crop of the checkpoint's positional table
// `pos_embed.pos_embed` [1, M², D] is added. (The timestep/pooled embedding is FLUX's
// CombinedTimestepTextProjEmbeddings, nn::TimeTextEmbed without guidance.)
#pragma once
#include <vector>

#include "nn/layers.h"

namespace kiln::sd3 {

class PatchEmbed {
 public:
  PatchEmbed() = default;
  // `w`: the "pos_embed." weights (proj.weight [D, C, p, p], proj.bias [D], pos_embed [1, M², D]).
  PatchEmbed(const nn::Weights& w, int64_t in_channels, int64_t dim, int64_t patch_size, int64_t pos_embed_max_size);

  // latents [B, C, h, w] (h, w multiples of p, h/p and w/p <= M) -> tokens [B, (h/p)(w/p), D].
  Tensor operator()(const Tensor& latents) const;
  // The positional table for a latent of height × width: rows top..top+h/p-1, columns
  // left..left+w/p-1 of the M × M grid, top = (M - h/p) // 2, left = (M - w/p) // 2, flattened
  // row-major -> [1, (h/p)(w/p), D].
  Tensor cropped_pos_embed(int64_t height, int64_t width) const;
  void append_parameters(std::vector<Tensor>& out) const;

 private:
  nn::Conv2d proj_;
  Tensor pos_embed_;  // [1, M², D], stored in the checkpoint (a persistent buffer), loaded as is
  int64_t patch_size_ = 1, max_size_ = 0;
};

}  // namespace kiln::sd3
