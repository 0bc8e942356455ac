// Time of one VAE decode (AutoencoderKL.decode) at real image sizes, with where it goes: the
// profile's seconds, launches and bytes per op, and the decode's convolutions timed alone at the
// same shapes with the same kernel (the roofline the decode is measured against: issue 16 asks
// for a decode within 1.5x of that sum). Meant for the real-size VAE of a `kiln make-random`
// folder (the FLUX.1 VAE: 16 latent channels, 128-256-512-512).
//
// With --tile PIXELS the decode is AutoencoderKL::tiled_decode in tiles of that many image pixels
// (Diffusers' enable_tiling with tile_sample_min_size); the peak device memory is then one tile's.
// With --compare-contiguous the same latents are also decoded once with contiguous (NCHW)
// activations, and the two images compared value by value (issue 16: in f32 the channels-last
// decode must give the same bits).
//
//   build/bench/bench_vae_decode VAE_DIR [SIZE...] [--dtype f32|bf16] [--reps N] [--tile PIXELS]
//                                [--compare-contiguous]
//   e.g. build/bench/bench_vae_decode /tmp/schnell-2+4/vae 512 1024 --tile 512
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "devices/runtime.h"
#include "exec/dispatch.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "exec/profile.h"
#include "models/vae/autoencoder_kl.h"

namespace {

using namespace kiln;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<float> smooth_values(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * float(((i * 2654435761u) % 2001) / 1000.0 - 1.0);
  return v;
}

// A tensor of this shape whose strides are a permutation of a dense layout (e.g. channels-last),
// filled with smooth values.
Tensor tensor_like(const Shape& shape, const Strides& strides, DType dtype, float scale) {
  std::vector<int64_t> order(shape.size());  // dims from the outermost in memory
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return strides[size_t(a)] > strides[size_t(b)]; });
  Shape dense(shape.size());
  std::vector<int64_t> back(shape.size());
  for (size_t i = 0; i < order.size(); ++i) dense[i] = shape[size_t(order[i])], back[size_t(order[i])] = int64_t(i);
  const Tensor t = from_vector(smooth_values(size_t(numel(shape)), scale), dense, dtype);
  return permute(t, back);
}

// Each distinct convolution one decode ran, timed alone (best of `reps`) on fresh tensors of the
// same shapes, strides and dtypes, through the same op; returns the sum over the decode's calls.
double convolutions_alone(const Profile& p, int reps) {
  double total = 0;
  for (const ProfiledLaunch& l : p.launches) {
    if (l.op != "conv2d") continue;
    std::vector<Tensor> in;
    for (size_t i = 0; i + 1 < l.shapes.size(); ++i)  // the last operand is the output
      in.push_back(tensor_like(l.shapes[i], l.strides[i], l.dtypes[i], i == 0 ? 1.0f : 0.05f));
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      wait(dispatch("conv2d", in, l.attrs));
      best = std::min(best, seconds_since(t0));
    }
    std::printf("  %-100s x%-3llu %8.1f ms alone, %8.1f ms in the decode\n", l.signature().c_str(),
                static_cast<unsigned long long>(l.cost.launches), best * 1e3,
                l.cost.seconds / double(std::max<uint64_t>(1, l.cost.launches)) * 1e3);
    total += best * double(l.cost.launches);
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s VAE_DIR [SIZE...] [--dtype f32|bf16] [--reps N] [--tile PIXELS] [--compare-contiguous]\n",
                 argv[0]);
    return 2;
  }
  std::vector<int64_t> sizes;
  DType dtype = DType::f32;
  int reps = 2;
  int64_t tile = 0;
  bool compare_contiguous = false;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = std::strcmp(argv[++i], "bf16") ? DType::f32 : DType::bf16;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--tile") && i + 1 < argc) tile = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--compare-contiguous")) compare_contiguous = true;
    else sizes.push_back(std::atoll(argv[i]));
  }
  if (sizes.empty()) sizes = {512};
  AutoencoderKL vae = AutoencoderKL::from_pretrained(argv[1], dtype);
  const auto decode = [&](const Tensor& z) { return tile ? vae.tiled_decode(z, VaeTiling{tile}) : vae.decode(z); };
  const int64_t c = vae.config().latent_channels, f = vae.config().vae_scale_factor();
  for (const int64_t size : sizes) {
    const Shape zs{1, c, size / f, size / f};
    const Tensor z = from_vector(smooth_values(size_t(numel(zs)), 1), zs, dtype);
    double best = 1e30;
    Tensor image;
    uint64_t evictions = 0;  // pooled blocks the timed decodes gave back to the system
    for (int r = 0; r < reps + 1; ++r) {  // the first run builds the primitives
      const uint64_t evicted_before = runtime(Device::cpu()).memory().pool_evictions;
      reset_profile();
      runtime(Device::cpu()).reset_peak_memory();
      set_profiling(true, ProfileDetail::shapes);
      const auto t0 = Clock::now();
      image = decode(z);
      wait(image);
      const double s = seconds_since(t0);
      set_profiling(false);
      if (r > 0) best = std::min(best, s), evictions += runtime(Device::cpu()).memory().pool_evictions - evicted_before;
    }
    const Profile p = profile();
    const MemoryStats mem = runtime(Device::cpu()).memory();
    std::printf("allocator: %.1f pooled blocks given back to the system per timed decode, reserved peak %.2f GiB\n",
                double(evictions) / reps, double(mem.reserved_peak_bytes) / double(1 << 30));
    std::printf("decode %lldx%lld %s%s: %.3f s (best of %d), peak device memory %.2f GiB\n",
                static_cast<long long>(size), static_cast<long long>(size), dtype_name(dtype),
                tile ? (" in " + std::to_string(tile) + "-pixel tiles").c_str() : "", best, reps,
                double(runtime(Device::cpu()).memory().peak_bytes) / double(1 << 30));
    std::printf("  by op (last run):\n");
    for (const auto& [key, e] : p.by_op)
      std::printf("    %-28s %8.3f s %6llu launches %10.1f MB\n", key.second.c_str(), e.seconds,
                  static_cast<unsigned long long>(e.launches), double(e.bytes) / 1e6);
    std::printf("  convolutions alone:\n");
    const double alone = convolutions_alone(p, reps);
    std::printf("decode %lld: %.3f s, its convolutions alone %.3f s, ratio %.2f\n", static_cast<long long>(size), best,
                alone, best / alone);
    if (compare_contiguous) {
      vae.to_memory_format(AutoencoderKL::MemoryFormat::kContiguous);
      const auto t0 = Clock::now();
      const Tensor reference = decode(z);
      wait(reference);
      const double s = seconds_since(t0);
      vae.to_memory_format(AutoencoderKL::MemoryFormat::kChannelsLast);
      const std::vector<float> a = to_vector(image);
      const std::vector<float> b = to_vector(reference);
      size_t differ = 0;
      double largest = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++differ;
        largest = std::max(largest, double(std::fabs(a[i] - b[i])));
      }
      std::printf("decode %lld with contiguous activations: %.3f s; %zu of %zu values differ from channels-last's "
                  "(largest difference %.3g)\n",
                  static_cast<long long>(size), s, differ, a.size(), largest);
    }
  }
  return 0;
}
