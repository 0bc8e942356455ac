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

// The value of a deferred tensor (deferred-and-fused mode, exec/deferred.h): recorded in a
// thread's pending graph as node `node` of `recorder`, computed at the next flush into a dense
// buffer. Every view of the value shares one PendingValue; their strides/offset are relative to
// that (future) dense buffer.
struct PendingValue {
  BufferPtr buffer;                // set when the value has been computed (materialised)
  const void* recorder = nullptr;  // the recording thread's pending graph
  int node = -1;                   // node index in that graph while pending
};

// Called to materialise a pending value on first access to its buffer (installed by the
// deferred-mode recorder; core knows nothing about graphs).
using MaterializeHook = void (*)(PendingValue&);
void set_materialize_hook(MaterializeHook hook);

struct TensorImpl {
  Shape shape;
  Strides strides;     // elements
  int64_t offset = 0;  // elements from the buffer start
  DType dtype = DType::f32;
  Device device;
  BufferPtr buffer;                      // null while the value is deferred
  std::shared_ptr<PendingValue> pending; // set for deferred values (and kept after materialising)
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<const TensorImpl> impl) : impl_(std::move(impl)) {}

  // A tensor over an existing buffer (views, zero-copy weights). Checks the view fits the buffer.
  static Tensor view_of(BufferPtr buffer, Shape shape, DType dtype, Strides strides = {},
                        int64_t offset = 0);
  // A deferred tensor: a view (shape/strides/offset) of a value not computed yet.
  static Tensor deferred(std::shared_ptr<PendingValue> value, Shape shape, DType dtype, Device device,
                         Strides strides = {}, int64_t offset = 0);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  int64_t rank() const { return int64_t(impl_->shape.size()); }
  int64_t dim(int64_t axis) const;  // negative axes count from the end
  int64_t numel() const { return kiln::numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  // Its buffer's device (model offload moves a weight's buffer), or, while deferred, the device
  // its value will be computed on.
  const Device& device() const { return impl_->buffer ? impl_->buffer->device() : impl_->device; }
  const Strides& strides() const { return impl_->strides; }
  int64_t offset() const { return impl_->offset; }
  // The device buffer. For a deferred tensor that is not computed yet, this materialises it
  // (flushes the pending graph it belongs to): a sync point of deferred mode, not a host wait.
  const BufferPtr& buffer() const;
  // Recorded in deferred mode and not computed yet (metadata queries never materialise).
  bool is_pending() const { return impl_->pending != nullptr && impl_->pending->buffer == nullptr; }
  const std::shared_ptr<PendingValue>& pending_value() const { return impl_->pending; }
  size_t nbytes() const { return storage_bytes(dtype(), numel()); }
  bool is_contiguous() const;
  // Address of element 0 (device memory; only valid to dereference once the producer ran).
  void* data_ptr() const;
  std::string describe() const;  // "f32[2,3] on cpu:0"

  const TensorImpl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const TensorImpl> impl_;
};

}  // namespace kiln
