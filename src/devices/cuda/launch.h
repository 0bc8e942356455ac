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

  cudaKernel_t get(const KernelSource& kernel);
  uint64_t compiled() const;    // kernels NVRTC compiled in this process
  uint64_t from_disk() const;   // kernels read from the disk cache

 private:
  int arch_;
  mutable std::mutex mu_;
  std::map<std::string, std::pair<cudaLibrary_t, cudaKernel_t>> loaded_;
  uint64_t compiled_ = 0, from_disk_ = 0;
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

}  // namespace kiln::cuda
