// What a kernel sees of a tensor: a raw pointer to element 0 plus shape, strides, dtype.
#pragma once
#include "core/tensor.h"

namespace kiln {

struct TensorView {
  void* data = nullptr;
  Shape shape;
  Strides strides;
  DType dtype = DType::f32;

  int64_t numel() const { return kiln::numel(shape); }
  int64_t rank() const { return int64_t(shape.size()); }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }

  static TensorView of(const Tensor& t) { return {t.data_ptr(), t.shape(), t.strides(), t.dtype()}; }
};

}  // namespace kiln
