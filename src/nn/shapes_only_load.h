// Loading a model for its shapes alone. While a ShapesOnlyLoad is alive, every weight a
// checkpoint gives (whole, sliced for tensor parallelism, converted, quantized at load, joined
// from shards) is reserved address space of its shape and dtype, reading as zeros and never
// committed: nothing of the checkpoint's data is read. A model built so traces like the real
// one, which is all a memory plan needs (kiln plan): a 64 GB transformer plans on a machine with
// 24 GB, from a real checkpoint or a layout-only folder (make-random --layout-only).
#pragma once

#include "core/tensor.h"

namespace kiln::nn {

class ShapesOnlyLoad {
 public:
  ShapesOnlyLoad();
  ~ShapesOnlyLoad();
  ShapesOnlyLoad(const ShapesOnlyLoad&) = delete;
  ShapesOnlyLoad& operator=(const ShapesOnlyLoad&) = delete;
  // Whether one is alive (in any thread: loaders may hand work to others).
  static bool active();
  // A weight of this shape in `dtype` (a storage type too), never read.
  static Tensor weight(const Shape& shape, DType dtype);
};

}  // namespace kiln::nn
