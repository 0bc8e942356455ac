#include "models/vae/autoencoder_kl.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "exec/host.h"

namespace kiln {

namespace {

constexpr const char* kWhere = "vae";

// The VAE computes in its weights' dtype (no upcast inside); an input in
// another dtype is cast to it first (torch would refuse the mix).
Tensor as_dtype(const Tensor& x, DType dtype) { return x.dtype() == dtype ? x : cast(x, dtype); }

}  // namespace

VaeConfig VaeConfig::from_json(const io::JsonConfig& json) {
  VaeConfig c;
  c.class_name = json.get_string("_class_name", c.class_name);
  KILN_CHECK(c.class_name == "AutoencoderKL" || c.class_name == "AutoencoderKLFlux2", kWhere, json.source(),
             ": field '_class_name' is '", c.class_name, "', expected AutoencoderKL or AutoencoderKLFlux2");
  const bool flux2 = c.has_latent_batch_norm();
  if (flux2) {  // AutoencoderKLFlux2's constructor defaults
    c.latent_channels = 32;
    c.layers_per_block = 2;
    c.block_out_channels = {128, 256, 512, 512};
    c.down_block_types.assign(4, "DownEncoderBlock2D");
    c.up_block_types.assign(4, "UpDecoderBlock2D");
    c.sample_size = 1024;
    c.patch_size = {2, 2};
  }
  c.in_channels = json.get_int("in_channels", c.in_channels);
  c.out_channels = json.get_int("out_channels", c.out_channels);
  c.latent_channels = json.get_int("latent_channels", c.latent_channels);
  c.layers_per_block = json.get_int("layers_per_block", c.layers_per_block);
  c.norm_num_groups = json.get_int("norm_num_groups", c.norm_num_groups);
  c.block_out_channels = json.get_int_list("block_out_channels", c.block_out_channels);
  c.down_block_types = json.get_string_list("down_block_types", c.down_block_types);
  c.up_block_types = json.get_string_list("up_block_types", c.up_block_types);
  c.act_fn = json.get_string("act_fn", c.act_fn);
  c.sample_size = json.get_int("sample_size", c.sample_size);
  if (flux2) {
    // No scaling/shift factor in this class (a stray field is ignored, as Diffusers ignores it).
    c.scaling_factor = 1;
    c.shift_factor = 0;
  } else {
    c.scaling_factor = json.get_float("scaling_factor", c.scaling_factor);
    c.shift_factor = json.get_float("shift_factor", c.shift_factor);
  }
  // The pipeline divides latents by scaling_factor: 0 or a non-number would decode every image black.
  KILN_CHECK(std::isfinite(c.scaling_factor) && c.scaling_factor != 0, kWhere, json.source(),
             ": field 'scaling_factor' is ", c.scaling_factor, ", expected a finite non-zero number (e.g. 0.3611)");
  KILN_CHECK(std::isfinite(c.shift_factor), kWhere, json.source(), ": field 'shift_factor' is ", c.shift_factor,
             ", expected a finite number");
  c.use_quant_conv = json.get_bool("use_quant_conv", c.use_quant_conv);
  c.use_post_quant_conv = json.get_bool("use_post_quant_conv", c.use_post_quant_conv);
  c.mid_block_add_attention = json.get_bool("mid_block_add_attention", c.mid_block_add_attention);

  const std::string& src = json.source();
  const size_t n = c.block_out_channels.size();
  KILN_CHECK(n > 0, kWhere, src, ": 'block_out_channels' is empty");
  KILN_CHECK(c.down_block_types.size() == n && c.up_block_types.size() == n, kWhere, src,
             ": 'down_block_types' (", c.down_block_types.size(), ") and 'up_block_types' (",
             c.up_block_types.size(), ") must have one entry per 'block_out_channels' entry (", n, ")");
  for (const auto& t : c.down_block_types)
    KILN_CHECK(t == "DownEncoderBlock2D", kWhere, src, ": down block type '", t,
               "' is not supported (only DownEncoderBlock2D)");
  for (const auto& t : c.up_block_types)
    KILN_CHECK(t == "UpDecoderBlock2D", kWhere, src, ": up block type '", t,
               "' is not supported (only UpDecoderBlock2D)");
  KILN_CHECK(c.act_fn == "silu", kWhere, src, ": act_fn '", c.act_fn, "' is not supported (only silu)");
  KILN_CHECK(c.layers_per_block > 0 && c.latent_channels > 0 && c.in_channels > 0 && c.out_channels > 0, kWhere,
             src, ": channel counts and layers_per_block must be positive");
  for (int64_t ch : c.block_out_channels)
    KILN_CHECK(c.norm_num_groups > 0 && ch > 0 && ch % c.norm_num_groups == 0, kWhere, src,
               ": block_out_channels entry ", ch, " is not divisible by norm_num_groups ", c.norm_num_groups);
  if (flux2) {
    c.batch_norm_eps = json.get_float("batch_norm_eps", c.batch_norm_eps);
    c.batch_norm_momentum = json.get_float("batch_norm_momentum", c.batch_norm_momentum);
    KILN_CHECK(std::isfinite(c.batch_norm_eps) && c.batch_norm_eps >= 0, kWhere, src, ": field 'batch_norm_eps' is ",
               c.batch_norm_eps, ", expected a finite non-negative number (e.g. 0.0001)");
    const std::vector<int64_t> patch = json.get_int_list("patch_size", {c.patch_size[0], c.patch_size[1]});
    KILN_CHECK(patch.size() == 2 && patch[0] > 0 && patch[1] > 0, kWhere, src,
               ": field 'patch_size' must be two positive integers (e.g. [2, 2])");
    c.patch_size = {patch[0], patch[1]};
    c.decoder_block_out_channels = json.get_int_list("decoder_block_out_channels", {});
    if (json.has("decoder_block_out_channels")) {
      KILN_CHECK(c.decoder_block_out_channels.size() == n, kWhere, src, ": 'decoder_block_out_channels' has ",
                 c.decoder_block_out_channels.size(), " entries, expected one per 'up_block_types' entry (", n, ")");
      for (int64_t ch : c.decoder_block_out_channels)
        KILN_CHECK(ch > 0 && ch % c.norm_num_groups == 0, kWhere, src, ": decoder_block_out_channels entry ", ch,
                   " is not divisible by norm_num_groups ", c.norm_num_groups);
    }
  }
  return c;
}

AutoencoderKL AutoencoderKL::from_pretrained(const std::filesystem::path& dir, std::optional<DType> dtype) {
  return AutoencoderKL(VaeConfig::from_json(io::JsonConfig(dir / "config.json")), nn::Weights(dir).with_dtype(dtype));
}

AutoencoderKL::AutoencoderKL(VaeConfig config, const nn::Weights& weights) : config_(std::move(config)) {
  const auto& c = config_;
  const vae::NormSpec norm{c.norm_num_groups, 1e-6};
  const auto& boc = c.block_out_channels;
  const int64_t n = int64_t(boc.size()), top = boc.back();

  // Decoder: channels run through reversed(decoder_channels()); every block but the last
  // doubles the size, and each has layers_per_block + 1 resnets.
  const auto& dch = c.decoder_channels();
  const nn::Weights d = weights.sub("decoder");
  decoder_.conv_in = nn::Conv2d(d.sub("conv_in"), c.latent_channels, dch.back(), 3, 1, 1);
  decoder_.mid_block.emplace(d.sub("mid_block"), dch.back(), norm, c.mid_block_add_attention);
  int64_t prev = dch.back();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t out = dch[size_t(n - 1 - i)];
    decoder_.blocks.emplace_back(d.sub("up_blocks", i), prev, out, c.layers_per_block + 1, i != n - 1, norm);
    prev = out;
  }
  decoder_.conv_norm_out = nn::GroupNorm(d.sub("conv_norm_out"), norm.groups, dch[0], norm.eps);
  decoder_.conv_out = nn::Conv2d(d.sub("conv_out"), dch[0], c.out_channels, 3, 1, 1);

  // AutoencoderKLFlux2's BatchNorm2d(affine=False): only its running statistics, in the VAE's
  // dtype (Diffusers casts the buffers with the model). bn.num_batches_tracked is left unread.
  if (c.has_latent_batch_norm()) {
    const nn::Weights bn = weights.sub("bn");
    const int64_t channels = c.batch_norm_channels();
    LatentBatchNorm stats{bn.get("running_mean", {channels}), bn.get("running_var", {channels}), c.batch_norm_eps};
    // sqrt(var + eps) must be a positive number for every channel, or every image decodes to NaN.
    const std::vector<float> mean = to_vector(stats.running_mean), var = to_vector(stats.running_var);
    for (size_t i = 0; i < var.size(); ++i)
      KILN_CHECK(std::isfinite(mean[i]) && std::isfinite(var[i]) && double(var[i]) + c.batch_norm_eps > 0, kWhere,
                 weights.describe(), ": ", bn.key("running_mean"), "/", bn.key("running_var"), " entry ", i,
                 " is mean ", mean[i], ", var ", var[i], "; expected finite values with var + batch_norm_eps > 0");
    latent_bn_ = std::move(stats);
  }
  if (c.use_post_quant_conv)
    post_quant_conv_.emplace(weights.sub("post_quant_conv"), c.latent_channels, c.latent_channels, 1);

  // Encoder (double_z: conv_out gives mean and logvar); every block but the last halves the size.
  const nn::Weights e = weights.sub("encoder");
  if (e.has("conv_in.weight")) {
    Encoder enc;
    enc.conv_in = nn::Conv2d(e.sub("conv_in"), c.in_channels, boc[0], 3, 1, 1);
    prev = boc[0];
    for (int64_t i = 0; i < n; ++i) {
      enc.blocks.emplace_back(e.sub("down_blocks", i), prev, boc[size_t(i)], c.layers_per_block, i != n - 1, norm);
      prev = boc[size_t(i)];
    }
    enc.mid_block.emplace(e.sub("mid_block"), top, norm, c.mid_block_add_attention);
    enc.conv_norm_out = nn::GroupNorm(e.sub("conv_norm_out"), norm.groups, top, norm.eps);
    enc.conv_out = nn::Conv2d(e.sub("conv_out"), top, 2 * c.latent_channels, 3, 1, 1);
    encoder_ = std::move(enc);
    if (c.use_quant_conv)
      quant_conv_.emplace(weights.sub("quant_conv"), 2 * c.latent_channels, 2 * c.latent_channels, 1);
  }
}

DType AutoencoderKL::dtype() const { return decoder_.conv_in.weight.dtype(); }

Tensor AutoencoderKL::decode(const Tensor& z_in, VaeTrace* trace) const {
  KILN_CHECK(z_in.rank() == 4 && z_in.dim(1) == config_.latent_channels, kWhere, "decode expects latents [B, ",
             config_.latent_channels, ", h, w], got ", to_string(z_in.shape()));
  auto record = [&](const char* name, const Tensor& t) {
    if (trace) (*trace)[name] = t;
  };
  // Channels-last activations throughout (ops.h): every conv, GroupNorm, upsample and residual
  // add reads and writes [N, H, W, C] memory, the convolution library's own layout, so no layer
  // reorders activations; the image comes back as a plain NCHW tensor.
  Tensor z = as_dtype(z_in, decoder_.conv_in.weight.dtype());
  if (memory_format_ == MemoryFormat::kChannelsLast) z = to_channels_last(z);
  if (post_quant_conv_) z = (*post_quant_conv_)(z);
  Tensor h = decoder_.conv_in(z);
  record("decoder.conv_in", h);
  h = (*decoder_.mid_block)(h);
  record("decoder.mid_block", h);
  for (size_t i = 0; i < decoder_.blocks.size(); ++i) {
    h = decoder_.blocks[i](h);
    if (trace) (*trace)["decoder.up_blocks." + std::to_string(i)] = h;
  }
  if (trace) {  // the traced value is the norm's own output
    h = decoder_.conv_norm_out(h);
    record("decoder.conv_norm_out", h);
    h = silu(h);
  } else {
    h = decoder_.conv_norm_out.then_silu(h);
  }
  h = contiguous(decoder_.conv_out(h));
  record("decoder.conv_out", h);
  return h;
}

namespace {

// Diffusers' blend_v / blend_h: the first `extent` rows (axis 2) or columns (axis 3) of b become
// a * (1 - y / extent) + b * (y / extent) with a's last `extent` ones, y counting from 0.
Tensor blend(const Tensor& a, const Tensor& b, int64_t axis, int64_t extent) {
  extent = std::min({a.dim(axis), b.dim(axis), extent});
  if (extent <= 0) return b;
  std::vector<float> ramp(static_cast<size_t>(extent)), rest(static_cast<size_t>(extent));  // torch rounds each factor to f32
  for (int64_t y = 0; y < extent; ++y) {
    ramp[size_t(y)] = float(double(y) / double(extent));
    rest[size_t(y)] = float(1.0 - double(y) / double(extent));
  }
  Shape s{1, 1, 1, 1};
  s[size_t(axis)] = extent;
  const Tensor up = cast(from_vector(ramp, s), b.dtype()), down = cast(from_vector(rest, s), b.dtype());
  const Tensor mixed = slice(a, axis, a.dim(axis) - extent, a.dim(axis)) * down + slice(b, axis, 0, extent) * up;
  return extent == b.dim(axis) ? mixed : concat({mixed, slice(b, axis, extent, b.dim(axis))}, axis);
}

}  // namespace

int64_t AutoencoderKL::tile_latent_size(const VaeTiling& tiling) const {
  const int64_t sample = tiling.tile_sample_min_size ? tiling.tile_sample_min_size : config_.sample_size;
  return sample / config_.vae_scale_factor();
}

int64_t VaeTileGrid::count() const {
  if (whole) return 1;
  int64_t r = 0, c = 0;
  for (const auto& [extent, n] : rows) r += n;
  for (const auto& [extent, n] : cols) c += n;
  return r * c;
}

namespace {

// One axis of the grid: the tiles Diffusers' `range(0, extent, stride)` starts, as runs of equal
// extent: the whole tiles, then each tile the edge cuts (at most tile / stride + 1 of them).
std::vector<std::pair<int64_t, int64_t>> tile_runs(int64_t extent, int64_t tile, int64_t stride) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  const int64_t all = (extent + stride - 1) / stride;
  const int64_t whole = extent >= tile ? (extent - tile) / stride + 1 : 0;
  if (whole > 0) runs.emplace_back(tile, whole);
  for (int64_t i = whole; i < all; ++i) runs.emplace_back(extent - i * stride, 1);
  return runs;
}

}  // namespace

VaeTileGrid AutoencoderKL::tile_grid(int64_t h, int64_t w, const VaeTiling& tiling) const {
  KILN_CHECK(tiling.overlap_factor >= 0 && tiling.overlap_factor < 1, kWhere, "tile overlap factor must be in [0, 1), got ",
             tiling.overlap_factor);
  VaeTileGrid g;
  g.tile = tile_latent_size(tiling);
  // The stride between tiles, in latent pixels, and the blended seam and kept part, in image pixels.
  g.stride = int64_t(double(g.tile) * (1 - tiling.overlap_factor));
  g.sample_tile = g.tile * config_.vae_scale_factor();
  g.blend_extent = int64_t(double(g.sample_tile) * tiling.overlap_factor);
  g.row_limit = g.sample_tile - g.blend_extent;
  KILN_CHECK(g.tile >= 1 && g.stride >= 1, kWhere, "a tile of ", g.sample_tile, " image pixels (", g.tile,
             " latent pixels) with overlap ", tiling.overlap_factor, " is too small to tile with");
  g.whole = h <= g.tile && w <= g.tile;
  if (!g.whole) {
    g.rows = tile_runs(h, g.tile, g.stride);
    g.cols = tile_runs(w, g.tile, g.stride);
  }
  return g;
}

bool AutoencoderKL::tiling_keeps_size(const VaeTiling& tiling) const {
  if (!(tiling.overlap_factor >= 0 && tiling.overlap_factor < 1)) return false;
  const int64_t tile = tile_latent_size(tiling), sample_tile = tile * config_.vae_scale_factor();
  const int64_t stride = int64_t(double(tile) * (1 - tiling.overlap_factor));
  const int64_t row_limit = sample_tile - int64_t(double(sample_tile) * tiling.overlap_factor);
  return tile >= 1 && stride >= 1 && row_limit == stride * config_.vae_scale_factor();
}

size_t AutoencoderKL::tiled_decode_peak_bound(const VaeTileGrid& g,
                                              const std::function<size_t(int64_t, int64_t)>& tile_peak,
                                              const std::function<size_t(size_t)>& allocation_size,
                                              size_t in_flight, size_t in_flight_bytes) const {
  const int64_t vsf = config_.vae_scale_factor();
  const size_t element = dtype_size(dtype()) * size_t(config_.out_channels);
  // A buffer of hp x wp image pixels (a decoded tile, a strip, an image row).
  const auto bytes = [&](int64_t hp, int64_t wp) { return allocation_size(size_t(hp) * size_t(wp) * element); };
  const auto tile_bytes = [&](int64_t th, int64_t tw) { return bytes(th * vsf, tw * vsf); };
  const auto kept = [&](int64_t extent) { return std::min(g.row_limit, extent * vsf); };
  int64_t width = 0, height = 0;
  for (const auto& [tw, n] : g.cols) width += n * kept(tw);
  for (const auto& [th, n] : g.rows) height += n * kept(th);
  // Per row of tiles th high: its decoded (or blended) tiles, the copies of their kept parts
  // (the concatenation's contiguous inputs) and the image row they make.
  const auto row_tiles = [&](int64_t th) {
    size_t b = 0;
    for (const auto& [tw, n] : g.cols) b += size_t(n) * tile_bytes(th, tw);
    return b;
  };
  const auto row_kept = [&](int64_t th) {
    size_t b = 0;
    for (const auto& [tw, n] : g.cols) b += size_t(n) * bytes(kept(th), kept(tw));
    return b;
  };
  const auto image_row = [&](int64_t th) { return bytes(kept(th), width); };
  // What the blends hold besides those: the tile being blended (blended with the tile above, then
  // with the one to its left), the rest of each copied beside its seam, the seams' products and
  // sums, and the ramps; and whatever the ops still in flight have not freed yet — the outputs of
  // the last `in_flight` ops, at most a largest tile each, or in_flight_bytes and one more.
  const int64_t th0 = g.rows.front().first, tw0 = g.cols.front().first;
  const size_t largest = tile_bytes(th0, tw0);
  const size_t blending = 4 * largest + 3 * bytes(g.blend_extent, tw0 * vsf) + 3 * bytes(th0 * vsf, g.blend_extent) +
                          4 * allocation_size(size_t(g.blend_extent) * sizeof(float)) +
                          std::min(in_flight * largest, in_flight_bytes + largest);

  // Decoding: every tile decoded so far is kept for the blending; the last tile of each shape
  // (the most kept before it) bounds the tiles of that shape.
  size_t peak = 0, all_tiles = 0;
  for (const auto& [th, rows] : g.rows) {
    const size_t row = row_tiles(th), before_last_row = all_tiles + size_t(rows - 1) * row;
    size_t before = 0;
    for (const auto& [tw, cols] : g.cols) {
      const size_t t = tile_bytes(th, tw);
      peak = std::max(peak, before_last_row + before + size_t(cols - 1) * t + tile_peak(th, tw));
      before += size_t(cols) * t;
    }
    all_tiles += size_t(rows) * row;
  }

  // Blending row i: the tiles of rows i on (blended or not), the blended rows i − 1 and i, row i's
  // kept copies, the image rows 0..i and the blends' own. Linear in i within a run of equal rows,
  // so its first two rows and its last bound the run.
  size_t tiles_before = 0, image_rows = 0;  // of the rows before the run
  int64_t previous = 0;                     // the extent of the row before (0: none)
  for (const auto& [th, rows] : g.rows) {
    const size_t row = row_tiles(th);
    for (const int64_t i : {int64_t(0), int64_t(1), rows - 1}) {
      if (i >= rows) continue;
      const size_t above = i > 0 ? row : previous ? row_tiles(previous) : 0;
      peak = std::max(peak, (all_tiles - tiles_before - size_t(i) * row) + above + row + row_kept(th) + image_rows +
                                size_t(i + 1) * image_row(th) + blending);
    }
    tiles_before += size_t(rows) * row;
    image_rows += size_t(rows) * image_row(th);
    previous = th;
  }
  // The image: every image row and their concatenation, and what the last row's blends may not
  // have freed yet.
  return std::max(peak, image_rows + bytes(height, width) + row_tiles(previous) + row_kept(previous) + blending);
}

Tensor AutoencoderKL::tiled_decode(const Tensor& z, const VaeTiling& tiling) const {
  KILN_CHECK(z.rank() == 4 && z.dim(1) == config_.latent_channels, kWhere, "decode expects latents [B, ",
             config_.latent_channels, ", h, w], got ", to_string(z.shape()));
  const int64_t h = z.dim(2), w = z.dim(3);
  const VaeTileGrid grid = tile_grid(h, w, tiling);
  if (grid.whole) return decode(z);
  const int64_t tile = grid.tile, stride = grid.stride, blend_extent = grid.blend_extent, row_limit = grid.row_limit;
  KILN_CHECK(tiling_keeps_size(tiling), kWhere, "tiles of ", grid.sample_tile, " image pixels (", tile,
             " latent pixels) with overlap ", tiling.overlap_factor, " would not decode to ",
             h * config_.vae_scale_factor(), "x", w * config_.vae_scale_factor(),
             " (Diffusers' tiled decode has no final crop); expected a tile whose kept part is its stride (with a "
             "quarter overlap: a multiple of 4 latent pixels)");
  std::vector<std::vector<Tensor>> rows;
  for (int64_t i = 0; i < h; i += stride) {
    rows.emplace_back();
    for (int64_t j = 0; j < w; j += stride)
      rows.back().push_back(decode(slice(slice(z, 2, i, std::min(i + tile, h)), 3, j, std::min(j + tile, w))));
  }
  // Each tile is blended with the already blended tiles above and to its left, as Diffusers
  // blends them in place.
  std::vector<Tensor> image_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<Tensor> kept;
    for (size_t j = 0; j < rows[i].size(); ++j) {
      Tensor& t = rows[i][j];
      if (i > 0) t = blend(rows[i - 1][j], t, 2, blend_extent);
      if (j > 0) t = blend(rows[i][j - 1], t, 3, blend_extent);
      kept.push_back(slice(slice(t, 2, 0, std::min(row_limit, t.dim(2))), 3, 0, std::min(row_limit, t.dim(3))));
    }
    image_rows.push_back(concat(kept, 3));
  }
  return contiguous(concat(image_rows, 2));
}

Tensor AutoencoderKL::encode_moments(const Tensor& image) const {
  KILN_CHECK(encoder_.has_value(), kWhere, "the checkpoint has no encoder weights (encoder.conv_in.weight)");
  KILN_CHECK(image.rank() == 4 && image.dim(1) == config_.in_channels, kWhere, "encode expects an image [B, ",
             config_.in_channels, ", H, W], got ", to_string(image.shape()));
  const Encoder& enc = *encoder_;
  Tensor h = enc.conv_in(as_dtype(image, enc.conv_in.weight.dtype()));
  for (const auto& b : enc.blocks) h = b(h);
  h = (*enc.mid_block)(h);
  h = enc.conv_out(silu(enc.conv_norm_out(h)));
  return quant_conv_ ? (*quant_conv_)(h) : h;
}

Tensor AutoencoderKL::encode_mean(const Tensor& image) const {
  return slice(encode_moments(image), 1, 0, config_.latent_channels);
}

}  // namespace kiln
