#include "models/sd3/sd3_embeddings.h"

#include "core/error.h"

namespace kiln::sd3 {

PatchEmbed::PatchEmbed(const nn::Weights& w, int64_t in_channels, int64_t dim, int64_t patch_size,
                       int64_t pos_embed_max_size)
    : proj_(w.sub("proj"), in_channels, dim, patch_size, /*stride=*/patch_size),
      pos_embed_(w.get("pos_embed", {1, pos_embed_max_size * pos_embed_max_size, dim})),
      patch_size_(patch_size),
      max_size_(pos_embed_max_size) {}

Tensor PatchEmbed::cropped_pos_embed(int64_t height, int64_t width) const {
  const int64_t h = height / patch_size_, w = width / patch_size_, M = max_size_;
  KILN_CHECK(h <= M && w <= M, "PatchEmbed", "a latent of ", height, "x", width, " is ", h, "x", w,
             " patches, more than pos_embed_max_size = ", M, " in a dimension");
  const int64_t top = (M - h) / 2, left = (M - w) / 2;
  const Tensor grid = reshape(pos_embed_, {M, M, -1});
  const Tensor crop = slice(slice(grid, 0, top, top + h), 1, left, left + w);
  return reshape(crop, {1, h * w, -1});
}

Tensor PatchEmbed::operator()(const Tensor& latents) const {
  // [B, D, h/p, w/p] -> [B, (h/p)(w/p), D]: token index = row·(w/p) + col.
  const Tensor tokens = transpose(flatten(proj_(latents), 2), 1, 2);
  return tokens + cropped_pos_embed(latents.dim(2), latents.dim(3));
}

void PatchEmbed::append_parameters(std::vector<Tensor>& out) const {
  out.push_back(proj_.weight);
  out.push_back(proj_.bias);
  out.push_back(pos_embed_);
}

}  // namespace kiln::sd3
