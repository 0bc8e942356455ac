// An argument struct of the PJRT C API, zeroed, with its struct_size set to the header's
// *_STRUCT_SIZE: how plugins of other API minor versions read it.
#pragma once
#include <cstring>
#include <string>

#include <pjrt_c_api.h>

namespace kiln::pjrt {

template <typename Args>
Args args_of(size_t struct_size) {
  Args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = struct_size;
  return a;
}
#define KILN_PJRT_ARGS(T) ::kiln::pjrt::args_of<T>(T##_STRUCT_SIZE)

// `mlir` (StableHLO text, which must outlive the result) as the program PJRT compiles.
inline PJRT_Program mlir_program(const std::string& mlir) {
  auto program = KILN_PJRT_ARGS(PJRT_Program);
  program.code = const_cast<char*>(mlir.data());
  program.code_size = mlir.size();
  static const char kFormat[] = "mlir";
  program.format = kFormat;
  program.format_size = 4;
  return program;
}

// Destroys an executable the plugin handed out (PJRT_LoadedExecutable_GetExecutable, PJRT_Compile)
// once what was asked of it has been read.
inline void destroy_executable(const PJRT_Api* api, PJRT_Executable* executable) {
  auto a = KILN_PJRT_ARGS(PJRT_Executable_Destroy_Args);
  a.executable = executable;
  api->PJRT_Executable_Destroy(&a);
}

}  // namespace kiln::pjrt
