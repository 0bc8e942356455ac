// Tensor: an immutable value handle (shape, dtype, device, strided view of a Buffer).
// Copying a Tensor copies the handle, never the data. Ops (src/exec/ops.h) return new
// tensors; views share their input's buffer. Reading values on the host is done through
// src/exec/host.h, which waits for the work that produces them.
#pragma once
#include <memory>

#include "core/buffer.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace kiln {

struct TensorImpl {
  Shape shape;
  Strides strides;     // elements
  int64_t offset = 0;  // elements from the buffer start
  DType dtype = DType::f32;
  Device device;
  BufferPtr buffer;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<const TensorImpl> impl) : impl_(std::move(impl)) {}

  // A tensor over an existing buffer (views, zero-copy weights). Checks the view fits the buffer.
  static Tensor view_of(BufferPtr buffer, Shape shape, DType dtype, Strides strides = {},
                        int64_t offset = 0);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  int64_t rank() const { return int64_t(impl_->shape.size()); }
  int64_t dim(int64_t axis) const;  // negative axes count from the end
  int64_t numel() const { return kiln::numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  const Device& device() const { return impl_->device; }
  const Strides& strides() const { return impl_->strides; }
  int64_t offset() const { return impl_->offset; }
  const BufferPtr& buffer() const { return impl_->buffer; }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  // Address of element 0 (device memory; only valid to dereference once the producer ran).
  void* data_ptr() const;
  std::string describe() const;  // "f32[2,3] on cpu:0"

  const TensorImpl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const TensorImpl> impl_;
};

}  // namespace kiln
