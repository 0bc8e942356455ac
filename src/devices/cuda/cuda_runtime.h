// The CUDA device's runtime (devices/registry.cc lists it when the backend is built).
#pragma once
#include "devices/runtime.h"

namespace kiln::cuda {

// The runtime of cuda:`index`, started on first use. Throws "[device] cuda:N is not available:
// ..." when the machine has no usable driver or no such GPU.
DeviceRuntime& runtime_of(int index);

}  // namespace kiln::cuda
