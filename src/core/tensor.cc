#include "core/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#include <atomic>

#include "core/error.h"

namespace kiln {

Tensor Tensor::view_of(BufferPtr buffer, Shape shape, DType dtype, Strides strides,
                       int64_t offset) {
  KILN_CHECK(buffer != nullptr, "tensor", "view of a null buffer");
  if (strides.empty()) strides = contiguous_strides(shape);
  KILN_CHECK(strides.size() == shape.size(), "tensor", "rank of strides ", strides.size(),
             " differs from rank of shape ", to_string(shape));
  if (const int64_t block = dtype_block_elems(dtype); block > 1) {
    // Blocks run along rows: a view must keep whole, dense blocks.
    bool whole = !shape.empty() && shape.back() % block == 0 && strides.back() == 1 && offset % block == 0;
    for (size_t i = 0; whole && i + 1 < strides.size(); ++i) whole = strides[i] % block == 0;
    KILN_CHECK(whole, "tensor", dtype_name(dtype), to_string(shape), " view at offset ", offset,
               " does not keep whole ", block, "-element blocks along its last dim");
  }
  // The highest element the view can touch must lie inside the buffer.
  int64_t hi = offset, lo = offset;
  for (size_t i = 0; i < shape.size(); ++i) {
    KILN_CHECK(shape[i] >= 0, "tensor", "negative dimension in ", to_string(shape));
    if (shape[i] == 0) {
      hi = lo = offset;
      break;
    }
    const int64_t span = (shape[i] - 1) * strides[i];
    (span >= 0 ? hi : lo) += span;
  }
  const int64_t elems = int64_t(buffer->bytes() / dtype_block_bytes(dtype)) * dtype_block_elems(dtype);
  KILN_CHECK(lo >= 0 && (kiln::numel(shape) == 0 || hi < elems), "tensor", dtype_name(dtype),
             to_string(shape), " view at offset ", offset, " does not fit a buffer of ",
             buffer->bytes(), " bytes");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  impl->device = buffer->device();
  impl->buffer = std::move(buffer);
  return Tensor(std::move(impl));
}

namespace {
std::atomic<MaterializeHook> g_materialize{nullptr};  // set by every recording thread (same value)
}

void set_materialize_hook(MaterializeHook hook) { g_materialize.store(hook, std::memory_order_release); }

Tensor Tensor::deferred(std::shared_ptr<PendingValue> value, Shape shape, DType dtype, Device device,
                        Strides strides, int64_t offset) {
  KILN_CHECK(value != nullptr, "tensor", "deferred tensor without a pending value");
  if (strides.empty()) strides = contiguous_strides(shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  impl->device = std::move(device);
  impl->pending = std::move(value);
  return Tensor(std::move(impl));
}

const BufferPtr& Tensor::buffer() const {
  if (impl_->pending == nullptr) return impl_->buffer;
  PendingValue& v = *impl_->pending;
  if (v.buffer == nullptr) {
    const MaterializeHook hook = g_materialize.load(std::memory_order_acquire);
    KILN_CHECK(hook != nullptr, "tensor", "deferred tensor but no deferred-mode recorder");
    hook(v);
    KILN_CHECK(v.buffer != nullptr, "tensor", "deferred tensor was not materialised by its flush");
  }
  return v.buffer;
}

int64_t Tensor::dim(int64_t axis) const {
  return impl_->shape[size_t(normalize_axis(axis, rank(), "tensor"))];
}

bool Tensor::is_contiguous() const {
  int64_t expect = 1;
  for (size_t i = impl_->shape.size(); i-- > 0;) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expect) return false;
    expect *= impl_->shape[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  return static_cast<char*>(buffer()->data()) + storage_bytes(impl_->dtype, impl_->offset);
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype())) + to_string(shape()) + " on " + device().str();
}

BufferPtr host_allocate(size_t bytes) {
  // A zero-byte request still gets a real block so every tensor has a valid base pointer.
  const size_t size = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  if (size >= kHostMappingBytes) {
    // Large blocks are their own mappings, not malloc's: once malloc's mmap threshold has risen
    // (it does, to the largest block freed), long-lived weights made at load and the panels freed
    // between them would share its heap, whose holes it keeps; quantizing FLUX.1's transformer
    // held 3.9 GB of such holes. A mapping's pages go back to the system when it is freed.
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return std::make_shared<Buffer>(p, bytes, Device::cpu(), [p, size] { ::munmap(p, size); });
  }
  void* p = std::aligned_alloc(64, size);
  if (p == nullptr) throw std::bad_alloc();
  return std::make_shared<Buffer>(p, bytes, Device::cpu(), [p] { std::free(p); });
}

BufferPtr host_reserve(size_t bytes) {
  const size_t size = std::max<size_t>(bytes, 1);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  return std::make_shared<Buffer>(p, bytes, Device::cpu(), [p, size] { ::munmap(p, size); });
}

}  // namespace kiln
