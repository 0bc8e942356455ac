// The exponentials of a softmax whose probabilities are rounded to bf16 (attention with bf16 tile
// products), through exp2_vec.h: the scale joins the exponent's multiply-add rather than taking
// a pass of its own. Its relative error (~2e-7) is far below bf16's 2^-9, so the probabilities
// keep the exact exponentials' bf16 values but for rare ties at a rounding boundary.
#pragma once
#include <cstdint>

#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

// out[j] = bf16(2^t_j) with t_j = a·s[j] − b (one fused multiply-add), rounded to nearest with
// ties to even, for j < n; returns the sum of the 2^t_j before rounding, in f32. Exponents below
// −126 give 0 (every nonzero value is a normal number); a NaN exponent gives NaN; t_j must be at
// most 127. A softmax passes a = scale·log2(e) and b = max·scale·log2(e).
float exp2_sum_to_bf16(const float* s, int64_t n, float a, float b, uint16_t* out);

// The f32 value exp2_sum_to_bf16 takes for one exponent t, before rounding to bf16.
float exp2_narrow(float t);

}  // namespace kiln::cpu::KILN_CPU_LEVEL
