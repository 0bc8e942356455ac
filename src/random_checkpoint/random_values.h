// The values of kiln's random benchmark checkpoints (kiln make-random). Every element is a pure
// function of (seed, tensor name, element index): a counter-based generator (SplitMix64's
// finaliser applied to key + index), so any range of any tensor can be produced on its own, by
// any number of threads, and a file is the same bytes whatever the thread count.
#pragma once
#include <cstdint>
#include <string>

namespace kiln::random_weights {

// How a tensor's values are drawn (or computed).
struct Init {
  enum class Kind { uniform, constant, sincos_2d };
  Kind kind = Kind::constant;
  // uniform: the standard deviation (values uniform in ±std·√3, mean 0); constant: the value;
  // sincos_2d: unused.
  double value = 0;
  // sincos_2d: the table is [1, grid², dim], `base_size` as Diffusers' PatchEmbed has it.
  int64_t grid = 0, dim = 0, base_size = 0;

  static Init uniform(double std) { return {Kind::uniform, std}; }
  static Init constant(double v) { return {Kind::constant, v}; }
  // Diffusers' get_2d_sincos_pos_embed(dim, grid, base_size=base_size, interpolation_scale=1),
  // the positional table PatchEmbed builds from a config: no random
  // draw, the same values for every seed. Cell (row r, column c) of the grid is element
  // r·grid + c; its channels [0, dim/2) encode the column coordinate, [dim/2, dim) the row, each
  // half [sin(g·ω_k), cos(g·ω_k)] for k < dim/4 with g = f32(i) / f32(grid / base_size) and
  // ω_k = 10000^(-k/(dim/4)), in f64. `dim` must be a multiple of 4.
  static Init sincos_2d(int64_t grid, int64_t dim, int64_t base_size) {
    return {Kind::sincos_2d, 0, grid, dim, base_size};
  }
};

// The generator key of one tensor: the seed and the tensor's full name (folder/name, so that
// equal names in two components draw different values).
uint64_t tensor_key(uint64_t seed, const std::string& name);

// Elements [begin, begin + count) of a tensor with generator key `key`, as f32.
void fill(const Init& init, uint64_t key, int64_t begin, int64_t count, float* dst);

}  // namespace kiln::random_weights
