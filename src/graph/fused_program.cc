#include "graph/fused_program.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace kiln {

namespace {

using Kind = FusedInstr::Kind;

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::load: return "load";
    case Kind::unary: return "unary";
    case Kind::binary: return "binary";
    case Kind::where: return "where";
    case Kind::round: return "round";
    case Kind::iota: return "iota";
  }
  return "?";
}

std::string describe_instr(const FusedInstr& in) {
  std::ostringstream os;
  switch (in.kind) {
    case Kind::load: os << "load in" << in.input; break;
    case Kind::iota: os << "iota " << in.start << " + i * " << in.step << " [" << in.count << "]"; break;
    case Kind::unary:
      os << (int(in.unary) >= 0 && in.unary <= UnaryOp::clamp ? unary_name(in.unary) : "unary?") << " %" << in.a;
      if (in.unary == UnaryOp::clamp) os << " [" << in.lo << ", " << in.hi << "]";
      break;
    case Kind::binary:
      os << (int(in.binary) >= 0 && in.binary <= BinaryOp::ge ? binary_name(in.binary) : "binary?") << " %" << in.a
         << ", %" << in.b;
      break;
    case Kind::where: os << "where %" << in.a << " ? %" << in.b << " : %" << in.c; break;
    case Kind::round:
      os << "round."
         << (in.dtype <= DType::boolean ? dtype_name(in.dtype) : "?") << " %" << in.a;
      break;
    default: os << "kind?" << int(in.kind); break;
  }
  return os.str();
}

}  // namespace

std::array<int, 3> FusedInstr::operands() const {
  switch (kind) {
    case Kind::load:
    case Kind::iota: return {-1, -1, -1};
    case Kind::unary:
    case Kind::round: return {a, -1, -1};
    case Kind::binary: return {a, b, -1};
    case Kind::where: return {a, b, c};
  }
  return {-1, -1, -1};
}

int FusedInstr::arity() const {
  return kind == Kind::load || kind == Kind::iota ? 0 : kind == Kind::binary ? 2 : kind == Kind::where ? 3 : 1;
}

std::string FusedProgram::describe() const {
  std::ostringstream os;
  os << "fused program (" << instrs.size() << " instrs, result %" << result << ")";
  for (size_t i = 0; i < instrs.size(); ++i) os << "\n  %" << i << " = " << describe_instr(instrs[i]);
  return os.str();
}

bool FusedProgram::has_iota() const {
  for (const FusedInstr& in : instrs)
    if (in.kind == Kind::iota) return true;
  return false;
}

void validate_fused_program(const FusedProgram& program, size_t num_inputs) {
  const auto& ins = program.instrs;
  KILN_CHECK(!ins.empty(), "fused", "empty program");
  for (size_t i = 0; i < ins.size(); ++i) {
    const FusedInstr& in = ins[i];
    const int kind = int(in.kind);
    KILN_CHECK(kind >= int(Kind::load) && kind <= int(Kind::iota), "fused", "instr %", i, " has unknown kind ", kind,
               "\n", Lines{program.describe()});
    if (in.kind == Kind::load)
      KILN_CHECK(in.input >= 0 && size_t(in.input) < num_inputs, "fused", "instr %", i, " loads input ", in.input,
                 " but the kernel has ", num_inputs, " inputs\n", Lines{program.describe()});
    if (in.kind == Kind::iota)
      KILN_CHECK(in.count >= 0 && std::isfinite(in.start) && std::isfinite(in.step), "fused", "instr %", i,
                 " is an iota of ", in.count, " elements from ", in.start, " by ", in.step, "\n",
                 Lines{program.describe()});
    if (in.kind == Kind::unary)
      KILN_CHECK(int(in.unary) >= 0 && in.unary <= UnaryOp::clamp, "fused", "instr %", i, " has unknown unary op ",
                 int(in.unary), "\n", Lines{program.describe()});
    if (in.kind == Kind::binary)
      KILN_CHECK(int(in.binary) >= 0 && in.binary <= BinaryOp::ge, "fused", "instr %", i, " has unknown binary op ",
                 int(in.binary), "\n", Lines{program.describe()});
    if (in.kind == Kind::round)
      KILN_CHECK(in.dtype <= DType::boolean, "fused", "instr %", i, " rounds to unknown dtype ",
                 int(in.dtype), "\n", Lines{program.describe()});
    const std::array<int, 3> ops = in.operands();
    for (int k = 0; k < in.arity(); ++k) {
      const int r = ops[size_t(k)];
      // Registers must be written before they are read: a program is a straight-line schedule.
      KILN_CHECK(r >= 0 && size_t(r) < i, "fused", "instr %", i, " (", kind_name(in.kind), ") reads register ", r,
                 ", which is not an earlier instruction\n", Lines{program.describe()});
    }
  }
  KILN_CHECK(program.result >= 0 && size_t(program.result) < ins.size(), "fused", "result register ", program.result,
             " is not an instruction of the program (", ins.size(), " instrs)\n", Lines{program.describe()});
}

std::vector<int> live_instructions(const FusedProgram& program) {
  std::vector<char> needed(program.instrs.size(), 0);
  if (program.result < 0) return {};
  needed[size_t(program.result)] = 1;
  for (int i = program.result; i >= 0; --i)
    if (needed[size_t(i)])
      for (int r : program.instrs[size_t(i)].operands())
        if (r >= 0) needed[size_t(r)] = 1;
  std::vector<int> order;
  for (int i = 0; i <= program.result; ++i)
    if (needed[size_t(i)]) order.push_back(i);
  return order;
}

}  // namespace kiln
