#include "devices/cuda/libraries.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace kiln::cuda {

namespace {

// The toolkit's major version names the libraries' sonames (libnvrtc.so.13).
void* open_library(const char* stem) {
  const std::string file = std::string(stem) + ".so." + KILN_CUDA_MAJOR;
  if (void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string first_error = dlerror();
  const std::string in_toolkit = std::string(KILN_CUDA_LIBRARY_DIR) + "/" + file;
  if (void* h = dlopen(in_toolkit.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  fail("cuda", "cannot load ", file, " (the CUDA toolkit's, needed by the CUDA device): ", first_error);
}

template <typename F>
void bind(void* lib, F& f, const char* symbol, const char* file) {
  f = reinterpret_cast<F>(dlsym(lib, symbol));
  KILN_CHECK(f != nullptr, "cuda", file, " has no ", symbol);
}

}  // namespace

const NvrtcLibrary& nvrtc() {
  static const NvrtcLibrary lib = [] {
    void* h = open_library("libnvrtc");
    NvrtcLibrary l{};
#define KILN_BIND(name) bind(h, l.name, "nvrtc" #name, "libnvrtc")
    KILN_BIND(Version);
    KILN_BIND(GetErrorString);
    KILN_BIND(CreateProgram);
    KILN_BIND(DestroyProgram);
    KILN_BIND(CompileProgram);
    KILN_BIND(GetProgramLogSize);
    KILN_BIND(GetProgramLog);
    KILN_BIND(GetPTXSize);
    KILN_BIND(GetPTX);
    KILN_BIND(GetCUBINSize);
    KILN_BIND(GetCUBIN);
#undef KILN_BIND
    return l;
  }();
  return lib;
}

const CublasLtLibrary& cublaslt() {
  static const CublasLtLibrary lib = [] {
    void* h = open_library("libcublasLt");
    CublasLtLibrary l{};
#define KILN_BIND(name) bind(h, l.name, "cublasLt" #name, "libcublasLt")
    KILN_BIND(Create);
    KILN_BIND(GetStatusName);
    KILN_BIND(GetStatusString);
    KILN_BIND(Matmul);
    KILN_BIND(MatmulAlgoGetHeuristic);
    KILN_BIND(MatmulDescCreate);
    KILN_BIND(MatmulDescDestroy);
    KILN_BIND(MatmulDescSetAttribute);
    KILN_BIND(MatrixLayoutCreate);
    KILN_BIND(MatrixLayoutDestroy);
    KILN_BIND(MatrixLayoutSetAttribute);
    KILN_BIND(MatmulPreferenceCreate);
    KILN_BIND(MatmulPreferenceDestroy);
    KILN_BIND(MatmulPreferenceSetAttribute);
#undef KILN_BIND
    return l;
  }();
  return lib;
}

}  // namespace kiln::cuda
