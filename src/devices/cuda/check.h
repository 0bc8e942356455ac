// Errors of the CUDA libraries as kiln errors naming the call.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>

namespace kiln::cuda {

[[noreturn]] void fail_cuda(const char* call, cudaError_t e);
[[noreturn]] void fail_cublas(const char* call, cublasStatus_t s);
[[noreturn]] void fail_nvrtc(const char* call, nvrtcResult r);

}  // namespace kiln::cuda

#define KILN_CUDA_CHECK(call)                                          \
  do {                                                                 \
    const cudaError_t kiln_cuda_e = (call);                            \
    if (kiln_cuda_e != cudaSuccess) ::kiln::cuda::fail_cuda(#call, kiln_cuda_e); \
  } while (0)

#define KILN_CUBLAS_CHECK(call)                                        \
  do {                                                                 \
    const cublasStatus_t kiln_cublas_s = (call);                       \
    if (kiln_cublas_s != CUBLAS_STATUS_SUCCESS) ::kiln::cuda::fail_cublas(#call, kiln_cublas_s); \
  } while (0)

#define KILN_NVRTC_CHECK(call)                                         \
  do {                                                                 \
    const nvrtcResult kiln_nvrtc_r = (call);                           \
    if (kiln_nvrtc_r != NVRTC_SUCCESS) ::kiln::cuda::fail_nvrtc(#call, kiln_nvrtc_r); \
  } while (0)
