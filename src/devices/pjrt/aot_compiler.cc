#include "devices/pjrt/aot_compiler.h"

#include <cstdlib>
#include <cstring>

#include <pjrt_c_api.h>

#include "core/error.h"
#include "devices/pjrt/c_api_args.h"
#include "devices/pjrt/plugin.h"

namespace kiln::pjrt {

AotCompiler::AotCompiler(const std::string& path, const std::string& topology) : path_(path), topology_(topology) {
  // libtpu otherwise asks the cloud metadata server which TPU this VM has (there is none, and no
  // network): these make it describe the topology it is given instead. Compiling uses no chip, so
  // several processes may (libtpu otherwise locks /tmp/libtpu_lockfile for the first), and its
  // logging of the missing hardware is left out. A value already set wins.
  ::setenv("TPU_SKIP_MDS_QUERY", "1", 0);
  ::setenv("TPU_WORKER_HOSTNAMES", "localhost", 0);
  ::setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1", 0);
  ::setenv("TPU_STDERR_LOG_LEVEL", "3", 0);
  ::setenv("TPU_MIN_LOG_LEVEL", "3", 0);
  api_ = open_plugin(path, &library_);
  KILN_CHECK(api_->struct_size >= offsetof(PJRT_Api, PJRT_Compile) + sizeof(void*) && api_->PJRT_Compile &&
                 api_->PJRT_TopologyDescription_Create,
             "device", "the PJRT plugin ", path, " cannot compile for a topology without its devices (no PJRT_Compile)");
  auto create = KILN_PJRT_ARGS(PJRT_TopologyDescription_Create_Args);
  create.topology_name = topology.data();
  create.topology_name_size = topology.size();
  if (PJRT_Error* e = api_->PJRT_TopologyDescription_Create(&create))
    fail("device", "topology ", topology, " (--topology): the PJRT plugin ", path, " knows no such topology: ",
         error_text(api_, e), " (expected GENERATION:SHAPE, e.g. v6e:1x1, v6e:2x2, v5e:2x4, v5p:2x2x1)");
  description_ = create.topology;
  auto devs = KILN_PJRT_ARGS(PJRT_TopologyDescription_GetDeviceDescriptions_Args);
  devs.topology = description_;
  if (PJRT_Error* e = api_->PJRT_TopologyDescription_GetDeviceDescriptions(&devs))
    fail("pjrt", "listing the devices of topology ", topology, ": ", error_text(api_, e));
  devices_ = int(devs.num_descriptions);
  KILN_CHECK(devices_ > 0, "device", "topology ", topology, " has no devices");
  auto kind = KILN_PJRT_ARGS(PJRT_DeviceDescription_Kind_Args);
  kind.device_description = devs.descriptions[0];
  if (PJRT_Error* e = api_->PJRT_DeviceDescription_Kind(&kind))
    fail("pjrt", "asking topology ", topology, " its device kind: ", error_text(api_, e));
  kind_.assign(kind.device_kind, kind.device_kind_size);
  auto attrs = KILN_PJRT_ARGS(PJRT_DeviceDescription_Attributes_Args);
  attrs.device_description = devs.descriptions[0];
  if (PJRT_Error* e = api_->PJRT_DeviceDescription_Attributes(&attrs))
    fail("pjrt", "asking topology ", topology, " its device attributes: ", error_text(api_, e));
  for (size_t i = 0; i < attrs.num_attributes; ++i) {
    const PJRT_NamedValue& a = attrs.attributes[i];
    if (std::string(a.name, a.name_size) == "device_memory_bytes_limit" && a.type == PJRT_NamedValue_kInt64)
      memory_limit_ = a.int64_value;
  }
}

AotCompiler::~AotCompiler() {
  if (!description_) return;
  auto a = KILN_PJRT_ARGS(PJRT_TopologyDescription_Destroy_Args);
  a.topology = description_;
  if (PJRT_Error* e = api_->PJRT_TopologyDescription_Destroy(&a)) error_text(api_, e);
}

std::string AotCompiler::platform_name() const {
  auto a = KILN_PJRT_ARGS(PJRT_TopologyDescription_PlatformName_Args);
  a.topology = description_;
  if (PJRT_Error* e = api_->PJRT_TopologyDescription_PlatformName(&a))
    fail("pjrt", "asking topology ", topology_, " its platform: ", error_text(api_, e));
  return std::string(a.platform_name, a.platform_name_size);
}

std::string AotCompiler::platform_version() const {
  auto a = KILN_PJRT_ARGS(PJRT_TopologyDescription_PlatformVersion_Args);
  a.topology = description_;
  if (PJRT_Error* e = api_->PJRT_TopologyDescription_PlatformVersion(&a))
    fail("pjrt", "asking topology ", topology_, " its platform version: ", error_text(api_, e));
  return std::string(a.platform_version, a.platform_version_size);
}

CompiledMemory AotCompiler::compile(const std::string& name, const std::string& mlir, int replicas) const {
  KILN_CHECK(replicas >= 1 && replicas <= devices_, "device", name, ": a program for ", replicas,
             " devices does not fit topology ", topology_, ", which has ", devices_);
  PJRT_Program program = mlir_program(mlir);
  const std::string options = compile_options(replicas);
  auto a = KILN_PJRT_ARGS(PJRT_Compile_Args);
  a.topology = description_;
  a.program = &program;
  a.compile_options = options.data();
  a.compile_options_size = options.size();
  if (PJRT_Error* e = api_->PJRT_Compile(&a))
    fail("pjrt", "compiling ", name, " for ", topology_, ": ", error_text(api_, e));
  auto stats = KILN_PJRT_ARGS(PJRT_Executable_GetCompiledMemoryStats_Args);
  stats.executable = a.executable;
  PJRT_Error* e = api_->PJRT_Executable_GetCompiledMemoryStats(&stats);
  destroy_executable(api_, a.executable);
  if (e) fail("pjrt", "reading the memory of ", name, " compiled for ", topology_, ": ", error_text(api_, e));
  return CompiledMemory{stats.generated_code_size_in_bytes, stats.argument_size_in_bytes, stats.output_size_in_bytes,
                        stats.alias_size_in_bytes, stats.temp_size_in_bytes};
}

}  // namespace kiln::pjrt
