#include "devices/cuda/launch.h"

#include <algorithm>

#include "core/error.h"
#include "devices/cuda/builtin_kernels.h"
#include "devices/cuda/check.h"
#include "devices/cuda/nvrtc.h"

namespace kiln::cuda {

namespace {

thread_local const LaunchContext* t_context = nullptr;
constexpr size_t kDefaultSharedBytes = 48 * 1024;  // dynamic shared memory a kernel gets without opting in
constexpr size_t kStaticSharedBytes = 1024;         // what the built-in kernels declare statically, at most

}  // namespace

KernelCache::~KernelCache() {
  for (auto& [name, library] : libraries_) cudaLibraryUnload(library);
}

cudaKernel_t KernelCache::get(const KernelSource& kernel, const char* entry) {
  const std::string name = entry ? entry : kernel.name;
  const std::string key = kernel.name + "/" + name;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = kernels_.find(key); it != kernels_.end()) return it->second;
  auto lib = libraries_.find(kernel.name);
  if (lib == libraries_.end()) {
    const CompiledCode code = nvrtc_compile(kernel.name, kernel.source, arch_, CodeKind::cubin, kernel_cache_dir());
    ++(code.from_cache ? from_disk_ : compiled_);
    cudaLibrary_t library = nullptr;
    KILN_CUDA_CHECK(cudaLibraryLoadData(&library, code.bytes.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    lib = libraries_.emplace(kernel.name, library).first;
  }
  cudaKernel_t k = nullptr;
  KILN_CUDA_CHECK(cudaLibraryGetKernel(&k, lib->second, name.c_str()));
  kernels_.emplace(key, k);
  return k;
}

uint64_t KernelCache::compiled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compiled_;
}
uint64_t KernelCache::from_disk() const {
  std::lock_guard<std::mutex> lock(mu_);
  return from_disk_;
}

const LaunchContext& launch_context() {
  KILN_CHECK(t_context != nullptr, "cuda", "a CUDA kernel ran outside the CUDA device's queue");
  return *t_context;
}

LaunchScope::LaunchScope(const LaunchContext* context) : previous_(t_context) { t_context = context; }
LaunchScope::~LaunchScope() { t_context = previous_; }

void launch_generated(const KernelSource& kernel, const std::vector<TensorView>& inputs, const TensorView& out) {
  const LaunchContext& ctx = launch_context();
  long long n = out.numel();
  if (n == 0) return;
  const int rank = int(out.shape.size());
  KILN_CHECK(rank <= kMaxRank, "cuda", kernel.name, ": output of rank ", rank, " (at most ", kMaxRank, ")");
  KilnDims shape;
  for (int d = 0; d < rank; ++d) shape.d[d] = out.shape[size_t(d)];
  std::vector<KilnDims> strides(inputs.size());
  std::vector<const void*> data(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const TensorView& v = inputs[k];
    const int lead = rank - int(v.shape.size());
    KILN_CHECK(lead >= 0, "cuda", kernel.name, ": input ", k, " has more dims than the output");
    for (int d = 0; d < int(v.shape.size()); ++d)
      strides[k].d[lead + d] = v.shape[size_t(d)] == 1 ? 0 : v.strides[size_t(d)];
    data[k] = v.data;
  }
  int r = rank;
  void* out_ptr = out.data;
  std::vector<void*> args{&n, &shape, &r, &out_ptr};
  for (size_t k = 0; k < inputs.size(); ++k) {
    args.push_back(&data[k]);
    args.push_back(&strides[k]);
  }
  constexpr unsigned kThreads = 256;
  const cudaKernel_t k = ctx.kernels->get(kernel);
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(unsigned(grid_for(n, kThreads))),
                                   dim3(kThreads), args.data(), 0, ctx.stream));
}

void launch_fused(const FusedProgram& program, const std::vector<TensorView>& inputs, const TensorView& out) {
  std::vector<DType> dtypes;
  dtypes.reserve(inputs.size());
  for (const TensorView& v : inputs) dtypes.push_back(v.dtype);
  launch_generated(fused_kernel_source(program, dtypes, out.dtype), inputs, out);
}

long long grid_for(long long n, unsigned threads) {
  return std::max<long long>(1, std::min<long long>((n + threads - 1) / threads, 1 << 20));
}

void launch_builtin(const char* entry, long long blocks, unsigned threads, size_t shared_bytes,
                    std::vector<void*> args) {
  if (blocks == 0) return;
  const LaunchContext& ctx = launch_context();
  KILN_CHECK(blocks <= 0x7fffffffLL, "cuda", entry, ": ", blocks, " blocks");
  const cudaKernel_t k = ctx.kernels->get(builtin_kernels(), entry);
  if (shared_bytes > kDefaultSharedBytes) {  // past the default, a kernel opts in, up to the device's limit
    int optin = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device));
    const size_t usable = size_t(optin) - std::min<size_t>(size_t(optin), kStaticSharedBytes);
    KILN_CHECK(shared_bytes <= usable, "cuda", entry, " needs ", shared_bytes, " bytes of shared memory; cuda:",
               ctx.device, " gives a block at most ", usable);
    KILN_CUDA_CHECK(cudaKernelSetAttributeForDevice(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes),
                                                    ctx.device));
  }
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(k), dim3(unsigned(blocks)), dim3(threads), args.data(),
                                   shared_bytes, ctx.stream));
}

}  // namespace kiln::cuda
