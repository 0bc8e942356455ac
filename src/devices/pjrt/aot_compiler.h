// Ahead-of-time compiles for a device that is not there: a PJRT plugin's topology description
// (libtpu's "v6e:2x2": that many chips of that generation, no chip present) and PJRT_Compile
// against it, which returns what XLA would allocate in device memory for the program. What
// `kiln plan --device tpu` measures TPU memory with.
#pragma once
#include <cstdint>
#include <string>

struct PJRT_Api;
struct PJRT_TopologyDescription;

namespace kiln::pjrt {

// XLA's CompiledMemoryStats for device memory, in bytes.
struct CompiledMemory {
  int64_t code = 0, arguments = 0, outputs = 0, aliased = 0, temporaries = 0;
};

class AotCompiler {
 public:
  // Loads the plugin at `path` and describes `topology` ("v6e:1x1"). Throws "[device] ..." naming
  // the topology with the plugin's reason when it knows no such topology.
  AotCompiler(const std::string& path, const std::string& topology);
  ~AotCompiler();
  AotCompiler(const AotCompiler&) = delete;
  AotCompiler& operator=(const AotCompiler&) = delete;

  const std::string& topology() const { return topology_; }
  std::string platform_name() const;
  std::string platform_version() const;
  int device_count() const { return devices_; }
  // The devices' kind ("TPU v6 lite") and the device memory each has for programs (the plugin's
  // device_memory_bytes_limit; 0 when it does not say).
  const std::string& device_kind() const { return kind_; }
  int64_t device_memory_limit() const { return memory_limit_; }
  // Compiles `mlir` (StableHLO) for `replicas` devices of the topology and returns its memory.
  // Throws "[pjrt] compiling <name> for <topology>: ..." with XLA's message.
  CompiledMemory compile(const std::string& name, const std::string& mlir, int replicas) const;

 private:
  std::string path_, topology_;
  void* library_ = nullptr;
  const PJRT_Api* api_ = nullptr;
  PJRT_TopologyDescription* description_ = nullptr;
  int devices_ = 0;
  std::string kind_;
  int64_t memory_limit_ = 0;
};

}  // namespace kiln::pjrt
