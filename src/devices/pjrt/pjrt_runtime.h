// The PJRT device's runtime (devices/registry.cc lists it when the backend is built): pjrt:N runs
// on device N of a PJRT plugin — XLA's CPU plugin unless --pjrt-plugin / KILN_PJRT_PLUGIN names
// another — and tpu:N on libtpu's (KILN_TPU_PLUGIN, default libtpu.so from the loader's path).
#pragma once
#include <cstdint>
#include <string>

#include "devices/runtime.h"

namespace kiln::pjrt {

DeviceRuntime& runtime_of(int index);
DeviceRuntime& tpu_runtime_of(int index);

// The plugin a pjrt device loads: KILN_PJRT_PLUGIN (the CLI's --pjrt-plugin sets it), else the
// CPU plugin scripts/install-deps.sh installed.
std::string plugin_path();

// The plugin's name and version as the on-disk cache keys them ("cpu 0.81 <version>").
std::string platform_of(const Device& device);

}  // namespace kiln::pjrt
