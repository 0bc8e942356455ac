// Diffusers' AutoencoderKL as FLUX.1 uses it: the decoder turns latents into an
// image in [-1, 1]; the encoder (for img2img) gives the mean of the latent distribution.
// The same class loads FLUX.2's AutoencoderKLFlux2: the same encoder/decoder, plus
// the batch-norm running statistics `bn.*` the FLUX.2 pipeline normalizes its patchified latents
// with (latent_batch_norm(); the transforms are in flux2_latents.h), and no scaling/shift factor.
// Weights use the Diffusers state-dict names (decoder.conv_in, decoder.mid_block.attentions.0.to_q,
// decoder.up_blocks.N.resnets.M.conv_shortcut, ...). Everything is computed in f32.
#pragma once
#include <array>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "models/vae/flux2_latents.h"
#include "models/vae/vae_blocks.h"

namespace kiln {

// vae/config.json; absent or null fields take the Diffusers class
// defaults (those of the class `_class_name` names: AutoencoderKL when absent, or
// AutoencoderKLFlux2, whose defaults are FLUX.2's VAE).
struct VaeConfig {
  std::string class_name = "AutoencoderKL";  // "AutoencoderKL" or "AutoencoderKLFlux2"
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  int64_t latent_channels = 4;
  int64_t layers_per_block = 1;
  int64_t norm_num_groups = 32;
  std::vector<int64_t> block_out_channels{64};
  std::vector<std::string> down_block_types{"DownEncoderBlock2D"};
  std::vector<std::string> up_block_types{"UpDecoderBlock2D"};
  std::string act_fn = "silu";
  int64_t sample_size = 32;  // image pixels per tile side of tiled decoding (FLUX.1: 1024)
  // AutoencoderKLFlux2 has neither (its latents are normalized with the batch-norm statistics):
  // 1 and 0 there, so that latents / scaling_factor + shift_factor leaves latents unchanged.
  double scaling_factor = 0.18215;
  double shift_factor = 0;  // null in the file means "no shift"
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;

  // AutoencoderKLFlux2 only.
  double batch_norm_eps = 1e-4;
  double batch_norm_momentum = 0.1;  // training only; kept for completeness
  std::array<int64_t, 2> patch_size{1, 1};  // AutoencoderKLFlux2's default: (2, 2); AutoencoderKL: none
  // The decoder's channels (FLUX.2-small-decoder); empty (null in the file): block_out_channels.
  std::vector<int64_t> decoder_block_out_channels;

  // Whether the checkpoint carries the latent batch-norm statistics (AutoencoderKLFlux2).
  bool has_latent_batch_norm() const { return class_name == "AutoencoderKLFlux2"; }
  // Length of bn.running_mean / bn.running_var: patch_h · patch_w · latent_channels.
  int64_t batch_norm_channels() const { return patch_size[0] * patch_size[1] * latent_channels; }
  const std::vector<int64_t>& decoder_channels() const {
    return decoder_block_out_channels.empty() ? block_out_channels : decoder_block_out_channels;
  }

  // Reads the fields and rejects what this implementation does not support (other block
  // types, activations), naming the file and the field.
  static VaeConfig from_json(const io::JsonConfig& json);
  // Image pixels per latent pixel along each axis: 2^(len(block_out_channels) - 1).
  int64_t vae_scale_factor() const { return int64_t(1) << (block_out_channels.size() - 1); }
};

// Diffusers' vae.enable_tiling() (AutoencoderKL.tiled_decode): the latents are decoded in square
// tiles of tile_sample_min_size / vae_scale_factor latent pixels that overlap by overlap_factor of a
// tile; each tile is blended linearly into the one above and the one to its left over
// overlap_factor of a tile, then cut to the stride. Only one tile's activations exist at a time.
struct VaeTiling {
  int64_t tile_sample_min_size = 0;  // image pixels per tile side; 0: config sample_size
  double overlap_factor = 0.25;      // Diffusers' tile_overlap_factor
};

// How tiled_decode() covers latents of h x w (Diffusers' loop, counted rather than run): tiles
// `stride` latent pixels apart, `tile` high and wide except where the latents end. Each axis is
// a few runs of equal extents in order: the whole tiles, then the last one or two (with a quarter
// overlap) that the edge cuts, e.g. rows {{8, 40}, {7, 1}, {1, 1}} for 247 latent rows.
struct VaeTileGrid {
  int64_t tile = 0, stride = 0;                              // latent pixels
  int64_t sample_tile = 0, blend_extent = 0, row_limit = 0;  // image pixels
  bool whole = false;  // no larger than one tile: decoded whole, not tiled
  std::vector<std::pair<int64_t, int64_t>> rows, cols;  // (extent in latent pixels, tiles)
  int64_t count() const;                                 // tiles in all (1 when whole)
};

// Named intermediate outputs of a decode, keyed like the Diffusers modules that produce them
// ("decoder.conv_in", "decoder.mid_block", "decoder.up_blocks.0", ..., "decoder.conv_norm_out",
// "decoder.conv_out"); used by the parity tests.
using VaeTrace = std::map<std::string, Tensor>;

class AutoencoderKL {
 public:
  // Loads `dir`/config.json and the checkpoint in `dir` (the pipeline's vae/ folder).
  // Checkpoint keys this model leaves unread on purpose: the encoder half (text-to-image only
  // decodes) and AutoencoderKLFlux2's batch-norm step counter (training state).
  static std::vector<std::string> checkpoint_keys_not_loaded() {
    return {"encoder.", "quant_conv.", "bn.num_batches_tracked"};
  }
  static AutoencoderKL from_pretrained(const std::filesystem::path& dir, std::optional<DType> dtype = DType::f32);  // torch_dtype (std::nullopt: "auto", the checkpoint's)
  AutoencoderKL(VaeConfig config, const nn::Weights& weights);

  // z: [B, latent_channels, h, w], already latents / scaling_factor + shift_factor.
  // Returns the image [B, out_channels, h * vae_scale_factor, w * vae_scale_factor], about [-1, 1].
  Tensor decode(const Tensor& z, VaeTrace* trace = nullptr) const;
  // decode() tile by tile (VaeTiling); latents no larger than one tile are decoded whole, as
  // Diffusers does. Tiles that would change the image's size are refused (tiling_keeps_size).
  Tensor tiled_decode(const Tensor& z, const VaeTiling& tiling = {}) const;
  // The latent pixels per tile side tiled_decode() uses.
  int64_t tile_latent_size(const VaeTiling& tiling) const;
  // The tiles tiled_decode() decodes latents of h x w in (fails as tiled_decode does on a tile
  // too small to step by).
  VaeTileGrid tile_grid(int64_t h, int64_t w, const VaeTiling& tiling = {}) const;
  // Whether tiles of `tiling` decode latents to exactly h·vae_scale_factor x w·vae_scale_factor.
  // Diffusers keeps row_limit = sample_tile − blend_extent image pixels of each tile but steps
  // int(tile · (1 − overlap)) latent pixels, with no final crop: where the two differ the kept
  // parts repeat pixels and the image grows (16-pixel tiles of an 8x VAE make 64x64 into 92x92).
  // With Diffusers' quarter overlap that is every tile of a multiple of 4 latent pixels.
  bool tiling_keeps_size(const VaeTiling& tiling) const;
  // An upper bound of the bytes tiled_decode() holds at once over `grid`, op by op as
  // unfused_peak_bytes counts a traced decode, in time independent of the number of tiles: the
  // tiles decoded so far and the one being decoded; then the blending (every tile not yet blended,
  // two rows of blended tiles, the copies of a row's kept parts, the image rows so far, one tile's
  // temporaries); then the image rows and the image. `tile_peak(th, tw)` is the peak of decoding
  // one tile of th x tw latent pixels after a largest one (both outputs kept, the largest's
  // subtracted); `allocation_size`, `in_flight` and `in_flight_bytes` are the device's, as
  // unfused_peak_bytes takes them (a value is freed only once the ops after its last reader may run).
  size_t tiled_decode_peak_bound(const VaeTileGrid& grid, const std::function<size_t(int64_t, int64_t)>& tile_peak,
                                 const std::function<size_t(size_t)>& allocation_size, size_t in_flight,
                                 size_t in_flight_bytes) const;
  // image: [B, in_channels, H, W] in [-1, 1]. Returns the moments [B, 2 * latent_channels, h, w]
  // (mean, then logvar) of the latent distribution.
  Tensor encode_moments(const Tensor& image) const;
  // The distribution's mode: the first latent_channels channels of the moments.
  Tensor encode_mean(const Tensor& image) const;

  const VaeConfig& config() const { return config_; }
  DType dtype() const;  // torch_dtype it was loaded in

  // The memory format of the decoder's activations, as PyTorch's vae.to(memory_format=...):
  // channels-last (the default: the convolution library's own layout, no reorders between layers)
  // or contiguous NCHW. In f32 both decode to the same bits; contiguous is the reference that
  // proves it (VaeDecode.ChannelsLastDecodeHasTheContiguousDecodesBits) and is slower.
  enum class MemoryFormat { kChannelsLast, kContiguous };
  void to_memory_format(MemoryFormat format) { memory_format_ = format; }
  MemoryFormat memory_format() const { return memory_format_; }

  // AutoencoderKLFlux2: bn.running_mean / bn.running_var [config().batch_norm_channels()] in the
  // VAE's dtype, with eps = batch_norm_eps. Neither decode() nor encode applies
  // them; the pipeline does (flux2_latents::bn_normalize / bn_denormalize). Absent for AutoencoderKL.
  const std::optional<LatentBatchNorm>& latent_batch_norm() const { return latent_bn_; }
  // The patchify size of AutoencoderKLFlux2's latents (config patch_size).
  std::array<int64_t, 2> patch_size() const { return config_.patch_size; }

 private:
  // The decoder and the encoder hold the same layers; `blocks` are the decoder's up_blocks (run
  // after the mid block) or the encoder's down_blocks (run before it).
  template <typename Block>
  struct Coder {
    nn::Conv2d conv_in;
    std::optional<vae::MidBlock2D> mid_block;
    std::vector<Block> blocks;
    nn::GroupNorm conv_norm_out;
    nn::Conv2d conv_out;
  };
  using Decoder = Coder<vae::UpDecoderBlock2D>;
  using Encoder = Coder<vae::DownEncoderBlock2D>;

  VaeConfig config_;
  Decoder decoder_;
  // Absent when the checkpoint has no encoder weights (a decoder-only export); encoding then
  // fails with a clear error, while decoding works.
  std::optional<Encoder> encoder_;
  std::optional<nn::Conv2d> post_quant_conv_, quant_conv_;
  std::optional<LatentBatchNorm> latent_bn_;
  MemoryFormat memory_format_ = MemoryFormat::kChannelsLast;
};

}  // namespace kiln
