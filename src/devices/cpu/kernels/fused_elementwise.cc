#include "devices/cpu/kernels/fused_elementwise.h"

#include <array>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "devices/cpu/kernels/elementwise_math.h"
#include "devices/cpu/kernels/tiles.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

namespace {

using Kind = FusedInstr::Kind;

// How the registers of a program map onto per-thread tile buffers. Computed once per call,
// before the tile loop, so every tile runs the same straight-line schedule.
struct Plan {
  std::vector<int> order;  // the instructions the result depends on, ascending
  std::vector<int> slot;   // per instruction: its tile buffer, or -1 (input view / output memory)
  int num_slots = 0;
  bool direct_out = false;   // the result is computed straight into the (f32) output's memory
  bool needs_bytes = false;  // some `round` goes through a non-f32 dtype and needs byte scratch
};

Plan make_plan(const FusedProgram& p, const TileGrid& grid, DType out_dtype) {
  const int n = int(p.instrs.size());
  Plan plan;
  plan.order = live_instructions(p);  // only what the result reads (transitively) is evaluated

  // Liveness: a register's buffer returns to the pool after its last reader has run. The
  // result stays live to the end, as it is stored after the schedule.
  std::vector<int> last_use(size_t(n), -1);
  for (int i : plan.order)
    for (int r : p.instrs[size_t(i)].operands())
      if (r >= 0) last_use[size_t(r)] = i;
  last_use[size_t(p.result)] = n;

  const Kind result_kind = p.instrs[size_t(p.result)].kind;
  plan.direct_out = out_dtype == DType::f32 && result_kind != Kind::load;
  plan.slot.assign(size_t(n), -1);
  std::vector<int> free_slots;
  for (int i : plan.order) {
    const FusedInstr& in = p.instrs[size_t(i)];
    if (in.kind == Kind::round && in.dtype != DType::f32) plan.needs_bytes = true;
    const bool view = in.kind == Kind::load && grid.load_is_view(size_t(in.input));
    if (!view && !(i == p.result && plan.direct_out)) {
      if (free_slots.empty()) {
        plan.slot[size_t(i)] = plan.num_slots++;
      } else {
        plan.slot[size_t(i)] = free_slots.back();
        free_slots.pop_back();
      }
    }
    // Operands are released only after the destination was taken, so an instruction never
    // writes into a buffer it reads: no formula has to be safe in place.
    const std::array<int, 3> ops = in.operands();
    for (size_t k = 0; k < ops.size(); ++k) {
      const int r = ops[k];
      const bool repeated = (k >= 1 && ops[0] == r) || (k == 2 && ops[1] == r);
      if (r >= 0 && !repeated && last_use[size_t(r)] == i && plan.slot[size_t(r)] >= 0)
        free_slots.push_back(plan.slot[size_t(r)]);
    }
  }
  return plan;
}

// Store-then-load through `t`: the value an eager op's output of dtype `t` has when the next op
// reads it. It uses the very conversions eager stores and loads with (for an integer `t`,
// C++'s float -> int conversion truncates toward zero, which is what the cast kernel's
// trunc-then-store yields too).
void round_through(DType t, const float* x, float* y, int64_t n, void* bytes) {
  if (t == DType::f32) {
    std::memcpy(y, x, size_t(n) * sizeof(float));
    return;
  }
  convert_from_f32(x, bytes, t, n);
  convert_to_f32(bytes, t, y, n);
}

void check_shapes(const std::vector<TensorView>& inputs, const TensorView& out) {
  KILN_CHECK(out.strides.size() == out.shape.size(), "fused", "output has ", out.strides.size(),
             " strides for shape ", to_string(out.shape));
  // The tile driver writes the output as dense; size-1 dims may carry any stride.
  const Strides dense = contiguous_strides(out.shape);
  for (size_t d = 0; d < out.shape.size(); ++d)
    KILN_CHECK(out.shape[d] == 1 || out.strides[d] == dense[d], "fused", "output of shape ", to_string(out.shape),
               " is not dense (strides ", to_string(out.strides), ")");
  for (size_t k = 0; k < inputs.size(); ++k) {
    const TensorView& v = inputs[k];
    KILN_CHECK(v.strides.size() == v.shape.size(), "fused", "input ", k, " has ", v.strides.size(),
               " strides for shape ", to_string(v.shape));
    KILN_CHECK(broadcasts_to(v.shape, out.shape), "fused", "input ", k, " of shape ", to_string(v.shape), " does not broadcast to the output shape ",
               to_string(out.shape));
  }
}

}  // namespace

void fused_elementwise(const FusedProgram& program, const std::vector<TensorView>& inputs, const TensorView& out) {
  validate_fused_program(program, inputs.size());
  // Each iota is one more operand of the tile grid: a dense [count] vector, broadcast like an
  // input, whose values come from the offsets the grid computes for it.
  std::vector<TensorView> operands = inputs;
  std::vector<size_t> iota_operand(program.instrs.size(), 0);
  static const float kNeverRead = 0;
  for (size_t i = 0; i < program.instrs.size(); ++i) {
    const FusedInstr& in = program.instrs[i];
    if (in.kind != Kind::iota) continue;
    iota_operand[i] = operands.size();
    TensorView v;
    v.data = const_cast<float*>(&kNeverRead);
    v.dtype = DType::f32;
    v.shape = {in.count};
    v.strides = {1};
    operands.push_back(v);
  }
  check_shapes(operands, out);
  TileGrid grid(operands, out);
  for (size_t i = 0; i < program.instrs.size(); ++i)
    if (program.instrs[i].kind == Kind::iota)
      grid.set_iota(iota_operand[i], program.instrs[i].start, program.instrs[i].step);
  const Plan plan = make_plan(program, grid, out.dtype);
  const size_t n_regs = program.instrs.size();
  const int result = program.result;

  struct Scratch {
    std::vector<float> bufs;         // plan.num_slots tiles
    std::vector<const float*> regs;  // per instruction: where its tile of values is
    std::vector<int64_t> bytes;      // one tile in the widest storage dtype, for `round`
  };
  for_each_tile(
      grid,
      [&] {
        return Scratch{std::vector<float>(size_t(plan.num_slots) * size_t(kTile)), std::vector<const float*>(n_regs),
                       std::vector<int64_t>(plan.needs_bytes ? size_t(kTile) : 0)};
      },
      [&](Scratch& s, const Tile& tile) {
        const int64_t n = tile.n;
        for (const int i : plan.order) {
          const FusedInstr& in = program.instrs[size_t(i)];
          const int slot = plan.slot[size_t(i)];
          float* dst = i == result && plan.direct_out ? grid.out_f32(tile)
                       : slot >= 0                    ? s.bufs.data() + size_t(slot) * size_t(kTile)
                                                      : nullptr;  // a view load: load_tile leaves buf alone
          switch (in.kind) {
            case Kind::load: s.regs[size_t(i)] = grid.load(size_t(in.input), tile, dst); continue;
            case Kind::iota: s.regs[size_t(i)] = grid.load(iota_operand[size_t(i)], tile, dst); continue;
            case Kind::unary: unary_f32(in.unary, s.regs[size_t(in.a)], dst, n, in.lo, in.hi); break;
            case Kind::binary: binary_f32(in.binary, s.regs[size_t(in.a)], s.regs[size_t(in.b)], dst, n); break;
            case Kind::where:
              where_f32(s.regs[size_t(in.a)], s.regs[size_t(in.b)], s.regs[size_t(in.c)], dst, n);
              break;
            case Kind::round: round_through(in.dtype, s.regs[size_t(in.a)], dst, n, s.bytes.data()); break;
          }
          s.regs[size_t(i)] = dst;
        }
        if (!plan.direct_out) grid.store(tile, s.regs[size_t(result)]);
      });
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
