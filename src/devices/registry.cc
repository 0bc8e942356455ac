// The device types this build has (the CUDA backend is built when the toolkit is
// found, the PJRT backend when the PJRT C API header is) and the runtime of each device: what
// runtime(device) looks up.
#include <string>

#include "core/error.h"
#include "core/tensor.h"
#include "devices/aot_target.h"
#include "devices/cpu/cpu_runtime.h"
#include "devices/runtime.h"
#if KILN_WITH_CUDA
#include "devices/cuda/cuda_runtime.h"
#endif
#if KILN_WITH_PJRT
#include "devices/pjrt/pjrt_runtime.h"
#endif


namespace kiln {

namespace {

struct DeviceKind {
  DeviceType type;
  const char* name;
  DeviceRuntime& (*runtime_of)(int index);  // throws "[device] ..." for an index the machine lacks
};

constexpr DeviceKind kDeviceKinds[] = {
    {DeviceType::cpu, "cpu", cpu::runtime_of},
#if KILN_WITH_CUDA
    {DeviceType::cuda, "cuda", cuda::runtime_of},
#endif
#if KILN_WITH_PJRT
    {DeviceType::pjrt, "pjrt", pjrt::runtime_of},
    {DeviceType::tpu, "tpu", pjrt::tpu_runtime_of},
#endif
};

std::string built_kinds() {
  std::string names;
  for (const DeviceKind& k : kDeviceKinds) names += (names.empty() ? "" : ", ") + std::string(k.name);
  return names;
}

}  // namespace

DeviceRuntime& runtime(const Device& device) {
  for (const DeviceKind& k : kDeviceKinds)
    if (k.type == device.type) return k.runtime_of(device.index);
  fail("device", device.str(), " is not available: this build has no backend for it (it has: ", built_kinds(),
       "; the CUDA backend is built when CMake finds the CUDA toolkit, the PJRT backend (pjrt, tpu) when ",
       "it finds pjrt_c_api.h, which scripts/install-deps.sh installs)");
}

std::unique_ptr<AotTarget> AotTarget::open(DeviceType type, const std::string& topology) {
#if KILN_WITH_PJRT
  return pjrt::open_aot_target(type, topology);
#else
  (void)topology;
  fail("device", Device{type, 0}.str(), ": this build has no PJRT backend, which compiling for a topology needs (CMake ",
       "builds it when it finds pjrt_c_api.h, which scripts/install-deps.sh installs)");
#endif
}

std::vector<Tensor> DeviceRuntime::run_whole_graph(const Graph&, const std::vector<Tensor>&) {
  fail("device", device().str(), " runs graphs as kiln's launches, not as one program");
}

DeviceRuntime& runtime_for(const std::string& op, const Device& device, const std::vector<OperandMeta>& inputs) {
  DeviceRuntime& rt = runtime(device);
  if (rt.supports(op, inputs)) return rt;
  std::string dtypes;
  for (const OperandMeta& m : inputs) dtypes += (dtypes.empty() ? "" : ", ") + std::string(dtype_name(m.dtype)) + to_string(m.shape);
  fail(op, "has no kernel on ", device.str(), " for inputs (", dtypes, ")");
}

}  // namespace kiln
