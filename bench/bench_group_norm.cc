// GroupNorm (+ SiLU, as the VAE decoder runs it) on channels-last activations at the shapes of a
// FLUX.1 VAE decode of a 1024x1024 image (32 groups): 512 channels at 128² and 256², 256 at 512²,
// 128 at 1024². Prints, per shape and dtype, the best time of a few runs and the rate at which it
// moved the tensor in and out (read x + write y), against which the machine's memory bandwidth can
// be set: a group's statistics read x once more (bf16: chunk moments) or twice (f32: two passes).
//
//   build/bench/bench_group_norm [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/dtype.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "test_util.h"

namespace {

using namespace kiln;
using Clock = std::chrono::steady_clock;

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--reps N]\n", argv[0]);
      return 2;
    }
  }
  const Shape shapes[] = {{1, 512, 128, 128}, {1, 512, 256, 256}, {1, 256, 512, 512}, {1, 128, 1024, 1024}};
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const Shape& shape : shapes) {
      const int64_t C = shape[1];
      const Tensor x = to_channels_last(test::random_tensor(shape, 1, dtype, -3, 5));
      const Tensor w = test::random_tensor({C}, 2), b = test::random_tensor({C}, 3);
      double best = 1e30;
      for (int r = 0; r < reps + 1; ++r) {  // the first run takes the output's pages from the system
        const auto t0 = Clock::now();
        const Tensor y = group_norm(x, 32, w, b, 1e-6, /*then_silu=*/true);
        wait(y);
        if (r > 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
      }
      const double bytes = 2.0 * double(x.numel()) * double(dtype_size(dtype));
      std::printf("group_norm+silu %-5s %4lld x %4lld x %3lld: %7.1f ms, %5.1f GB/s in+out\n", dtype_name(dtype),
                  static_cast<long long>(shape[2]), static_cast<long long>(shape[3]), static_cast<long long>(C),
                  best * 1e3, bytes / best / 1e9);
    }
  }
  return 0;
}
