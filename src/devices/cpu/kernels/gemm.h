// Single-precision GEMM for the CPU device, backed by OpenBLAS or oneDNN.
//
// Both backends are multithreaded with OpenMP. Called from inside an `omp parallel`
// region they run single-threaded on the calling thread (both libraries check
// omp_in_parallel()), which is what the attention kernel relies on.
#pragma once
#include <cstdint>

#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

enum class GemmBackend { openblas, onednn };

// Backend used by kiln's matmul op, attention's GEMMs and f32 linears of 1024 rows and more
// (linear_gemm.h): oneDNN unless env KILN_GEMM=openblas|onednn says otherwise (read once, on
// first call; openblas also moves every multi-row f32 linear here). See gemm.cc for the
// measurements.
GemmBackend gemm_backend();

// Runs one tiny product on the backend in use so its library builds their global state (JIT kernels)
// now. The CPU runtime calls it before registering its exit drain, so at process exit the
// drain runs before those libraries tear their state down.
void gemm_warm_up();
const char* gemm_backend_name(GemmBackend b);

// Row-major: C[M,N] = alpha * op(A) * op(B) + beta * C, where op(X) = X^T when trans_x.
// lda/ldb/ldc are the row strides (in elements) of the matrices as stored, so A is
// stored [M,K] (or [K,M] when trans_a) and B is stored [K,N] (or [N,K] when trans_b,
// the layout of a PyTorch Linear weight). As in BLAS, beta == 0 overwrites C without
// reading it. Throws kiln::Error("[matmul] ...") on bad sizes or strides.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc);

// As sgemm(), with an explicit backend (benchmarks, tests).
void sgemm_with(GemmBackend backend, bool trans_a, bool trans_b, int64_t M, int64_t N,
                int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace kiln::cpu::KILN_CPU_LEVEL
