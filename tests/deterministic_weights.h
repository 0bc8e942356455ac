// The deterministic parameters of the flux1_transformer_mid fixture (tests/fixtures/
// flux1_transformer_mid/manifest.json, "weights"): the fixture ships the reference outputs but
// not its 2.7 GB of weights, which are regenerated from each tensor's name:
//   seed = FNV-1a-64(name); element j: splitmix64(seed + (j + 1) * golden-ratio constant)
//   -> v in [-1, 1) -> scaled by 1/sqrt(fan_in) (matrices), 0.02 (biases) or 1 + 0.1 v (norm
//   scales), rounded once to f32.
#pragma once
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "devices/runtime.h"
#include "exec/host.h"
#include "nn/weight_source.h"

namespace kiln::test {

inline uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// Element j of the generated tensor `name` as a double in [-1, 1).
inline double det_unit(uint64_t seed, int64_t j) {
  uint64_t z = seed + uint64_t(j + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
}

// Writes the generated values of tensor `name` into `out` (numel(shape) floats).
inline void det_param_values(const std::string& name, const Shape& shape, float* out) {
  const int64_t n = numel(shape);
  const uint64_t seed = fnv1a64(name);
  const bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
  const double fan_in = shape.size() >= 2 ? double(n / shape[0]) : 1.0;
  const double inv = 1.0 / std::sqrt(fan_in);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    const double v = det_unit(seed, j);
    out[j] = float(shape.size() >= 2 ? v * inv : is_bias ? 0.02 * v : 1.0 + 0.1 * v);
  }
}

inline std::vector<float> det_param_values(const std::string& name, const Shape& shape) {
  std::vector<float> out(static_cast<size_t>(numel(shape)));
  det_param_values(name, shape, out.data());
  return out;
}

// A WeightSource that generates each tensor on load (names and shapes given up front).
class GeneratedWeights final : public nn::WeightSource {
 public:
  explicit GeneratedWeights(std::map<std::string, Shape> shapes) : shapes_(std::move(shapes)) {}
  std::string describe() const override { return "generated weights"; }
  bool contains(const std::string& key) const override { return shapes_.count(key) != 0; }
  Shape shape(const std::string& key) const override { return shapes_.at(key); }
  // Generated straight into device memory (f32; these weights are only used in f32).
  Tensor load(const std::string& key, DType dtype) const override {
    KILN_CHECK(dtype == DType::f32, "weights", "generated weights are f32, asked for ", dtype_name(dtype));
    const Shape& s = shapes_.at(key);
    BufferPtr buf = runtime(Device::cpu()).allocate(size_t(numel(s)) * 4);
    det_param_values(key, s, static_cast<float*>(buf->data()));
    return Tensor::view_of(std::move(buf), s, DType::f32);
  }

 private:
  std::map<std::string, Shape> shapes_;
};

}  // namespace kiln::test
