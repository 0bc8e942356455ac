// Helpers shared by the reference implementations (simple loops, not fast).
#pragma once
#include <vector>

#include "core/error.h"
#include "graph/op.h"

namespace kiln::ref {

// Multi-index of flat position `flat` in `shape`.
inline std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    idx[i] = shape[i] ? flat % shape[i] : 0;
    flat = shape[i] ? flat / shape[i] : 0;
  }
  return idx;
}

// Value of `t` at the output multi-index `idx` under NumPy broadcasting.
inline double at_broadcast(const HostTensor& t, const std::vector<int64_t>& idx) {
  const size_t off = idx.size() - t.shape.size();
  int64_t flat = 0;
  for (size_t i = 0; i < t.shape.size(); ++i) flat = flat * t.shape[i] + (t.shape[i] == 1 ? 0 : idx[off + i]);
  return t.data[size_t(flat)];
}

// Normalised, sorted, de-duplicated reduction axes (empty list = all axes).
std::vector<int64_t> reduction_axes(const std::vector<int64_t>& axes, int64_t rank, const char* where);

}  // namespace kiln::ref
