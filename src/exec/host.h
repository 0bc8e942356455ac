// Moving values between the host and devices. Every read here is a sync point: it waits
// for the work that produces the value (and counts the wait).
#pragma once
#include <vector>

#include "core/tensor.h"
#include "graph/op.h"

namespace kiln {

// Copies host data into a new tensor on `device` (the source may be reused at once).
Tensor from_data(const void* data, const Shape& shape, DType dtype, const Device& device = default_device());
Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::f32,
                   const Device& device = default_device());
Tensor from_ints(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::i64,
                 const Device& device = default_device());

// A dense copy of `t` on `device`, made by the device runtime's copies (host memory to a device,
// a device to host memory, or within one); a sync point of deferred mode, not a host wait.
Tensor to_device(const Tensor& t, const Device& device);

// Waits until `t`'s value has been computed.
void wait(const Tensor& t);
// Waits for all work queued on `device` (in deferred mode, after flushing this thread's
// pending graph).
void synchronize(const Device& device = default_device());

std::vector<float> to_vector(const Tensor& t);        // any dtype, converted to f32
std::vector<int64_t> to_int_vector(const Tensor& t);  // integer/bool dtypes
double item(const Tensor& t);                         // a one-element tensor's value
HostTensor to_host(const Tensor& t);                  // dense copy as doubles (tests, references)

}  // namespace kiln
