// The GEMM of a linear layer, y[M,N] = x[M,K] · w[N,K]ᵀ (+ bias[N]), f32, through a oneDNN
// matmul primitive (on AVX-512 oneDNN picks its brgemm kernels), cached per shape. Every
// execution mode runs its linears of 2..kPrimitiveMaxRows-1 rows here (linear_runs_on_primitive),
// so they all get the same bits.
//
// The weight is read either as the caller's plain [N,K] rows, which the primitive packs into
// its blocked layout inside each call, or from a PackedLinearWeight made once ahead of time
// (compiled mode pre-packs the weights of its executables), which skips that packing. Both
// run the same kernel and give identical bits (tests/test_cpu_gemm_attention.cc).
//
// Why rows decide: at the row counts of a DiT step's text stream and small images dnnl_sgemm
// is far from peak, while from ~1k rows on it is as fast as the primitive reading plain
// weights, or faster. bench/bench_linear on the 2-core AMD EPYC (Zen 5, AVX-512) dev machine,
// GFLOP/s, K = N = 3072 (FLOP peak of the two cores: 408):
//   M       dnnl_sgemm   primitive, plain weights   primitive, pre-packed weights
//   256     229.5        362.9                      385.5
//   512     281.9        359.5                      377.2
//   768     356.8        367.3                      379.8
//   1024    359.4        357.2                      391.5
//   4608    350.1        335.5                      356.1
// and at K = 15360 (a single block's output projection) the primitive reading plain weights
// was 0.92-0.98x dnnl_sgemm from 768 rows on. So linears of 1024 rows and more stay on
// dnnl_sgemm (kernels/gemm.h) in every mode, unpacked.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace kiln::cpu {

constexpr int64_t kPrimitiveMaxRows = 1024;
// Whether a linear of `rows` rows runs here: more than one row (single rows run on the GEMV,
// gemv.h), fewer than kPrimitiveMaxRows, and the oneDNN backend (KILN_GEMM=openblas sends every
// multi-row linear to OpenBLAS). The linear kernel and compiled mode's packing both ask this.
bool linear_runs_on_primitive(int64_t rows);

// A linear weight [N,K] in the primitive's blocked layout. Immutable; shareable across threads.
class PackedLinearWeight;

// Whether a packed [N,K] weight gives linear_f32 the bits of the plain one: the primitive reading
// it packed must be the same implementation as the one reading it plain (on AVX-512 both are
// brgemm, which only copies the plain weight into that layout inside the call). False where
// oneDNN picks different kernels for the two (then nothing should be packed).
bool linear_packing_keeps_bits(int64_t N, int64_t K);
// Bytes of a packed [N,K] weight. The primitive's packed layout depends only on N and K (on this
// oneDNN, for every row count), so one packed copy serves every M; linear_f32 checks it anyway.
size_t packed_linear_weight_bytes(int64_t N, int64_t K);
// Packs w [N,K] (dense f32) into `storage` (packed_linear_weight_bytes(N, K) bytes, 64-byte
// aligned), which `owner` keeps alive for as long as the packed weight lives.
std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const float* w, int64_t N, int64_t K, void* storage,
                                                             std::shared_ptr<void> owner);
// As above, into host memory the packed weight owns (tests, benchmarks).
std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const float* w, int64_t N, int64_t K);

// y[M,N] = x[M,K] · w[N,K]ᵀ + bias. x, w dense row-major; bias [N] or nullptr; y dense [M,N],
// not overlapping the inputs. `packed`, when given, must hold w's values (it is used when its
// layout is the one this M's primitive reads and that primitive is the plain one's
// implementation, else w is read). Callable from any thread.
void linear_f32(const float* x, const float* w, const PackedLinearWeight* packed, const float* bias, float* y,
                int64_t M, int64_t N, int64_t K);

// How many linear_f32 calls read a packed weight, and how many packed w inside the call.
struct LinearGemmCounts {
  int64_t prepacked = 0, packed_in_call = 0;
};
LinearGemmCounts linear_gemm_counts();

// Builds one tiny primitive so oneDNN's global state exists before the CPU runtime registers
// its exit drain (see gemm_warm_up).
void linear_gemm_warm_up();

}  // namespace kiln::cpu
