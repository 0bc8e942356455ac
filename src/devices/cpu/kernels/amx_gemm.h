// kiln's own bf16 GEMM on Intel AMX tiles, for linear layers: y[M,N] = x[M,K] · w[N,K]ᵀ (+ bias),
// x and w bf16 as stored, their products summed in f32 by TDPBF16PS, the bias added in f32 and y
// rounded once into its dtype.
//
// Why it exists: at a DiT's shapes oneDNN's AMX matmul (the version Debian ships) keeps the tile
// units well below their rate, because its operands stream from L3 rather than L2. Here the
// weight is packed into the tiles' layout (pairs of k for 16 columns) one chunk at a time — 128
// columns by at most 3072 k, 768 KiB — into a per-thread buffer that stays in L2 while every
// 32-row block of x runs against it; x is packed once per call into contiguous 1 KiB tiles, and
// the next row block is prefetched into L2 while the current one computes. bench/bench_linear
// times it against the oneDNN primitive on FLUX.1's shapes.
//
// No packed copy of a weight outlives a call, so nothing is pre-packed, no weight is held twice,
// and every execution mode runs the same code. Each output is summed in one fixed order (K split
// into equal chunks of at most 3072, 32 k per tile product), which depends on K alone: the bits
// do not depend on the thread count or on how the threads split the work.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

// Whether this process runs the kernel: kiln was compiled with AMX intrinsics (x86-64 GCC 11 or
// later), the CPU has AMX-BF16 and AVX-512, and Linux grants the process the tile state
// (arch_prctl ARCH_REQ_XCOMP_PERM). Decided on first use, then fixed.
bool amx_bf16_usable();

// y = x · wᵀ + bias: x [M,K] and w [N,K] dense bf16 at any alignment, bias [N] (f32 or bf16) or
// nullptr, y dense [M,N] f32 or bf16, not overlapping the inputs. Any M, N, K >= 1 (tails are
// zero-padded inside the packed tiles). Only where amx_bf16_usable(). Runs on the OpenMP threads.
void amx_linear_bf16(const void* x, const void* w, const void* bias, DType bias_type, void* y, DType y_type, int64_t M,
                     int64_t N, int64_t K);

}  // namespace kiln::cpu::KILN_CPU_LEVEL
