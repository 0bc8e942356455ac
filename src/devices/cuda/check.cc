#include "devices/cuda/check.h"

#include "core/error.h"
#include "devices/cuda/libraries.h"

namespace kiln::cuda {

void fail_cuda(const char* call, cudaError_t e) {
  fail("cuda", call, " failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

void fail_cublas(const char* call, cublasStatus_t s) {
  fail("cublas", call, " failed: ", cublaslt().GetStatusName(s), ": ", cublaslt().GetStatusString(s));
}

void fail_nvrtc(const char* call, nvrtcResult r) { fail("nvrtc", call, " failed: ", nvrtc().GetErrorString(r)); }

}  // namespace kiln::cuda
