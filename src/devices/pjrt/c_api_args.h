// An argument struct of the PJRT C API, zeroed, with its struct_size set to the header's
// *_STRUCT_SIZE: how plugins of other API minor versions read it.
#pragma once
#include <cstring>

namespace kiln::pjrt {

template <typename Args>
Args args_of(size_t struct_size) {
  Args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = struct_size;
  return a;
}
#define KILN_PJRT_ARGS(T) ::kiln::pjrt::args_of<T>(T##_STRUCT_SIZE)

}  // namespace kiln::pjrt
