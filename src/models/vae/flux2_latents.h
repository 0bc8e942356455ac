// The FLUX.2 pipeline's latent transforms around AutoencoderKLFlux2: the VAE's
// 32-channel latents are 2x2-patchified to 128 channels, normalized with the VAE's batch-norm
// running statistics (bn.running_mean / bn.running_var, which the VAE's own encode/decode never
// apply) and packed into tokens for the transformer; decoding runs the same steps backwards:
//   tokens [B, h'·w', 128] --unpack--> [B, 128, h', w'] --bn_denormalize--> --unpatchify-->
//   [B, 32, 2h', 2w'] --AutoencoderKL::decode (post_quant_conv + decoder)--> image.
// Each op is exact data movement or the elementwise formula Diffusers uses, computed with engine ops
// in the tensors' dtypes, as Diffusers computes it.
#pragma once
#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace kiln {

// AutoencoderKLFlux2's `bn` (BatchNorm2d(patch_h·patch_w·latent_channels, affine=False)): only
// its running statistics are used, by the pipeline. running_mean / running_var are
// [patch_h·patch_w·latent_channels] in the VAE's dtype (Diffusers casts the buffers with the
// model, so they are bf16 in a bf16 pipeline); eps is the config's batch_norm_eps.
struct LatentBatchNorm {
  Tensor running_mean, running_var;
  double eps = 1e-4;
};

namespace flux2_latents {

using PatchSize = std::array<int64_t, 2>;  // (patch_h, patch_w); the VAE config's patch_size

// Diffusers' _patchify_latents: z [B, C, H, W] -> [B, C·ph·pw, H/ph, W/pw],
// where channel c·ph·pw + dy·pw + dx holds z[c, ph·Y + dy, pw·X + dx]. H and W must be multiples
// of the patch size.
Tensor patchify(const Tensor& z, PatchSize patch = {2, 2});
// Diffusers' _unpatchify_latents: the exact inverse of patchify,
// [B, C·ph·pw, h, w] -> [B, C, h·ph, w·pw].
Tensor unpatchify(const Tensor& zp, PatchSize patch = {2, 2});

// Normalization: (zp - mean) / sqrt(var + eps) per channel of zp [B, N, h, w] (N = the
// statistics' length). [QUIRK] sqrt(var + eps) is evaluated in the statistics' dtype and then cast
// to zp's dtype, as is the mean; the arithmetic on zp is in zp's dtype.
Tensor bn_normalize(const Tensor& zp, const LatentBatchNorm& bn);
// Its inverse, applied before decoding: zn · sqrt(var + eps) + mean (same dtype rules).
Tensor bn_denormalize(const Tensor& zn, const LatentBatchNorm& bn);

// Packing for the transformer: x [B, C, h, w] -> tokens [B, h·w, C], token y·w + x.
Tensor pack(const Tensor& x);
// The inverse of pack for a known grid: tokens [B, h·w, C] -> [B, C, h, w].
Tensor unpack(const Tensor& tokens, int64_t h, int64_t w);
// Diffusers' _unpack_latents_with_ids: scatters tokens [B, N, C] to
// [B, C, h, w] by their ids [B, N, 4] (integer; column 1 = row y, column 2 = column x), with
// h = max(y) + 1 and w = max(x) + 1 (the same for every batch entry); positions no token names
// are 0. Equals unpack(tokens, h, w) for row-major ids (token y·w + x at (y, x)). Ids that are
// negative or name one position twice are refused.
Tensor unpack_with_ids(const Tensor& tokens, const Tensor& ids);

// The pipeline's decode path up to the VAE: unpack_with_ids, bn_denormalize, unpatchify. Gives the
// input of AutoencoderKL::decode, [B, N / (ph·pw), 2h', 2w'] for tokens [B, h'·w', N].
Tensor tokens_to_vae_latents(const Tensor& tokens, const Tensor& ids, const LatentBatchNorm& bn,
                             PatchSize patch = {2, 2});

}  // namespace flux2_latents
}  // namespace kiln
