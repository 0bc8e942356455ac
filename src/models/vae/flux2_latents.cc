#include "models/vae/flux2_latents.h"

#include <algorithm>

#include "core/error.h"
#include "exec/host.h"
#include "exec/ops.h"

namespace kiln::flux2_latents {

namespace {

constexpr const char* kWhere = "flux2 latents";

void check_patch(PatchSize patch) {
  KILN_CHECK(patch[0] > 0 && patch[1] > 0, kWhere, "patch size must be positive, got (", patch[0], ", ", patch[1],
             ")");
}

// The statistics as [1, N, 1, 1] in x's dtype: the mean cast, the std = sqrt(var + eps) evaluated
// in the statistics' own dtype and then cast (a [QUIRK] of Diffusers).
std::pair<Tensor, Tensor> mean_and_std(const Tensor& x, const LatentBatchNorm& bn, const char* what) {
  KILN_CHECK(bn.running_mean.defined() && bn.running_var.defined(), kWhere, what, ": no batch-norm statistics");
  const int64_t n = bn.running_mean.numel();
  KILN_CHECK(bn.running_mean.rank() == 1 && bn.running_var.rank() == 1 && bn.running_var.numel() == n, kWhere, what,
             ": running_mean ", to_string(bn.running_mean.shape()), " and running_var ",
             to_string(bn.running_var.shape()), " must be vectors of one length");
  KILN_CHECK(x.rank() == 4 && x.dim(1) == n, kWhere, what, " expects patchified latents [B, ", n,
             ", h, w] (one channel per batch-norm statistic), got ", to_string(x.shape()));
  const Shape s{1, n, 1, 1};
  const Tensor mean = cast(reshape(bn.running_mean, s), x.dtype());
  const Tensor std = cast(sqrt(reshape(bn.running_var, s) + bn.eps), x.dtype());
  return {mean, std};
}

}  // namespace

Tensor patchify(const Tensor& z, PatchSize patch) {
  check_patch(patch);
  const auto [ph, pw] = patch;
  KILN_CHECK(z.rank() == 4 && z.dim(2) % ph == 0 && z.dim(3) % pw == 0, kWhere,
             "patchify expects latents [B, C, H, W] with H a multiple of ", ph, " and W a multiple of ", pw, ", got ",
             to_string(z.shape()));
  const int64_t b = z.dim(0), c = z.dim(1), h = z.dim(2) / ph, w = z.dim(3) / pw;
  const Tensor t = permute(reshape(contiguous(z), {b, c, h, ph, w, pw}), {0, 1, 3, 5, 2, 4});
  return contiguous(reshape(t, {b, c * ph * pw, h, w}));
}

Tensor unpatchify(const Tensor& zp, PatchSize patch) {
  check_patch(patch);
  const auto [ph, pw] = patch;
  KILN_CHECK(zp.rank() == 4 && zp.dim(1) % (ph * pw) == 0, kWhere,
             "unpatchify expects patchified latents [B, C·", ph * pw, ", h, w], got ", to_string(zp.shape()));
  const int64_t b = zp.dim(0), c = zp.dim(1) / (ph * pw), h = zp.dim(2), w = zp.dim(3);
  const Tensor t = permute(reshape(contiguous(zp), {b, c, ph, pw, h, w}), {0, 1, 4, 2, 5, 3});
  return contiguous(reshape(t, {b, c, h * ph, w * pw}));
}

Tensor bn_normalize(const Tensor& zp, const LatentBatchNorm& bn) {
  const auto [mean, std] = mean_and_std(zp, bn, "bn_normalize");
  return (zp - mean) / std;
}

Tensor bn_denormalize(const Tensor& zn, const LatentBatchNorm& bn) {
  const auto [mean, std] = mean_and_std(zn, bn, "bn_denormalize");
  return zn * std + mean;
}

Tensor pack(const Tensor& x) {
  KILN_CHECK(x.rank() == 4, kWhere, "pack expects latents [B, C, h, w], got ", to_string(x.shape()));
  return contiguous(transpose(reshape(contiguous(x), {x.dim(0), x.dim(1), x.dim(2) * x.dim(3)}), 1, 2));
}

Tensor unpack(const Tensor& tokens, int64_t h, int64_t w) {
  KILN_CHECK(tokens.rank() == 3 && h > 0 && w > 0 && tokens.dim(1) == h * w, kWhere,
             "unpack expects tokens [B, h·w, C] for a ", h, "x", w, " grid, got ", to_string(tokens.shape()));
  return contiguous(reshape(transpose(tokens, 1, 2), {tokens.dim(0), tokens.dim(2), h, w}));
}

Tensor unpack_with_ids(const Tensor& tokens, const Tensor& ids) {
  KILN_CHECK(tokens.rank() == 3, kWhere, "unpack expects tokens [B, N, C], got ", to_string(tokens.shape()));
  const int64_t b = tokens.dim(0), n = tokens.dim(1), c = tokens.dim(2);
  KILN_CHECK(ids.rank() == 3 && ids.dim(0) == b && ids.dim(1) == n && ids.dim(2) >= 3 && !is_floating(ids.dtype()),
             kWhere, "unpack expects integer ids [", b, ", ", n, ", 4] for tokens ", to_string(tokens.shape()),
             ", got ", ids.describe());
  KILN_CHECK(n > 0, kWhere, "unpack: no tokens");
  const std::vector<int64_t> v = to_int_vector(contiguous(ids));
  const int64_t cols = ids.dim(2);
  auto y_of = [&](int64_t bi, int64_t i) { return v[size_t((bi * n + i) * cols + 1)]; };
  auto x_of = [&](int64_t bi, int64_t i) { return v[size_t((bi * n + i) * cols + 2)]; };
  int64_t h = -1, w = -1;
  for (int64_t bi = 0; bi < b; ++bi) {
    int64_t hb = 0, wb = 0;
    for (int64_t i = 0; i < n; ++i) {
      KILN_CHECK(y_of(bi, i) >= 0 && x_of(bi, i) >= 0, kWhere, "unpack: token ", i, " of batch entry ", bi,
                 " has a negative position (", y_of(bi, i), ", ", x_of(bi, i), ")");
      hb = std::max(hb, y_of(bi, i) + 1);
      wb = std::max(wb, x_of(bi, i) + 1);
    }
    KILN_CHECK(bi == 0 || (hb == h && wb == w), kWhere, "unpack: batch entry ", bi, " spans a ", hb, "x", wb,
               " grid, entry 0 a ", h, "x", w, " one");
    h = hb, w = wb;
  }
  // Where each grid position's token is (n: none, a zero row), per batch entry.
  std::vector<int64_t> source(size_t(b * h * w), n);
  bool row_major = n == h * w;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t flat = y_of(bi, i) * w + x_of(bi, i);
      int64_t& s = source[size_t(bi * h * w + flat)];
      KILN_CHECK(s == n, kWhere, "unpack: tokens ", s, " and ", i, " of batch entry ", bi, " both have position (",
                 y_of(bi, i), ", ", x_of(bi, i), ")");
      s = i;
      row_major = row_major && flat == i;
    }
  if (row_major) return unpack(tokens, h, w);
  std::vector<Tensor> out;
  for (int64_t bi = 0; bi < b; ++bi) {
    const Tensor none = zeros({1, c}, tokens.dtype(), tokens.device());
    const Tensor table = concat({reshape(slice(tokens, 0, bi, bi + 1), {n, c}), none}, 0);
    const std::vector<int64_t> idx(source.begin() + bi * h * w, source.begin() + (bi + 1) * h * w);
    const Tensor rows = gather(table, from_ints(idx, {h * w}, DType::i64, tokens.device()));  // [h·w, C]
    out.push_back(reshape(transpose(rows, 0, 1), {1, c, h, w}));
  }
  return contiguous(concat(out, 0));
}

Tensor tokens_to_vae_latents(const Tensor& tokens, const Tensor& ids, const LatentBatchNorm& bn, PatchSize patch) {
  return unpatchify(bn_denormalize(unpack_with_ids(tokens, ids), bn), patch);
}

}  // namespace kiln::flux2_latents
