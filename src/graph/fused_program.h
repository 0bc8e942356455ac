// The fused elementwise program of deferred-and-fused mode: one chain of
// elementwise ops as a straight-line program over registers, built by the fuser
// (graph/fusion.h), stored with compiled executables (exec/executable_store.h) and run by a
// device (DeviceRuntime::fused_elementwise: the CPU interprets it over cache-sized tiles; a
// device that generates code compiles it). The IR knows no device.
//
// Equality with strict eager is by construction: every op is the formula of graph/elementwise.h,
// and `round` instructions reproduce the store-then-load through an intermediate's storage dtype
// that eager performs between ops.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "graph/elementwise.h"

namespace kiln {

// One instruction of a fused elementwise program. Registers are values indexed by instruction
// number; every instruction writes its own register.
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

  // The registers it reads (-1 = none), in the order a kernel passes them, and how many.
  std::array<int, 3> operands() const;
  int arity() const;
};

struct FusedProgram {
  std::vector<FusedInstr> instrs;
  int result = -1;  // register stored (rounded into the output's dtype) to the output
  std::string describe() const;  // readable dump for errors/logs
  bool has_iota() const;         // whether some instruction is an index computation
};

// Validates a program (register indices in range and earlier, inputs in range, enum values
// known); throws kiln::Error "[fused] ...".
void validate_fused_program(const FusedProgram& program, size_t num_inputs);

// The instructions the result depends on (transitively), ascending: what a device evaluates
// (dead-code elimination, the same on every device).
std::vector<int> live_instructions(const FusedProgram& program);

}  // namespace kiln
