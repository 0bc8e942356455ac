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
  // Generated into host memory, like a checkpoint's weights (f32; only used in f32).
  Tensor load(const std::string& key, DType dtype) const override {
    KILN_CHECK(dtype == DType::f32, "weights", "generated weights are f32, asked for ", dtype_name(dtype));
    const Shape& s = shapes_.at(key);
    BufferPtr buf = host_allocate(size_t(numel(s)) * 4);
    det_param_values(key, s, static_cast<float*>(buf->data()));
    return Tensor::view_of(std::move(buf), s, DType::f32);
  }
  // Only the slice's elements are generated (each value depends on its index alone), as a
  // checkpoint reads only a shard's bytes.
  Tensor load_slice(const std::string& key, int dim, int64_t start, int64_t length, DType dtype) const override {
    KILN_CHECK(dtype == DType::f32, "weights", "generated weights are f32, asked for ", dtype_name(dtype));
    const Shape& s = shapes_.at(key);
    const int64_t rows = s.size() == 1 ? s[0] : s[0], cols = s.size() == 1 ? 1 : s[1];
    const int64_t out_rows = dim == 0 ? length : rows, out_cols = dim == 1 ? length : cols;
    KILN_CHECK(start >= 0 && length >= 0 && start + length <= (dim == 0 ? rows : cols), "weights", "slice out of range");
    BufferPtr buf = host_allocate(size_t(out_rows * out_cols) * 4);
    float* out = static_cast<float*>(buf->data());
    const uint64_t seed = fnv1a64(key);
    const bool is_bias = key.size() >= 4 && key.compare(key.size() - 4, 4, "bias") == 0;
    const double inv = 1.0 / std::sqrt(s.size() >= 2 ? double(cols) : 1.0);
    for (int64_t r = 0; r < out_rows; ++r)
      for (int64_t c = 0; c < out_cols; ++c) {
        const int64_t j = (dim == 0 ? start + r : r) * cols + (dim == 1 ? start + c : c);
        const double v = det_unit(seed, j);
        out[r * out_cols + c] = float(s.size() >= 2 ? v * inv : is_bias ? 0.02 * v : 1.0 + 0.1 * v);
      }
    return Tensor::view_of(std::move(buf), s.size() == 1 ? Shape{out_rows} : Shape{out_rows, out_cols}, DType::f32);
  }

 private:
  std::map<std::string, Shape> shapes_;
};

}  // namespace kiln::test
