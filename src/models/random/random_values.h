// The values of kiln's random benchmark checkpoints (kiln make-random). Every element is a pure
// function of (seed, tensor name, element index): a counter-based generator (SplitMix64's
// finaliser applied to key + index), so any range of any tensor can be produced on its own, by
// any number of threads, and a file is the same bytes whatever the thread count.
#pragma once
#include <cstdint>
#include <string>

namespace kiln::random_weights {

// How a tensor's values are drawn.
struct Init {
  enum class Kind { uniform, constant };
  Kind kind = Kind::constant;
  // uniform: the standard deviation (values uniform in ±std·√3, mean 0); constant: the value.
  double value = 0;

  static Init uniform(double std) { return {Kind::uniform, std}; }
  static Init constant(double v) { return {Kind::constant, v}; }
};

// The generator key of one tensor: the seed and the tensor's full name (folder/name, so that
// equal names in two components draw different values).
uint64_t tensor_key(uint64_t seed, const std::string& name);

// Elements [begin, begin + count) of a tensor with generator key `key`, as f32.
void fill(const Init& init, uint64_t key, int64_t begin, int64_t count, float* dst);

}  // namespace kiln::random_weights
