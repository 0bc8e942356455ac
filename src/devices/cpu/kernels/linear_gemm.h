// The GEMM of a linear layer, y[M,N] = x[M,K] · w[N,K]ᵀ (+ bias[N]), f32, through a oneDNN
// matmul primitive (brgemm), cached per shape. Every execution mode runs its multi-row linears
// here, so they all get the same bits.
//
// The weight is read either as the caller's plain [N,K] rows, which the primitive packs into
// its blocked layout inside each call, or from a PackedLinearWeight made once ahead of time
// (compiled mode pre-packs the weights of its executables), which skips that packing. Both
// run the same kernel and give identical bits (tests/test_cpu_gemm_attention.cc).
//
// Why not dnnl_sgemm: at the row counts of a DiT step it is much slower. Measured on the
// 2-core AMD EPYC (Zen 5, AVX-512) dev machine, GFLOP/s, K = N = 3072, B stored [N,K]:
//   M       dnnl_sgemm   matmul, plain weights   matmul, pre-packed weights
//   256     236.9        363.0                   396.4
//   512     285.5        362.7                   378.7
//   768     367.1        374.4                   389.2
//   4096    392.0        370.6                   396.9
// (FLOP peak of the two cores: 408.) See bench/bench_matmul for the full table.
#pragma once
#include <cstdint>
#include <memory>

namespace kiln::cpu {

// A linear weight [N,K] in the primitive's blocked layout. Immutable; shareable across threads.
class PackedLinearWeight;

// Bytes of a packed [N,K] weight. The primitive's packed layout depends only on N and K (on this
// oneDNN, for every row count), so one packed copy serves every M; linear_f32 checks it anyway.
size_t packed_linear_weight_bytes(int64_t N, int64_t K);
// Packs w [N,K] (dense f32) into `storage` (packed_linear_weight_bytes(N, K) bytes, 64-byte
// aligned), which `owner` keeps alive for as long as the packed weight lives.
std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const float* w, int64_t N, int64_t K, void* storage,
                                                             std::shared_ptr<void> owner);

// y[M,N] = x[M,K] · w[N,K]ᵀ + bias. x, w dense row-major; bias [N] or nullptr; y dense [M,N],
// not overlapping the inputs. `packed`, when given, must hold w's values (it is used when its
// layout is the one this M's primitive reads, else w is read). Callable from any thread.
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
