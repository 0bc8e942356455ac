#include "pipelines/torch_generator.h"

#include <cmath>

namespace kiln {

namespace {
constexpr double kTwoPi = 6.283185307179586476925286766559;
}

// std::mt19937's seeding is exactly MT19937's init_genrand, which torch uses (seed mod 2^32).
TorchGenerator::TorchGenerator(uint64_t seed) : mt_(uint32_t(seed & 0xffffffffu)) {}

double TorchGenerator::next_u53() {
  const uint64_t hi = next_u32(), lo = next_u32();
  const uint64_t v = (hi << 32) | lo;
  return double(v & ((uint64_t(1) << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// Box-Muller on 16 uniforms: pairs (j, j+8). torch computes this in float; double
// arithmetic rounded once to float agrees within ~1e-6.
void TorchGenerator::normal_fill_16(float* d) {
  for (int j = 0; j < 8; ++j) {
    const double u1 = 1.0 - double(d[j]);
    const double u2 = double(d[j + 8]);
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double theta = kTwoPi * u2;
    d[j] = float(radius * std::cos(theta));
    d[j + 8] = float(radius * std::sin(theta));
  }
}

std::vector<float> TorchGenerator::randn(int64_t n) {
  std::vector<float> d(static_cast<size_t>(std::max<int64_t>(n, 0)));
  if (n >= 16) {
    auto uniform = [this] { return float(next_u32() & 0xffffffu) * (1.0f / 16777216.0f); };
    for (float& x : d) x = uniform();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) normal_fill_16(d.data() + i);
    if (n % 16 != 0) {  // the tail: 16 fresh uniforms into the last 16 slots
      float* tail = d.data() + (n - 16);
      for (int k = 0; k < 16; ++k) tail[k] = uniform();
      normal_fill_16(tail);
    }
    return d;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (cached_normal_) {
      d[size_t(i)] = float(*cached_normal_);
      cached_normal_.reset();
      continue;
    }
    const double u1 = next_u53(), u2 = next_u53();
    const double r = std::sqrt(-2.0 * std::log1p(-u2));
    const double theta = kTwoPi * u1;
    d[size_t(i)] = float(r * std::cos(theta));
    cached_normal_ = r * std::sin(theta);
  }
  return d;
}

}  // namespace kiln
