#include "devices/cpu/kernels/gemm.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "core/env.h"
#include "core/error.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {
namespace {

constexpr const char* kWhere = "matmul";

GemmBackend backend_from_env() {
  return env::choice("KILN_GEMM").value_or("onednn") == "openblas" ? GemmBackend::openblas : GemmBackend::onednn;
}

// Checks one stored operand: `rows` x `cols` with row stride `ld`.
void check_operand(const char* name, const void* p, int64_t rows, int64_t cols, int64_t ld) {
  KILN_CHECK(ld >= std::max<int64_t>(1, cols), kWhere, "sgemm: ld", name, " = ", ld,
             " is smaller than the ", cols, " columns of stored ", name);
  KILN_CHECK(p != nullptr || rows == 0 || cols == 0, kWhere, "sgemm: ", name, " is null");
}

void check_args(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                int64_t lda, const float* B, int64_t ldb, const float* C, int64_t ldc) {
  KILN_CHECK(M >= 0 && N >= 0 && K >= 0, kWhere, "sgemm: negative size M=", M, " N=", N,
             " K=", K);
  check_operand("A", A, trans_a ? K : M, trans_a ? M : K, lda);
  check_operand("B", B, trans_b ? N : K, trans_b ? K : N, ldb);
  check_operand("C", C, M, N, ldc);
}

// C = beta * C, for the cases where the product contributes nothing (K == 0 or
// alpha == 0). Done here so both backends agree, and beta == 0 clears NaNs in C.
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    float* row = C + i * ldc;
    if (beta == 0.0f) {
      std::fill(row, row + N, 0.0f);
    } else {
      for (int64_t j = 0; j < N; ++j) row[j] *= beta;
    }
  }
}

bool fits_blasint(int64_t v) { return v <= std::numeric_limits<blasint>::max(); }

void sgemm_openblas(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                    float* C, int64_t ldc) {
  // The Debian OpenBLAS build uses 32-bit integers for sizes and strides.
  KILN_CHECK(fits_blasint(M) && fits_blasint(N) && fits_blasint(K) && fits_blasint(lda) &&
                 fits_blasint(ldb) && fits_blasint(ldc),
             kWhere, "sgemm: sizes or strides exceed OpenBLAS's 32-bit range");
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
              static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
              static_cast<blasint>(ldc));
}

void sgemm_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                  float* C, int64_t ldc) {
  // dnnl_sgemm is row-major (unlike Fortran BLAS), so the arguments pass straight through.
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha,
                                      A, lda, B, ldb, beta, C, ldc);
  KILN_CHECK(st == dnnl_success, kWhere, "dnnl_sgemm failed with status ",
             static_cast<int>(st), " (M=", M, " N=", N, " K=", K, ")");
}

}  // namespace

// Default backend: oneDNN's dnnl_sgemm, about twice OpenBLAS's throughput on the DiT's linear
// shapes (docs/benchmarks.md, "Matmul, attention, single-row linears"; the measured table is in
// docs/benchmarks-history.md, "Matmul"). A oneDNN matmul primitive made ahead of time was no
// faster with B stored [N,K] and half as fast with B stored [K,N], so the oneDNN path is
// dnnl_sgemm, which needs no primitive cache.
GemmBackend gemm_backend() {
  static const GemmBackend backend = backend_from_env();
  return backend;
}

const char* gemm_backend_name(GemmBackend b) {
  switch (b) {
    case GemmBackend::openblas:
      return "openblas";
    case GemmBackend::onednn:
      return "onednn";
  }
  return "unknown";
}

void gemm_warm_up() {
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, c[4] = {};
  // Only the backend in use: OpenBLAS sets itself up (and registers its teardown) when the
  // library loads, so calling it here would only start its thread pool for nothing.
  sgemm(false, false, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc) {
  sgemm_with(gemm_backend(), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void sgemm_with(GemmBackend backend, bool trans_a, bool trans_b, int64_t M, int64_t N,
                int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                int64_t ldb, float beta, float* C, int64_t ldc) {
  check_args(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
  switch (backend) {
    case GemmBackend::openblas:
      sgemm_openblas(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    case GemmBackend::onednn:
      sgemm_onednn(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
  }
  fail(kWhere, "sgemm: unknown backend ", static_cast<int>(backend));
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
