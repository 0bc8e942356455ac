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

}  // namespace kiln::pjrt
