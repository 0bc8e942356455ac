// Compiling for a device that is not there, to learn what it would hold: kiln plan's view of a
// TPU (through libtpu's topology descriptions) or any other device a PJRT plugin can describe.
// A traced graph (exec/capture.h) is lowered for `replicas` devices, one per tensor-parallel rank,
// compiled ahead of time, and the compiler's own account of device memory comes back. Nothing
// here names a plugin's API: the PJRT backend implements it (src/devices/pjrt/aot_target.cc).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/device.h"

namespace kiln {

struct Graph;

// What a compiled program holds in device memory while it runs (XLA's compiled memory stats).
struct AotMemory {
  int64_t code = 0, arguments = 0, outputs = 0, aliased = 0, temporaries = 0;
  double compile_seconds = 0;  // of the compile that measured it
  bool from_cache = false;      // read back from the on-disk cache (that compile was another process's)
  // Not empty when the compiler refused the program because it cannot fit one device's memory
  // (XLA's reason; the figures above are then unknown, 0).
  std::string does_not_fit;
  // Arguments and outputs, less the output bytes that reuse arguments, plus temporaries and code.
  int64_t total() const { return code + arguments + outputs - aliased + temporaries; }
};

class AotTarget {
 public:
  virtual ~AotTarget() = default;
  // A topology of `type` devices ("v6e:2x2" for tpu: that generation's chips in that shape).
  // The tpu plugin is KILN_TPU_PLUGIN's, else the libtpu scripts/install-deps.sh fetched. Errors
  // name the topology, or say the build has no PJRT backend.
  static std::unique_ptr<AotTarget> open(DeviceType type, const std::string& topology);

  virtual std::string describe() const = 0;      // "tpu v6e:2x2: 4 × TPU v6 lite, 31.2 GiB each (libtpu ...)"
  virtual int devices() const = 0;               // in the topology
  virtual int64_t memory_per_device() const = 0;  // bytes a program may use on one device (0: unknown)
  // Compiles `g` for `replicas` devices of the topology (each input an argument of its shape and
  // dtype; collectives over every replica). `name` is for errors.
  virtual AotMemory compile(const std::string& name, const Graph& g, int replicas) const = 0;
  // The program text compile() gives the compiler (StableHLO), for tests and --dump.
  virtual std::string program_text(const Graph& g, int replicas) const = 0;
};

}  // namespace kiln
