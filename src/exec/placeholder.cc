#include "core/error.h"
#include "devices/runtime.h"
#include "exec/capture.h"

namespace kiln {

Tensor placeholder_tensor(const Shape& shape, DType dtype) {
  const size_t bytes = size_t(numel(shape)) * dtype_size(dtype);
  if (bytes < (size_t(64) << 20)) return Tensor::view_of(host_allocate(bytes), shape, dtype);
  // A large one is address space only: read-only pages that are never touched are neither
  // committed nor counted against the machine's memory, so the plan of a size far beyond it (a
  // 2^20-pixel side's latents are terabytes) can still be made, and then refused with its numbers.
  BufferPtr reserved = host_reserve(bytes);
  KILN_CHECK(reserved != nullptr, "memory", "a size this large cannot even be planned: a placeholder of shape ",
             to_string(shape), " (", bytes, " bytes) does not fit the address space");
  return Tensor::view_of(std::move(reserved), shape, dtype);
}

}  // namespace kiln
