// The PJRT device's runtime (devices/registry.cc lists it when the backend is built): pjrt:N runs
// on device N of a PJRT plugin — XLA's CPU plugin unless --pjrt-plugin / KILN_PJRT_PLUGIN names
// another — and tpu:N on libtpu's (tpu_plugin_path()).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "devices/aot_target.h"
#include "devices/runtime.h"

namespace kiln::pjrt {

DeviceRuntime& runtime_of(int index);
DeviceRuntime& tpu_runtime_of(int index);

// The plugin a pjrt device loads: KILN_PJRT_PLUGIN (the CLI's --pjrt-plugin sets it), else the
// CPU plugin scripts/install-deps.sh installed.
std::string plugin_path();

// The plugin a tpu device (and kiln plan's TPU compiles) loads: KILN_TPU_PLUGIN, else the libtpu
// scripts/install-deps.sh installed, else libtpu.so from the loader's path.
std::string tpu_plugin_path();

// A topology of `type` devices to compile for ahead of time (devices/aot_target.h; aot_target.cc).
std::unique_ptr<AotTarget> open_aot_target(DeviceType type, const std::string& topology);

// The plugin's name and version as the on-disk cache keys them ("cpu 0.81 <version>").
std::string platform_of(const Device& device);

}  // namespace kiln::pjrt
