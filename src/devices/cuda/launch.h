// What a CUDA kernel launch needs from the runtime: the device, its stream, its loaded generated
// kernels and its cuBLASLt handle. The CUDA runtime (cuda_runtime.cc) makes this current on the
// thread for each queue item it runs, so kernels (KernelFn: no device argument) launch there.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/tensor_view.h"
#include "devices/cuda/fused_codegen.h"

namespace kiln::cuda {

// Generated kernels (fused_codegen.h) compiled with NVRTC for one device and loaded once; the
// compiled code is cached on disk too (nvrtc.h). Thread-safe.
class KernelCache {
 public:
  explicit KernelCache(int arch) : arch_(arch) {}
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // Kernel `entry` (default: the source's name) of `kernel`'s source, compiled once per process.
  cudaKernel_t get(const KernelSource& kernel, const char* entry = nullptr);
  uint64_t compiled() const;    // kernels NVRTC compiled in this process
  uint64_t from_disk() const;   // kernels read from the disk cache

 private:
  int arch_;
  mutable std::mutex mu_;
  std::map<std::string, cudaLibrary_t> libraries_;  // by source name
  std::map<std::string, cudaKernel_t> kernels_;      // by source name and entry
  uint64_t compiled_ = 0, from_disk_ = 0;
};

// Host twin of the kernels' KilnDims (fused_codegen.h).
struct KilnDims {
  long long d[kMaxRank] = {};
};

struct LaunchContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  KernelCache* kernels = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // cuBLASLt's scratch, stream-ordered
  size_t workspace_bytes = 0;
};

// The context of the queue item running on this thread; throws outside one.
const LaunchContext& launch_context();

// Makes `context` current on this thread while alive.
class LaunchScope {
 public:
  explicit LaunchScope(const LaunchContext* context);
  ~LaunchScope();
  LaunchScope(const LaunchScope&) = delete;
  LaunchScope& operator=(const LaunchScope&) = delete;

 private:
  const LaunchContext* previous_;
};

// Runs a generated elementwise kernel over `out`'s elements (dense), each input read at its
// strides broadcast to out's shape (0 along broadcast dims).
void launch_generated(const KernelSource& kernel, const std::vector<TensorView>& inputs, const TensorView& out);

// Runs a fused elementwise program (graph/fused_program.h) over `out` with the kernel generated
// for it and these inputs' dtypes: what every elementwise launch on CUDA comes down to.
void launch_fused(const FusedProgram& program, const std::vector<TensorView>& inputs, const TensorView& out);

// Launches entry `entry` of the built-in kernels (builtin_kernels.h) with these arguments
// (pointers to each parameter's value), on `blocks` blocks of `threads` threads.
void launch_builtin(const char* entry, long long blocks, unsigned threads, size_t shared_bytes,
                    std::vector<void*> args);

// Blocks for a grid-stride loop over n elements at `threads` per block.
long long grid_for(long long n, unsigned threads);

}  // namespace kiln::cuda
