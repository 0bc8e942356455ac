// Run-time compilation of generated CUDA C (devices/cuda/fused_codegen.h) with NVRTC, cached on
// disk like compiled executables (kernel_cache_dir()), so a kernel is compiled once
// per machine, not once per process. Needs no GPU: only the NVRTC library.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace kiln::cuda {

enum class CodeKind { ptx, cubin };

struct CompiledCode {
  std::vector<char> bytes;  // PTX text (NUL-terminated) or a CUBIN image
  bool from_cache = false;  // read from the disk cache rather than compiled now
};

// Compiles `source` for compute capability `arch` (90 = sm_90), or reads what an earlier compile
// of the same source, compiler and architecture left in folder `cache` (empty: no cache). Throws
// "[nvrtc] <kernel>: ..." with NVRTC's log when the source does not compile.
// Floating-point contraction is off (--fmad=false): a fused chain then rounds each op's result as
// the op alone does, so deferred and compiled mode give strict eager's bits on the GPU too.
CompiledCode nvrtc_compile(const std::string& name, const std::string& source, int arch, CodeKind kind,
                           const std::filesystem::path& cache);

// Where the CUDA device keeps compiled kernels: <kiln cache>/cuda (core/cache_dir.h), or none.
std::filesystem::path kernel_cache_dir();

// The NVRTC library's version, major * 1000 + minor * 10 (a cache key: another compiler, other code).
int nvrtc_version();

}  // namespace kiln::cuda
