// The CPU device's runtime (devices/registry.cc lists it).
#pragma once
#include "devices/runtime.h"

namespace kiln::cpu {

// The runtime of cpu:`index` (only cpu:0 exists); throws "[device] ..." for another index.
DeviceRuntime& runtime_of(int index);

}  // namespace kiln::cpu
