// The fused elementwise kernel of deferred-and-fused mode (runtime.md §2.3.5): a chain of
// elementwise ops evaluated in ONE pass over cache-sized tiles of the output, with every
// intermediate held in per-thread f32 tiles instead of device memory.
//
// Equality with strict eager is by construction: the kernel uses the eager tile driver
// (tiles.h) to load inputs and store the output, the same f32 formulas (elementwise_math.h)
// for every op, and `round` instructions to reproduce the store-then-load through an
// intermediate's storage dtype that eager performs between ops. A program that mirrors an
// eager op chain (one `round` after each op whose eager output dtype is not f32) therefore
// gives bit-identical results.
#pragma once
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor_view.h"
#include "graph/elementwise.h"

namespace kiln::cpu {

// One instruction of a fused elementwise program. Registers are tiles of f32 values indexed by
// instruction number; every instruction writes its own register.
struct FusedInstr {
  enum class Kind { load, unary, binary, where, round, iota };
  Kind kind = Kind::load;
  int input = -1;  // load: index of the kernel input to read (broadcast to the output shape)
  // iota (a fused arange): element i of a [count] vector broadcast to the output shape is
  // float(start + i * step), exactly the f32 the arange kernel stores.
  double start = 0, step = 1;
  int64_t count = 0;
  UnaryOp unary{};
  float lo = -std::numeric_limits<float>::infinity();  // unary: clamp bounds (eager: float(attr))
  float hi = std::numeric_limits<float>::infinity();
  BinaryOp binary{};
  int a = -1, b = -1, c = -1;  // operand registers: unary a; binary a,b; where cond=a, x=b, y=c; round a
  // round: store-then-load through this dtype, i.e. exactly what eager does when an intermediate
  // op's output dtype is bf16/f16/int/bool (float -> int truncates toward zero, as the cast kernel).
  DType dtype = DType::f32;
};

struct FusedProgram {
  std::vector<FusedInstr> instrs;
  int result = -1;  // register stored (rounded into the output's dtype) to the output
  std::string describe() const;  // readable dump for errors/logs
  bool has_iota() const;         // whether some instruction is an index computation
};

// Evaluates `program` over the output's index space in tiles (the same tile driver as eager),
// reading each input through its strides broadcast to the output shape, never materialising
// intermediates in memory. `out` must be dense and must not overlap any input. Instructions
// the result does not depend on are skipped. Throws "[fused] ..." for an invalid program,
// an input that does not broadcast to the output shape, or a non-dense output.
void fused_elementwise(const FusedProgram& program, const std::vector<TensorView>& inputs, const TensorView& out);

// Validates a program (register indices in range and earlier, inputs in range, enum values
// known); throws kiln::Error "[fused] ...".
void validate(const FusedProgram& program, size_t num_inputs);

}  // namespace kiln::cpu
