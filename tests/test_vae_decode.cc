// The VAE decode at speed and in bounded memory: channels-last activations that no layer
// reorders (the ops keep the layout), GroupNorm+SiLU in one pass, and Diffusers' tiled decode
// (enable_tiling) against Diffusers' own output, chosen automatically by the call's memory plan.
#include <gtest/gtest.h>

#include <omp.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "devices/cpu/kernels/conv2d.h"
#include "devices/runtime.h"
#include "exec/counters.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "call_args.h"
#include "golden.h"
#include "io/safetensors.h"
#include "models/vae/autoencoder_kl.h"
#include "pipelines/flux_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

const AutoencoderKL& tiny_arch_vae() {
  static const AutoencoderKL vae = AutoencoderKL::from_pretrained(test::pipeline_dir("flux1_tiny_arch") / "vae");
  return vae;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = to_vector(a), y = to_vector(b);
  EXPECT_EQ(x.size(), y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) worst = std::max(worst, std::fabs(double(x[i]) - y[i]));
  return worst;
}

// conv2d with a residual: one kernel when the residual has the result's shape, dtype and layout
// (NCHW or channels-last), `+` otherwise (a broadcast residual); in f32 always the bits of the
// convolution followed by the add.
TEST(Conv2dResidual, IsTheConvolutionPlusTheResidual) {
  const Tensor x = test::random_tensor({1, 8, 9, 11}, 1), w = test::random_tensor({8, 8, 3, 3}, 2, DType::f32, -0.2, 0.2);
  const Tensor b = test::random_tensor({8}, 3), r = test::random_tensor({1, 8, 9, 11}, 4);
  const Tensor per_channel = test::random_tensor({8, 1, 1}, 5);
  for (const bool cl : {false, true}) {
    const Tensor xi = cl ? to_channels_last(x) : x, ri = cl ? to_channels_last(r) : r;
    const std::vector<float> expected = to_vector(conv2d(xi, w, b, {1, 1}, {1, 1}) + ri);
    synchronize();
    reset_counters();
    const Tensor fused = conv2d(xi, w, b, {1, 1}, {1, 1}, ri);
    wait(fused);
    EXPECT_EQ(counters().kernels_launched, 1u) << "channels-last " << cl;
    EXPECT_EQ(to_vector(fused), expected) << "channels-last " << cl;
    EXPECT_EQ(fused.shape(), (Shape{1, 8, 9, 11}));
    EXPECT_EQ(to_vector(conv2d(xi, w, b, {1, 1}, {1, 1}, per_channel)),
              to_vector(conv2d(xi, w, b, {1, 1}, {1, 1}) + per_channel)) << "channels-last " << cl;
  }
}

TEST(ChannelsLast, OpsKeepTheLayoutAndTheValues) {
  const Tensor x = test::random_tensor({2, 32, 9, 11}, 1), w = test::random_tensor({16, 32, 3, 3}, 2, DType::f32, -0.1, 0.1);
  const Tensor b = test::random_tensor({16}, 3), gw = test::random_tensor({16}, 4), gb = test::random_tensor({16}, 5);
  const Tensor xc = to_channels_last(x);
  ASSERT_TRUE(is_channels_last(xc));
  EXPECT_FALSE(is_channels_last(x));
  EXPECT_EQ(to_vector(xc), to_vector(x));  // the same values, another memory order

  const Tensor y = conv2d(x, w, b, {1, 1}, {1, 1}), yc = conv2d(xc, w, b, {1, 1}, {1, 1});
  EXPECT_TRUE(is_channels_last(yc));
  EXPECT_LE(max_abs_diff(yc, y), 1e-5);
  const Tensor n = silu(group_norm(y, 4, gw, gb, 1e-6)), nc = group_norm(yc, 4, gw, gb, 1e-6, /*then_silu=*/true);
  EXPECT_TRUE(is_channels_last(nc));
  EXPECT_LE(max_abs_diff(nc, n), 1e-5);
  // The fused SiLU is the silu kernel's formula: the same bits as the two ops.
  EXPECT_EQ(to_vector(group_norm(y, 4, gw, gb, 1e-6, true)), to_vector(n));
  const Tensor s = yc + nc, u = upsample_nearest2x(nc), sc = silu(yc) * 0.5;
  EXPECT_TRUE(is_channels_last(s) && is_channels_last(u) && is_channels_last(sc));
  EXPECT_EQ(to_vector(s), to_vector(contiguous(yc) + contiguous(nc)));
  EXPECT_EQ(to_vector(u), to_vector(upsample_nearest2x(contiguous(nc))));
  EXPECT_EQ(to_vector(sc), to_vector(silu(contiguous(yc)) * 0.5));
  // [B, C, H, W] -> [B, HW, C] is a free view of channels-last memory (the VAE's attention).
  const Tensor seq = transpose(reshape(yc, {2, 16, 99}), 1, 2);
  EXPECT_TRUE(seq.is_contiguous());
  EXPECT_FALSE(is_channels_last(contiguous(yc)));
}

// GroupNorm on channels-last memory sums in the NCHW kernel's order: the same bits, for any thread
// count, on each path (HW a multiple of 4096; a multiple of the slot count, chunks spanning
// channels; any other HW, group by group), f32 and bf16.
TEST(ChannelsLast, GroupNormHasTheNchwBits) {
  struct Case {
    Shape shape;
    int64_t groups;
  };
  const Case cases[] = {{{2, 32, 64, 64}, 4},    // fast path, 8 channels per group
                        {{1, 96, 64, 128}, 32},  // fast path, 2 chunks per channel, channels past a 64-block
                        {{1, 24, 9, 11}, 8},     // by groups, channels not a whole vector
                        {{2, 16, 40, 40}, 16},   // by groups, chunks spanning channels, one channel per group
                        {{1, 8, 128, 128}, 4},   // fast path, fewer channels than a vector
                        {{1, 32, 64, 80}, 4},    // chunks spanning channels, 8 channels per group
                        {{2, 48, 96, 96}, 8},    // the same, 6 channels per group, heads of every length
                        {{1, 8, 64, 72}, 4},     // the same, fewer channels than a vector
                        {{1, 16, 64, 80}, 16}};  // one channel per group: each group's last chunk is short
  const int threads = omp_get_max_threads();
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const Case& c : cases) {
      const int64_t C = c.shape[1];
      const Tensor x = test::random_tensor(c.shape, 11, dtype, -3, 5);
      const Tensor w = test::random_tensor({C}, 12), b = test::random_tensor({C}, 13);
      const Tensor xc = to_channels_last(x);
      for (const bool then_silu : {false, true}) {
        const std::vector<float> nchw = to_vector(group_norm(x, c.groups, w, b, 1e-6, then_silu));
        for (const int t : {1, 2}) {
          omp_set_num_threads(t);
          const Tensor y = group_norm(xc, c.groups, w, b, 1e-6, then_silu);
          ASSERT_TRUE(is_channels_last(y));
          EXPECT_EQ(to_vector(y), nchw) << dtype_name(dtype) << " " << to_string(c.shape) << " groups " << c.groups
                                        << " silu " << then_silu << " threads " << t;
        }
        omp_set_num_threads(threads);
      }
    }
  }
}

// The f32 decoder with channels-last activations (the default) decodes to the bits of the
// contiguous (NCHW) decoder: convolutions, GroupNorm, upsampling, attention and the residual adds
// all give the same values in either layout. 64x64 latents take GroupNorm's fast path at every
// level; 9x11 the group-by-group one; 48x48 all three (2304, 9216 and 36864 pixels, then 147456).
TEST(VaeDecode, ChannelsLastDecodeHasTheContiguousDecodesBits) {
  AutoencoderKL vae = AutoencoderKL::from_pretrained(test::pipeline_dir("flux1_tiny_arch") / "vae", DType::f32);
  ASSERT_EQ(vae.memory_format(), AutoencoderKL::MemoryFormat::kChannelsLast);
  for (const Shape& zs : {Shape{1, 16, 64, 64}, Shape{1, 16, 9, 11}, Shape{1, 16, 48, 48}}) {
    const Tensor z = test::random_tensor(zs, 21);
    VaeTrace channels_last, contiguous;
    const std::vector<float> image = to_vector(vae.decode(z));
    wait(vae.decode(z, &channels_last));
    vae.to_memory_format(AutoencoderKL::MemoryFormat::kContiguous);
    EXPECT_EQ(to_vector(vae.decode(z)), image) << to_string(zs);
    wait(vae.decode(z, &contiguous));
    vae.to_memory_format(AutoencoderKL::MemoryFormat::kChannelsLast);
    for (const auto& [name, t] : channels_last)  // names the first layer that differs, if one does
      EXPECT_EQ(to_vector(t), to_vector(contiguous.at(name))) << name << " " << to_string(zs);
  }
}

// In bf16 the layouts differ where a bf16 convolution writes channels-last y itself: it adds a
// ResNet block's skip path to its f32 accumulator and rounds once (conv2d.h), where the contiguous
// decoder rounds the convolution and then the sum. Both stay as close to the f32 decode of the
// same latents as bf16 activations allow (~2% rms on this tiny random model), the channels-last
// one no farther than the contiguous one; a wrong residual would be off by its whole size.
TEST(VaeDecode, Bf16ChannelsLastDecodeIsAsCloseToF32AsTheContiguousOne) {
  AutoencoderKL vae = AutoencoderKL::from_pretrained(test::pipeline_dir("flux1_tiny_arch") / "vae", DType::bf16);
  const AutoencoderKL& f32 = tiny_arch_vae();
  const auto relative_rms = [](const std::vector<float>& got, const std::vector<float>& ref) {
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      d2 += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
      r2 += double(ref[i]) * ref[i];
    }
    return std::sqrt(d2 / r2);
  };
  for (const Shape& zs : {Shape{1, 16, 64, 64}, Shape{1, 16, 9, 11}}) {
    const Tensor z = test::random_tensor(zs, 21, DType::bf16);
    const std::vector<float> ref = to_vector(f32.decode(cast(z, DType::f32)));
    const double channels_last = relative_rms(to_vector(vae.decode(z)), ref);
    vae.to_memory_format(AutoencoderKL::MemoryFormat::kContiguous);
    const double contiguous = relative_rms(to_vector(vae.decode(z)), ref);
    vae.to_memory_format(AutoencoderKL::MemoryFormat::kChannelsLast);
    EXPECT_LT(channels_last, 0.04) << to_string(zs);
    EXPECT_LT(contiguous, 0.04) << to_string(zs);
    EXPECT_LE(channels_last, contiguous * 1.02) << to_string(zs);
  }
}

TEST(VaeDecode, NoLayerReordersActivations) {
  const AutoencoderKL& vae = tiny_arch_vae();
  const Tensor z = test::random_tensor({1, 16, 8, 8}, 7);
  wait(vae.decode(z));  // the first call builds the primitives
  const cpu::Conv2dStats before = cpu::conv2d_stats();
  reset_counters();
  const Tensor image = vae.decode(z);
  wait(image);
  const cpu::Conv2dStats after = cpu::conv2d_stats();
  // conv_in, 2 mid-block resnets x 2, 4 up blocks x 3 resnets x 2, 2 shortcuts, 3 upsamplers, conv_out.
  EXPECT_EQ(after.calls - before.calls, 35u);
  EXPECT_EQ(after.activation_reorders - before.activation_reorders, 0u);  // no conv reorders x or y
  const auto kernels = kernels_by_name();
  // The latents into channels-last memory and the image out of it: the only copies.
  EXPECT_EQ(kernels.count("copy") ? kernels.at("copy") : 0, 2u);
  EXPECT_EQ(kernels.count("silu"), 0u);  // every SiLU rides in its GroupNorm
  // Every ResNet block adds its skip path inside its last convolution; the mid-block attention's
  // residual is the one add left.
  EXPECT_EQ(kernels.count("add") ? kernels.at("add") : 0, 1u);
  EXPECT_TRUE(image.is_contiguous());
}

// In bf16, where the convolutions run as bf16 primitives, those 14 skip paths are added by the
// primitives themselves (a oneDNN post-op), never in a pass of their own.
TEST(VaeDecode, Bf16ResnetSkipPathsAreAddedByTheirConvolutions) {
  const AutoencoderKL vae = AutoencoderKL::from_pretrained(test::pipeline_dir("flux1_tiny_arch") / "vae", DType::bf16);
  const Tensor z = test::random_tensor({1, 16, 8, 8}, 7, DType::bf16);
  wait(vae.decode(z));
  const cpu::Conv2dStats before = cpu::conv2d_stats();
  reset_counters();
  wait(vae.decode(z));
  const cpu::Conv2dStats after = cpu::conv2d_stats();
  const bool bf16_primitives = cpu::detail::conv2d_bf16_math() == cpu::detail::ConvMath::kBf16;
  EXPECT_EQ(after.residual_post_ops - before.residual_post_ops, bf16_primitives ? 14u : 0u);
  const auto kernels = kernels_by_name();
  EXPECT_EQ(kernels.count("add") ? kernels.at("add") : 0, 1u);
}

TEST(VaeTiledDecode, MatchesDiffusersTiledDecode) {
  const io::SafetensorsFile ref(test::fixture("flux1_tiny_arch") / "vae_tiled_decode.safetensors");
  const AutoencoderKL& vae = tiny_arch_vae();
  const Tensor z = ref.load("z");
  const Tensor tiled = vae.tiled_decode(z, VaeTiling{64});
  EXPECT_EQ(vae.tile_latent_size(VaeTiling{64}), 8);
  test::expect_close(tiled, ref.load("tiled"), 1e-4, 0, "tiled decode");
  test::expect_close(vae.decode(z), ref.load("untiled"), 1e-4, 0, "untiled decode");
  // The tiles change the image (seams are blended, not removed): Diffusers' own difference.
  EXPECT_GT(max_abs_diff(ref.load("tiled"), ref.load("untiled")), 0.1);
}

TEST(VaeTiledDecode, OneTileIsTheUntiledDecodeAndMemoryIsBoundedByTheTile) {
  const AutoencoderKL& vae = tiny_arch_vae();
  const Tensor z = test::random_tensor({1, 16, 32, 32}, 9);
  wait(z);
  DeviceRuntime& rt = runtime(Device::cpu());
  rt.release_cached_memory();
  rt.reset_peak_memory();
  const size_t base = rt.memory().in_use_bytes;
  const Tensor whole = vae.decode(z);
  wait(whole);
  const size_t untiled_peak = rt.memory().peak_bytes - base;
  // Latents no larger than a tile decode whole, bit for bit.
  EXPECT_EQ(to_vector(vae.tiled_decode(z, VaeTiling{256})), to_vector(whole));
  rt.reset_peak_memory();
  const Tensor tiled = vae.tiled_decode(z, VaeTiling{64});
  wait(tiled);
  const size_t tiled_peak = rt.memory().peak_bytes - base;
  EXPECT_EQ(tiled.shape(), whole.shape());
  EXPECT_LT(tiled_peak * 3, untiled_peak) << "tiled " << tiled_peak << " untiled " << untiled_peak;
  std::printf("[ info ] tiny VAE 256x256: decode peak %zu bytes untiled, %zu tiled (64-pixel tiles)\n", untiled_peak,
              tiled_peak);
}

TEST(VaeTiledDecode, AutoTilesOnlyWhenTheUntiledDecodeDoesNotFit) {
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny_arch"));
  PipelineCallArgs args = test::fixture_call_args("flux1_tiny_arch");
  args.seed = 0;
  args.height = args.width = 256;
  args.vae_tiling = VaeTilingMode::kOff;
  const PipelineOutput untiled = pipe(args);
  args.vae_tiling = VaeTilingMode::kAuto;
  const PipelineOutput fits = pipe(args);  // the machine's memory holds it: untiled, the same image
  EXPECT_EQ(fits.vae_tile_size, 0);
  EXPECT_EQ(fits.image, untiled.image);

  // A device capacity the untiled decode does not fit but a tiled one does.
  pipe.to(Device::cpu());
  const MemoryEstimate whole = pipe.estimate_memory(args, 0), small = pipe.estimate_memory(args, 128);
  ASSERT_LT(small.required, whole.required);
  DeviceRuntime& rt = runtime(Device::cpu());
  rt.set_memory_capacity((whole.required + small.required) / 2);
  PipelineOutput tiled;
  try {
    tiled = pipe(args);
  } catch (...) {
    rt.set_memory_capacity(0);
    throw;
  }
  rt.set_memory_capacity(0);
  EXPECT_GT(tiled.vae_tile_size, 0);
  EXPECT_LT(tiled.vae_tile_size, 256);
  EXPECT_EQ(tiled.latents.shape(), untiled.latents.shape());
  EXPECT_EQ(to_vector(tiled.latents), to_vector(untiled.latents));  // only the decode changed
  EXPECT_EQ(tiled.image.size(), untiled.image.size());
  EXPECT_NE(tiled.image, untiled.image);
}

// ---- bounded tiles (issue 37) ----

namespace bounded_tiles {

// Diffusers' loop, run: the (height, width) of every tile, row by row.
std::vector<std::vector<std::pair<int64_t, int64_t>>> diffusers_tiles(int64_t h, int64_t w, int64_t tile,
                                                                      int64_t stride) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> rows;
  for (int64_t i = 0; i < h; i += stride) {
    rows.emplace_back();
    for (int64_t j = 0; j < w; j += stride) rows.back().emplace_back(std::min(tile, h - i), std::min(tile, w - j));
  }
  return rows;
}

}  // namespace bounded_tiles

TEST(VaeTiledDecode, TheGridCountsDiffusersLoop) {
  const AutoencoderKL& vae = tiny_arch_vae();  // 8x: 64-pixel tiles are 8 latent pixels, 6 apart
  for (const auto& [h, w] : std::vector<std::pair<int64_t, int64_t>>{{9, 9}, {20, 28}, {8, 50}, {61, 13}, {14, 14}}) {
    const VaeTileGrid g = vae.tile_grid(h, w, VaeTiling{64});
    EXPECT_EQ(g.tile, 8);
    EXPECT_EQ(g.stride, 6);
    const auto want = bounded_tiles::diffusers_tiles(h, w, 8, 6);
    std::vector<std::vector<std::pair<int64_t, int64_t>>> got;
    for (const auto& [th, nr] : g.rows)
      for (int64_t r = 0; r < nr; ++r) {
        got.emplace_back();
        for (const auto& [tw, nc] : g.cols)
          for (int64_t c = 0; c < nc; ++c) got.back().emplace_back(th, tw);
      }
    EXPECT_EQ(got, want) << h << "x" << w;
    EXPECT_EQ(g.count(), int64_t(want.size() * want[0].size()));
  }
  EXPECT_TRUE(vae.tile_grid(8, 8, VaeTiling{64}).whole);
  // 30000x30000 in 64-pixel tiles: 390,625 tiles, counted in a handful of runs.
  const VaeTileGrid big = vae.tile_grid(3750, 3750, VaeTiling{64});
  EXPECT_EQ(big.count(), 625 * 625);
  EXPECT_LE(big.rows.size(), 3u);
}

TEST(VaeTiledDecode, TilesThatWouldChangeTheImageSizeAreRefused) {
  const AutoencoderKL& vae = tiny_arch_vae();
  // A multiple of 4 latent pixels (32 image pixels here) keeps the size; anything else would not.
  for (const int64_t tile : {32, 64, 96, 128, 1024}) EXPECT_TRUE(vae.tiling_keeps_size(VaeTiling{tile})) << tile;
  for (const int64_t tile : {8, 16, 24, 40, 48, 56}) EXPECT_FALSE(vae.tiling_keeps_size(VaeTiling{tile})) << tile;
  const Tensor z = test::random_tensor({1, 16, 8, 8}, 3);
  // Diffusers would make a 92x92 image of these 64x64 latents' tiles of 16 pixels.
  test::expect_error([&] { vae.tiled_decode(z, VaeTiling{16}); },
                     {"[vae] tiles of 16 image pixels", "would not decode to 64x64", "no final crop"});
  EXPECT_EQ(vae.tiled_decode(z, VaeTiling{32}).shape(), (Shape{1, 3, 64, 64}));

  // The pipeline refuses them before any work, naming the flag and the range.
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny_arch"));
  PipelineCallArgs args = test::fixture_call_args("flux1_tiny_arch");
  args.height = args.width = 64;
  args.vae_tiling = VaeTilingMode::kOn;
  for (const int64_t tile : {int64_t(16), int64_t(40), int64_t(36), int64_t(1) << 21}) {
    args.vae_tile_size = tile;
    test::expect_error([&] { pipe(args); }, {"[pipeline] vae_tile_size (--vae-tile-size) is " + std::to_string(tile),
                                             "expected a multiple of 32 from 32 to 1048576"});
  }
}

TEST(VaeTiledDecode, PastSixtyFourTilesThePlanBoundsTheTracedOne) {
  // The bound (traces of one tile per shape) against the trace of every tile, where both are
  // quick: never below it, and within 20% of it where the plan uses it (measured: 10-11% at
  // 250-289 tiles, mostly the outputs of the ops still in flight).
  for (const char* fixture : {"flux1_tiny_arch", "flux1_tiny"}) {
    FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(fixture));
    const int64_t tile = pipe.vae_scale_factor() == 8 ? 64 : 32;
    const int64_t s = pipe.vae_scale_factor() == 8 ? 1 : 4;  // latents of the same tile counts
    for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{20, 28}, {61, 13}, {40, 40}, {8, 90}, {9, 9}, {100, 100}, {150, 60}}) {
      h *= s;
      w *= s;
      const size_t traced = pipe.decode_activation_bytes(h, w, tile, std::numeric_limits<int64_t>::max());
      const size_t bound = pipe.decode_activation_bytes(h, w, tile, 0);
      EXPECT_GE(bound, traced) << fixture << " " << h << "x" << w;
      // The plan uses the bound past 64 tiles only; below, the ops in flight weigh more than it.
      const int64_t t = tile / pipe.vae_scale_factor();
      const auto grid = bounded_tiles::diffusers_tiles(h, w, t, t * 3 / 4);
      const int64_t tiles = int64_t(grid.size() * grid[0].size());
      if (tiles > DiffusionPipeline::kTracedTiles) {
        EXPECT_LE(double(bound), 1.2 * double(traced)) << fixture << " " << h << "x" << w;
      }
      std::printf("[ info ] %s latents %lldx%lld in %lld-pixel tiles: traced %zu, bound %zu (%.3fx)\n", fixture,
                  static_cast<long long>(h), static_cast<long long>(w), static_cast<long long>(tile), traced, bound,
                  double(bound) / double(traced));
    }
  }
}

TEST(VaeTiledDecode, ThePlanAnswersAtOnceAtAnySize) {
  // 30000x30000 in the bundled VAE's 64-pixel tiles: 390,625 tiles, whose trace took minutes and
  // 4.6 GB; the plan now traces one tile per shape.
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny_arch"));
  PipelineCallArgs args = test::fixture_call_args("flux1_tiny_arch");
  for (const int64_t side : {30000, 1 << 20}) {
    args.height = args.width = side;
    const auto t0 = std::chrono::steady_clock::now();
    const MemoryEstimate e = pipe.estimate_memory(args, 64);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(seconds, 5.0) << side;
    // At least the image (f32) and every decoded tile kept for the blending.
    const double image = 3.0 * double(side) * double(side) * 4;
    EXPECT_GT(double(e.components.back().activation_bytes), 2 * image) << side;
    std::printf("[ info ] %lldx%lld tiled plan: vae %.2f GiB, %.3f s\n", static_cast<long long>(side),
                static_cast<long long>(side), double(e.components.back().activation_bytes) / double(1 << 30),
                seconds);
  }
}

TEST(PipelineBounds, StepsBeyondTheLimitFailBeforeAnyWork) {
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny"));
  PipelineCallArgs args = test::fixture_call_args("flux1_tiny");
  for (const int64_t steps : {int64_t(10001), int64_t(1) << 31, std::numeric_limits<int64_t>::max()}) {
    args.num_inference_steps = steps;
    test::expect_error([&] { pipe(args); },
                       {"[pipeline] num_inference_steps must be at most 10000", "got " + std::to_string(steps)});
  }
}

}  // namespace
}  // namespace kiln
