// Row-wise normalisation and softmax kernels over contiguous f32 data (Highway SIMD +
// OpenMP). All arithmetic is f32 and follows PyTorch's definitions. Results are
// deterministic: each row's (or group's) reduction order is fixed, so the output does
// not depend on the number of threads. Safe to call from any thread, concurrently.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

// y = (x - mean) / sqrt(var + eps) * w + b over each row of `cols` (biased variance).
// w, b may be nullptr (no scale / no shift). y may alias x. x and y are dense, f32 or a narrower
// float dtype: a narrow row is widened (exactly) into a per-thread f32 row, normalised in f32 and
// rounded once into y's row, so no whole-tensor f32 copy is made and the bits are those of the f32
// kernel on the widened values.
void layer_norm_rows(const void* x, DType x_type, const float* w, const float* b, void* y, DType y_type,
                     int64_t rows, int64_t cols, float eps);

// y = x * rsqrt(mean(x^2) + eps) * w over each row (w may be nullptr); y may alias x; dtypes as
// layer_norm_rows.
void rms_norm_rows(const void* x, DType x_type, const float* w, void* y, DType y_type, int64_t rows, int64_t cols,
                   float eps);

// How GroupNorm computes, by the activations' dtype.
//  - f32: a group's sum, then its squared deviations from the group's mean (two reads of the
//    group), and SiLU as the silu op computes it. f32 activations keep the bits they had.
//  - narrow (bf16 and other narrow activations, where memory time is GroupNorm's cost): each chunk
//    of the group (4096 values in NCHW order) summed, then its squared deviations from its own mean
//    summed while the chunk is still in cache, and the chunks' moments joined in order (Chan et
//    al.'s update, in double): one read of the group from memory, as accurate. SiLU takes
//    1 / (1 + exp(-x)) from a reciprocal estimate refined by one Newton step instead of a
//    division (within a few f32 ulp; the result is rounded to the narrow dtype).
enum class GroupNormMath { f32, narrow };
inline GroupNormMath group_norm_math_for(DType x) { return x == DType::f32 ? GroupNormMath::f32 : GroupNormMath::narrow; }

// GroupNorm on NCHW: x [N, C, HW]; each of `groups` groups of C/groups channels is
// normalised over its (C/groups)*HW values (biased variance), then per-channel w[c],
// b[c] (each nullable). C must be divisible by groups. y may alias x. `silu`: SiLU of the result
// (the same formula as the silu kernel, so silu(group_norm(x)) gets the same bits either way).
void group_norm_nchw(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t C,
                     int64_t HW, int64_t groups, float eps, bool silu = false,
                     GroupNormMath math = GroupNormMath::f32);
// The same on channels-last data: x [N, HW, C], f32 or bf16 (x and y each; computed in f32, a
// block of pixels at a time, so a bf16 tensor is never widened whole), with group_norm_math_for(x's
// dtype). The statistics are summed in group_norm_nchw's order, so both give the same bits
// whatever the thread count (a channels-last VAE decode equals the NCHW one). Vectorized across
// channels when HW is a multiple of 4096 (f32: of 64 and at least 4096); other HW copy one
// group at a time channel-major.
void group_norm_nhwc(const void* x, DType x_type, const float* w, const float* b, void* y, DType y_type, int64_t N,
                     int64_t HW, int64_t C, int64_t groups, float eps, bool silu = false);

// Softmax over each row, numerically stable (the row max is subtracted before exp).
// As in PyTorch, a row containing NaN, +inf, or only -inf yields NaN. y may alias x.
void softmax_rows(const float* x, float* y, int64_t rows, int64_t cols);

// Row reductions shared with the generic reduction kernels (SIMD, fixed order, so the
// result does not depend on the thread count). n > 0.
float row_sum(const float* x, int64_t n);
float row_max(const float* x, int64_t n);
// sum((x - mean)^2): the second pass of the two-pass variance.
float row_squared_deviation_sum(const float* x, int64_t n, float mean);

}  // namespace kiln::cpu::KILN_CPU_LEVEL
