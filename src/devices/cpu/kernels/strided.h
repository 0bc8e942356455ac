// Iteration over strided operands: dims are coalesced where every operand is dense across
// them, leaving an outer index space and one inner run per operand.
#pragma once
#include <vector>

#include "core/shape.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

struct StridedLoop {
  Shape outer;                              // outer dims after coalescing (may be empty)
  int64_t inner = 1;                        // length of the innermost run
  std::vector<Strides> outer_strides;       // per operand, one stride per outer dim
  std::vector<int64_t> inner_stride;        // per operand

  // Element offset of operand `k` at flat outer position `pos`.
  int64_t offset(size_t k, int64_t pos) const {
    int64_t off = 0;
    for (size_t d = outer.size(); d-- > 0;) {
      off += (pos % outer[d]) * outer_strides[k][d];
      pos /= outer[d];
    }
    return off;
  }
  int64_t outer_count() const { return numel(outer); }
};

// `strides[k]` are operand k's strides over `shape` (0 for broadcast dims).
StridedLoop make_strided_loop(const Shape& shape, const std::vector<Strides>& strides);

}  // namespace kiln::cpu::KILN_CPU_LEVEL
