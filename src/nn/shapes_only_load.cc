#include "nn/shapes_only_load.h"

#include <atomic>

#include "core/error.h"

namespace kiln::nn {

namespace {
std::atomic<int> g_active{0};
}  // namespace

ShapesOnlyLoad::ShapesOnlyLoad() { g_active.fetch_add(1); }
ShapesOnlyLoad::~ShapesOnlyLoad() { g_active.fetch_sub(1); }
bool ShapesOnlyLoad::active() { return g_active.load() > 0; }

Tensor ShapesOnlyLoad::weight(const Shape& shape, DType dtype) {
  // Reserved pages read as zeros: a loader that looks at a value (a VAE folding its batch norm's
  // running statistics) sees a well-formed one, and nothing is committed however large.
  const size_t bytes = storage_bytes(dtype, numel(shape));
  BufferPtr reserved = host_reserve(bytes);
  KILN_CHECK(reserved != nullptr, "memory", "a weight of shape ", to_string(shape), " (", bytes,
             " bytes) does not fit the address space");
  return Tensor::view_of(std::move(reserved), shape, dtype);
}

}  // namespace kiln::nn
