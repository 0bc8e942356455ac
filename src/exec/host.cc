#include "exec/host.h"

#include <cstring>

#include "core/error.h"
#include "devices/runtime.h"
#include "exec/capture.h"
#include "exec/counters.h"
#include "exec/deferred.h"

namespace kiln {

Tensor from_data(const void* data, const Shape& shape, DType dtype, const Device& device) {
  const size_t bytes = storage_bytes(dtype, numel(shape));
  BufferPtr buf = runtime(device).allocate(bytes);
  if (bytes) std::memcpy(buf->data(), data, bytes);
  return Tensor::view_of(std::move(buf), shape, dtype);
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

}  // namespace

HostTensor to_host(const Tensor& t) {
  wait(t);
  HostTensor h{t.shape(), t.dtype(), std::vector<double>(size_t(t.numel()))};
  const void* base = t.data_ptr();
  for_each_offset(t, [&](int64_t i, int64_t off) { h.data[size_t(i)] = load_as_double(base, t.dtype(), off); });
  return h;
}

std::vector<float> to_vector(const Tensor& t) {
  wait(t);
  std::vector<float> out(size_t(t.numel()));
  if (t.is_contiguous()) {
    convert_to_f32(t.data_ptr(), t.dtype(), out.data(), t.numel());
  } else {
    const void* base = t.data_ptr();
    for_each_offset(t, [&](int64_t i, int64_t off) { out[size_t(i)] = float(load_as_double(base, t.dtype(), off)); });
  }
  return out;
}

std::vector<int64_t> to_int_vector(const Tensor& t) {
  KILN_CHECK(!is_floating(t.dtype()), "to_int_vector", "tensor is ", t.describe(), ", expected an integer dtype");
  wait(t);
  std::vector<int64_t> out(size_t(t.numel()));
  const void* base = t.data_ptr();
  for_each_offset(t, [&](int64_t i, int64_t off) {
    out[size_t(i)] = t.dtype() == DType::i64 ? static_cast<const int64_t*>(base)[off]
                                             : int64_t(load_as_double(base, t.dtype(), off));
  });
  return out;
}

double item(const Tensor& t) {
  KILN_CHECK(t.defined() && t.numel() == 1, "item", "needs a one-element tensor, got ", t.describe());
  wait(t);
  return load_as_double(t.data_ptr(), t.dtype(), 0);
}

}  // namespace kiln
