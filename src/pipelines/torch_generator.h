// Reproduces torch.Generator("cpu").manual_seed(seed) followed by torch.randn(..., float32),
// so a seed gives the same initial noise (and image) as Diffusers.
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

namespace kiln {

class TorchGenerator {
 public:
  explicit TorchGenerator(uint64_t seed);

  // n standard-normal fp32 values, as torch.randn(n) draws them from this generator.
  std::vector<float> randn(int64_t n);

 private:
  uint32_t next_u32() { return uint32_t(mt_()); }
  double next_u53();  // a double in [0, 1) from two 32-bit draws (torch's random64 path)
  void normal_fill_16(float* d);

  std::mt19937 mt_;
  std::optional<double> cached_normal_;  // the second value of a small-tensor Box-Muller pair
};

}  // namespace kiln
