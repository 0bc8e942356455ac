#include "random_checkpoint/random_values.h"

#include <cmath>
#include <vector>

namespace kiln::random_weights {

namespace {

// SplitMix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mix whose outputs
// for consecutive inputs pass BigCrush; applied to key + index it is a counter-based generator.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;  // SplitMix64's counter increment

}  // namespace

uint64_t tensor_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the name, then mixed with the seed
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return mix64(mix64(h) ^ mix64(seed + kGolden));
}

void fill(const Init& init, uint64_t key, int64_t begin, int64_t count, float* dst) {
  if (init.kind == Init::Kind::sincos_2d) {
    const int64_t half = init.dim / 2, quarter = init.dim / 4;
    // torch: arange(grid, float32) / (grid / base_size), the divisor a Python float used as f32.
    const float step = float(double(init.grid) / double(init.base_size));
    // torch: 1.0 / 10000 ** (arange(quarter, float64) / quarter).
    std::vector<double> omega(static_cast<size_t>(quarter));
    for (int64_t k = 0; k < quarter; ++k) omega[size_t(k)] = 1.0 / std::pow(10000.0, double(k) / double(quarter));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t e = begin + i, cell = e / init.dim, ch = e % init.dim;
      const int64_t index = ch < half ? cell % init.grid : cell / init.grid;  // column first, then row
      const int64_t j = ch % half;
      const double a = double(float(index) / step) * omega[size_t(j % quarter)];
      dst[i] = float(j < quarter ? std::sin(a) : std::cos(a));
    }
    return;
  }
  if (init.kind == Init::Kind::constant) {
    const float v = float(init.value);
    for (int64_t i = 0; i < count; ++i) dst[i] = v;
    return;
  }
  // The top 24 bits b as the odd integer 2b + 1 - 2^24 (exact in f32): the centres of 2^24 equal
  // cells of (-1, 1) once scaled, so the values are symmetric around 0. The scale is the
  // half-width of a uniform distribution with this standard deviation.
  const float scale = float(init.value * std::sqrt(3.0) / double(1 << 24));
  const uint64_t base = key + uint64_t(begin) * kGolden;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t bits = int64_t(mix64(base + uint64_t(i) * kGolden) >> 40);
    dst[i] = float(2 * bits + 1 - (int64_t(1) << 24)) * scale;
  }
}

}  // namespace kiln::random_weights
