#include "devices/runtime.h"
#include "exec/capture.h"

namespace kiln {

Tensor placeholder_tensor(const Shape& shape, DType dtype) {
  return Tensor::view_of(host_allocate(size_t(numel(shape)) * dtype_size(dtype)), shape, dtype);
}

}  // namespace kiln
