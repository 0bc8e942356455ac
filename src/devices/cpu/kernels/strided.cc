#include "devices/cpu/kernels/strided.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

StridedLoop make_strided_loop(const Shape& shape, const std::vector<Strides>& strides) {
  const size_t n_ops = strides.size();
  // Drop size-1 dims, then merge dim i into i+1 when every operand is dense across them.
  Shape dims;
  std::vector<Strides> st(n_ops);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !dims.empty();
    for (size_t k = 0; merge && k < n_ops; ++k) merge = st[k].back() == strides[k][d] * shape[d];
    if (merge) {
      dims.back() *= shape[d];
      for (size_t k = 0; k < n_ops; ++k) st[k].back() = strides[k][d];
    } else {
      dims.push_back(shape[d]);
      for (size_t k = 0; k < n_ops; ++k) st[k].push_back(strides[k][d]);
    }
  }
  StridedLoop loop;
  loop.outer_strides.resize(n_ops);
  loop.inner_stride.assign(n_ops, 0);
  if (dims.empty()) {
    loop.inner = numel(shape) == 0 ? 0 : 1;
    return loop;
  }
  loop.inner = dims.back();
  loop.outer.assign(dims.begin(), dims.end() - 1);
  for (size_t k = 0; k < n_ops; ++k) {
    loop.inner_stride[k] = st[k].back();
    loop.outer_strides[k].assign(st[k].begin(), st[k].end() - 1);
  }
  return loop;
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
