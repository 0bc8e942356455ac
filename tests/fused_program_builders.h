// Instructions of fused elementwise programs (graph/fused_program.h), for tests that build
// programs by hand: the CPU interpreter's (test_fused_elementwise.cc) and the CUDA code
// generator's (test_cuda_codegen.cc).
#pragma once
#include <limits>

#include "graph/fused_program.h"

namespace kiln::test {

inline constexpr float kInf = std::numeric_limits<float>::infinity();

inline FusedInstr load(int input) {
  FusedInstr i;
  i.kind = FusedInstr::Kind::load;
  i.input = input;
  return i;
}
inline FusedInstr unary(UnaryOp op, int a, float lo = -kInf, float hi = kInf) {
  FusedInstr i;
  i.kind = FusedInstr::Kind::unary;
  i.unary = op;
  i.a = a;
  i.lo = lo;
  i.hi = hi;
  return i;
}
inline FusedInstr binary(BinaryOp op, int a, int b) {
  FusedInstr i;
  i.kind = FusedInstr::Kind::binary;
  i.binary = op;
  i.a = a;
  i.b = b;
  return i;
}
inline FusedInstr pick(int cond, int x, int y) {
  FusedInstr i;
  i.kind = FusedInstr::Kind::where;
  i.a = cond;
  i.b = x;
  i.c = y;
  return i;
}
inline FusedInstr round_to(DType t, int a) {
  FusedInstr i;
  i.kind = FusedInstr::Kind::round;
  i.dtype = t;
  i.a = a;
  return i;
}

}  // namespace kiln::test
