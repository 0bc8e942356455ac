// The f32 formulas of the elementwise ops over dense arrays (SIMD). Every kernel that
// evaluates an elementwise op — alone or, later, inside a fused group — calls these, so an
// element gets the same operations in the same order in every execution mode.
#pragma once
#include <cstdint>

#include "graph/elementwise.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

void unary_f32(UnaryOp op, const float* x, float* y, int64_t n, float lo, float hi);
void binary_f32(BinaryOp op, const float* a, const float* b, float* y, int64_t n);
void where_f32(const float* cond, const float* a, const float* b, float* y, int64_t n);

}  // namespace kiln::cpu::KILN_CPU_LEVEL
