#include "exec/host.h"

#include <cstring>

#include "core/error.h"
#include "devices/runtime.h"
#include "exec/capture.h"
#include "exec/counters.h"
#include "exec/deferred.h"
#include "exec/dispatch.h"

namespace kiln {

Tensor from_data(const void* data, const Shape& shape, DType dtype, const Device& device) {
  const size_t bytes = storage_bytes(dtype, numel(shape));
  DeviceRuntime& rt = runtime(device);
  BufferPtr buf = rt.allocate(bytes);
  if (bytes && rt.is_host()) {
    std::memcpy(buf->data(), data, bytes);
  } else if (bytes) {  // through staging memory the device copies from, so `data` is free at once
    BufferPtr staging = rt.allocate_staging(bytes);
    std::memcpy(staging->data(), data, bytes);
    buf->set_ready_seq(rt.copy(staging, 0, buf, 0, bytes));
  }
  return Tensor::view_of(std::move(buf), shape, dtype);
}

Tensor to_device(const Tensor& t, const Device& device) {
  KILN_CHECK(t.defined(), "to", "undefined tensor");
  const Tensor src = t.is_contiguous() ? t : dispatch("copy", {t});
  const size_t bytes = src.nbytes();
  const size_t offset = storage_bytes(src.dtype(), src.offset());
  DeviceRuntime& to = runtime(device);
  BufferPtr buf = to.allocate(bytes);
  if (bytes && !to.is_host()) {  // on the destination's queue, which its readers wait on
    buf->set_ready_seq(to.copy(src.buffer(), offset, buf, 0, bytes));
  } else if (bytes) {  // into host memory, by the source's device, which owns the other end
    DeviceRuntime& from = runtime(src.device());
    from.wait_for(from.copy(src.buffer(), offset, buf, 0, bytes));
  }
  return Tensor::view_of(std::move(buf), src.shape(), src.dtype());
}

Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype, const Device& device) {
  KILN_CHECK(int64_t(values.size()) == numel(shape), "from_vector", values.size(), " values for shape ",
             to_string(shape));
  std::vector<char> tmp(storage_bytes(dtype, int64_t(values.size())));
  convert_from_f32(values.data(), tmp.data(), dtype, int64_t(values.size()));
  return from_data(tmp.data(), shape, dtype, device);
}

Tensor from_ints(const std::vector<int64_t>& values, const Shape& shape, DType dtype, const Device& device) {
  KILN_CHECK(int64_t(values.size()) == numel(shape), "from_ints", values.size(), " values for shape ",
             to_string(shape));
  std::vector<char> tmp(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) store_from_double(tmp.data(), dtype, int64_t(i), double(values[i]));
  return from_data(tmp.data(), shape, dtype, device);
}

void wait(const Tensor& t) {
  KILN_CHECK(t.defined(), "sync", "undefined tensor");
  detail::check_host_read(&t);  // inside a compiled-mode trace, reading an input is a graph break
  DeviceRuntime& rt = runtime(t.device());
  const uint64_t seq = t.buffer()->ready_seq();
  const bool must_wait = seq != 0 && rt.completed() < seq;
  detail::count_sync(must_wait);
  if (seq != 0) rt.wait_for(seq);
}

void synchronize(const Device& device) {
  detail::check_host_read(nullptr);
  detail::flush_pending(FlushCause::sync);  // deferred mode: pending work is part of "all work"
  DeviceRuntime& rt = runtime(device);
  const uint64_t seq = rt.last_enqueued();
  detail::count_sync(rt.completed() < seq);
  rt.wait_for(seq);
}

namespace {

// Visits every element of a strided tensor in row-major order with its element offset.
template <typename F>
void for_each_offset(const Tensor& t, F&& f) {
  const Shape& s = t.shape();
  const Strides& st = t.strides();
  const int64_t n = t.numel();
  std::vector<int64_t> idx(s.size(), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, off);
    for (size_t d = s.size(); d-- > 0;) {
      if (++idx[d] < s[d]) {
        off += st[d];
        break;
      }
      off -= (s[d] - 1) * st[d];
      idx[d] = 0;
    }
  }
}

// A tensor's elements as the host reads them, once computed: in place on a host device, else
// from a copy of the bytes it views. `base` is element 0, with the tensor's strides.
struct HostElements {
  BufferPtr staged;
  const void* base = nullptr;
};
HostElements host_elements(const Tensor& t) {
  wait(t);
  DeviceRuntime& rt = runtime(t.device());
  if (rt.is_host()) return {nullptr, t.data_ptr()};
  // The nearest and furthest elements it views, relative to element 0 (a flipped view's
  // negative strides reach before it).
  int64_t first = 0, last = 0;
  for (size_t d = 0; d < t.shape().size(); ++d)
    if (t.shape()[d] > 1) (t.strides()[d] < 0 ? first : last) += (t.shape()[d] - 1) * t.strides()[d];
  const size_t begin = storage_bytes(t.dtype(), t.offset() + first);
  const size_t bytes = storage_bytes(t.dtype(), t.offset() + last + 1) - begin;
  HostElements h{rt.allocate_staging(bytes), nullptr};
  rt.wait_for(rt.copy(t.buffer(), begin, h.staged, 0, bytes));
  h.base = static_cast<const char*>(h.staged->data()) + (storage_bytes(t.dtype(), t.offset()) - begin);
  return h;
}

}  // namespace

HostTensor to_host(const Tensor& t) {
  const HostElements elements = host_elements(t);
  HostTensor h{t.shape(), t.dtype(), std::vector<double>(size_t(t.numel()))};
  const void* base = elements.base;
  for_each_offset(t, [&](int64_t i, int64_t off) { h.data[size_t(i)] = load_as_double(base, t.dtype(), off); });
  return h;
}

std::vector<float> to_vector(const Tensor& t) {
  const HostElements elements = host_elements(t);
  std::vector<float> out(size_t(t.numel()));
  const void* base = elements.base;
  if (t.is_contiguous()) {
    convert_to_f32(base, t.dtype(), out.data(), t.numel());
  } else {
    for_each_offset(t, [&](int64_t i, int64_t off) { out[size_t(i)] = float(load_as_double(base, t.dtype(), off)); });
  }
  return out;
}

std::vector<int64_t> to_int_vector(const Tensor& t) {
  KILN_CHECK(!is_floating(t.dtype()), "to_int_vector", "tensor is ", t.describe(), ", expected an integer dtype");
  const HostElements elements = host_elements(t);
  std::vector<int64_t> out(size_t(t.numel()));
  const void* base = elements.base;
  for_each_offset(t, [&](int64_t i, int64_t off) {
    out[size_t(i)] = t.dtype() == DType::i64 ? static_cast<const int64_t*>(base)[off]
                                             : int64_t(load_as_double(base, t.dtype(), off));
  });
  return out;
}

double item(const Tensor& t) {
  KILN_CHECK(t.defined() && t.numel() == 1, "item", "needs a one-element tensor, got ", t.describe());
  return load_as_double(host_elements(t).base, t.dtype(), 0);
}

}  // namespace kiln
