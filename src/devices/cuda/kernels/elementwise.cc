// Elementwise ops on CUDA: each is a one-instruction fused program (graph/fused_program.h) run
// by the code the generator makes for it, so an op alone and the same op inside a fused chain
// compute one formula. Copies and integer casts are exact, without f32.
#include <limits>
#include <utility>

#include "core/error.h"
#include "devices/cuda/kernels/kernel_table.h"
#include "devices/cuda/launch.h"

namespace kiln::cuda {

namespace {

using Kind = FusedInstr::Kind;

// Loads of every input, then `last` reading them.
void run_program(const KernelArgs& args, FusedInstr last) {
  FusedProgram p;
  for (size_t k = 0; k < args.in.size(); ++k) p.instrs.push_back({.kind = Kind::load, .input = int(k)});
  if (last.kind != Kind::load) p.instrs.push_back(last);
  p.result = int(p.instrs.size()) - 1;
  launch_fused(p, args.in, args.out);
}

template <UnaryOp Op>
void unary_kernel(const KernelArgs& args) {
  run_program(args, {.kind = Kind::unary,
                     .unary = Op,
                     .lo = float(args.attrs->get_float("min", -std::numeric_limits<double>::infinity())),
                     .hi = float(args.attrs->get_float("max", std::numeric_limits<double>::infinity())),
                     .a = 0});
}

template <BinaryOp Op>
void binary_kernel(const KernelArgs& args) {
  run_program(args, {.kind = Kind::binary, .binary = Op, .a = 0, .b = 1});
}

void where_kernel(const KernelArgs& args) { run_program(args, {.kind = Kind::where, .a = 0, .b = 1, .c = 2}); }

// Float casts go through f32 as on the CPU (a float to an integer truncates toward zero, which
// the store's conversion does); integer to integer is exact.
void cast_kernel(const KernelArgs& args) {
  const TensorView &src = args.in[0], &dst = args.out;
  if (!is_floating(src.dtype) && !is_floating(dst.dtype)) {
    launch_generated(integer_cast_source(src.dtype, dst.dtype), args.in, args.out);
    return;
  }
  FusedInstr load;
  run_program(args, load);
}

void copy_kernel(const KernelArgs& args) {
  launch_generated(strided_copy_source(dtype_size(args.in[0].dtype)), args.in, args.out);
}

bool generated_code_loads(const std::vector<OperandMeta>& in) {
  for (const OperandMeta& m : in)
    if (!codegen_supports(m.dtype) || int(m.shape.size()) > kMaxRank) return false;
  return true;
}

bool copyable(const std::vector<OperandMeta>& in) {
  if (in.empty() || int(in[0].shape.size()) > kMaxRank || is_block_quantized(in[0].dtype)) return false;
  const size_t es = dtype_size(in[0].dtype);
  return es == 1 || es == 2 || es == 4 || es == 8;
}

template <int... Is>
void add_unary(KernelTable& t, std::integer_sequence<int, Is...>) {
  ((t[unary_name(UnaryOp(Is))] = {&unary_kernel<UnaryOp(Is)>, generated_code_loads}), ...);
}
template <int... Is>
void add_binary(KernelTable& t, std::integer_sequence<int, Is...>) {
  ((t[binary_name(BinaryOp(Is))] = {&binary_kernel<BinaryOp(Is)>, generated_code_loads}), ...);
}

}  // namespace

void add_elementwise_kernels(KernelTable& table) {
  add_unary(table, std::make_integer_sequence<int, int(UnaryOp::clamp) + 1>{});
  add_binary(table, std::make_integer_sequence<int, int(BinaryOp::ge) + 1>{});
  table["where"] = {&where_kernel, generated_code_loads};
  table["cast"] = {&cast_kernel, generated_code_loads};
  table["copy"] = {&copy_kernel, copyable};
}

}  // namespace kiln::cuda
