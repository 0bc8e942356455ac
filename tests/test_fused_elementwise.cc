// The fused elementwise kernel against strict eager: every program here mirrors an op chain
// that is also run through the public op API, and the two results must be equal byte for byte
// (deferred-and-fused mode may not change a single bit of any result).
#include <cstring>
#include <limits>
#include <optional>

#include "devices/cpu/kernels/fused_elementwise.h"
#include "devices/runtime.h"
#include "exec/ops.h"
#include "fused_program_builders.h"
#include "test_util.h"

namespace kiln {
namespace {

using Kind = FusedInstr::Kind;
using test::binary;
using test::kInf;
using test::load;
using test::pick;
using test::round_to;
using test::unary;

Tensor eager_unary(UnaryOp op, const Tensor& x) {
  switch (op) {
    case UnaryOp::neg: return neg(x);
    case UnaryOp::abs: return abs(x);
    case UnaryOp::exp: return exp(x);
    case UnaryOp::log: return log(x);
    case UnaryOp::sqrt: return sqrt(x);
    case UnaryOp::rsqrt: return rsqrt(x);
    case UnaryOp::tanh: return tanh(x);
    case UnaryOp::sin: return sin(x);
    case UnaryOp::cos: return cos(x);
    case UnaryOp::sigmoid: return sigmoid(x);
    case UnaryOp::relu: return relu(x);
    case UnaryOp::silu: return silu(x);
    case UnaryOp::gelu: return gelu(x);
    case UnaryOp::gelu_tanh: return gelu(x, "tanh");
    case UnaryOp::quick_gelu: return quick_gelu(x);
    case UnaryOp::clamp: return clamp(x, std::nullopt, std::nullopt);
  }
  return Tensor();
}

Tensor eager_binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case BinaryOp::add: return add(a, b);
    case BinaryOp::sub: return sub(a, b);
    case BinaryOp::mul: return mul(a, b);
    case BinaryOp::div: return div(a, b);
    case BinaryOp::pow: return pow(a, b);
    case BinaryOp::maximum: return maximum(a, b);
    case BinaryOp::minimum: return minimum(a, b);
    case BinaryOp::eq: return eq(a, b);
    case BinaryOp::ne: return ne(a, b);
    case BinaryOp::lt: return lt(a, b);
    case BinaryOp::le: return le(a, b);
    case BinaryOp::gt: return gt(a, b);
    case BinaryOp::ge: return ge(a, b);
  }
  return Tensor();
}

std::vector<TensorView> views_of(const std::vector<Tensor>& ts) {
  std::vector<TensorView> v;
  for (const Tensor& t : ts) v.push_back(TensorView::of(t));
  return v;
}

// Runs the fused kernel directly (as the deferred executor will) into a fresh dense tensor.
Tensor run_fused(const FusedProgram& p, const std::vector<Tensor>& inputs, const Shape& shape, DType dtype) {
  for (const Tensor& t : inputs) wait(t);
  // A sentinel fill, so an element the kernel failed to write is unlikely to pass for eager's.
  Tensor out = full(shape, 7, dtype);
  wait(out);
  cpu::fused_elementwise(p, views_of(inputs), TensorView::of(out));
  return out;
}

void expect_same_bytes(const Tensor& fused, const Tensor& eager, const std::string& what) {
  wait(eager);
  ASSERT_EQ(fused.shape(), eager.shape()) << what;
  ASSERT_EQ(fused.dtype(), eager.dtype()) << what;
  ASSERT_TRUE(eager.is_contiguous()) << what;
  const size_t es = dtype_size(eager.dtype());
  const auto* f = static_cast<const char*>(fused.data_ptr());
  const auto* e = static_cast<const char*>(eager.data_ptr());
  for (int64_t i = 0; i < eager.numel(); ++i) {
    if (std::memcmp(f + size_t(i) * es, e + size_t(i) * es, es) != 0) {
      ADD_FAILURE() << what << ": element " << i << " of " << eager.numel() << " differs: fused "
                    << to_vector(fused)[size_t(i)] << " vs eager " << to_vector(eager)[size_t(i)];
      return;
    }
  }
}

// Runs an op chain in strict eager mode through the public op API and records, op for op, the
// fused program that mirrors it: each op becomes its instruction, followed by a `round` to the
// eager output's dtype whenever that is not f32 (eager stores the intermediate in that dtype and
// the next op loads it back).
class Mirror {
 public:
  struct V {
    Tensor t;
    int reg;
  };

  V input(const Tensor& t) {
    inputs_.push_back(t);
    return {t, emit(load(int(inputs_.size()) - 1))};
  }
  V unary(UnaryOp op, const V& x) { return settle(eager_unary(op, x.t), emit(kiln::unary(op, x.reg))); }
  V clamp(const V& x, std::optional<double> lo, std::optional<double> hi) {
    // Eager reads the bounds as doubles and narrows them to float, as done here.
    return settle(kiln::clamp(x.t, lo, hi),
                  emit(test::unary(UnaryOp::clamp, x.reg, lo ? float(*lo) : -kInf, hi ? float(*hi) : kInf)));
  }
  V binary(BinaryOp op, const V& a, const V& b) {
    return settle(eager_binary(op, a.t, b.t), emit(kiln::binary(op, a.reg, b.reg)));
  }
  V where(const V& c, const V& x, const V& y) {
    return settle(kiln::where(c.t, x.t, y.t), emit(pick(c.reg, x.reg, y.reg)));
  }
  V cast(const V& x, DType t) { return settle(kiln::cast(x.t, t), x.reg); }

  // The program computing `result` (later instructions are left in: the kernel must skip them).
  FusedProgram program(const V& result) const {
    FusedProgram p = prog_;
    p.result = result.reg;
    return p;
  }
  const std::vector<Tensor>& inputs() const { return inputs_; }

  void expect_identical(const V& result, const std::string& what) const {
    const FusedProgram p = program(result);
    SCOPED_TRACE(p.describe());
    expect_same_bytes(run_fused(p, inputs_, result.t.shape(), result.t.dtype()), result.t, what);
  }

 private:
  int emit(const FusedInstr& in) {
    prog_.instrs.push_back(in);
    return int(prog_.instrs.size()) - 1;
  }
  V settle(const Tensor& t, int reg) {
    if (t.dtype() != DType::f32) reg = emit(round_to(t.dtype(), reg));
    return {t, reg};
  }

  FusedProgram prog_;
  std::vector<Tensor> inputs_;
};

// A 20+-op chain of the activations and modulations of the target models, with 0-d operands
// (lifted host scalars) on both sides, repeated reads of the inputs and a register read twice.
Mirror::V long_chain(Mirror& m, const Shape& shape, DType t) {
  using U = UnaryOp;
  using B = BinaryOp;
  const auto x = m.input(test::random_tensor(shape, 1, t));
  const auto y = m.input(test::random_tensor(shape, 2, t));
  const auto s1 = m.input(scalar(0.75, t)), s2 = m.input(scalar(1.25, t));
  const auto s3 = m.input(scalar(-0.5, t)), s4 = m.input(scalar(0.1, t));
  auto v = m.binary(B::mul, x, s1);
  v = m.binary(B::add, v, s2);
  v = m.unary(U::tanh, v);
  v = m.binary(B::sub, v, y);
  v = m.unary(U::silu, v);
  v = m.binary(B::mul, v, x);
  v = m.unary(U::gelu_tanh, v);
  v = m.binary(B::mul, v, s3);
  v = m.unary(U::exp, v);
  v = m.binary(B::add, v, s4);
  v = m.binary(B::mul, v, y);
  v = m.unary(U::tanh, v);
  v = m.binary(B::sub, s2, v);  // scalar on the left
  v = m.unary(U::silu, v);
  v = m.binary(B::add, v, x);
  v = m.unary(U::gelu_tanh, v);
  v = m.binary(B::mul, v, v);  // one register as both operands
  v = m.binary(B::sub, v, s1);
  v = m.unary(U::tanh, v);
  v = m.unary(U::exp, v);
  v = m.binary(B::div, v, s2);
  v = m.unary(U::sigmoid, v);
  v = m.binary(B::mul, v, x);
  return v;
}

TEST(FusedElementwise, LongChainF32WithScalarOperands) {
  Mirror m;
  const auto r = long_chain(m, {64, 3000}, DType::f32);  // large enough for the parallel path
  m.expect_identical(r, "f32 chain [64,3000]");
}

TEST(FusedElementwise, LongChainBf16AndF16RoundAfterEveryOp) {
  for (DType t : {DType::bf16, DType::f16}) {
    Mirror m;
    const auto r = long_chain(m, {64, 3000}, t);
    // Every op's eager output is t, so the program interleaves ops and rounds.
    int rounds = 0;
    for (const auto& in : m.program(r).instrs) rounds += in.kind == Kind::round;
    EXPECT_EQ(rounds, 23);
    m.expect_identical(r, std::string(dtype_name(t)) + " chain");
  }
}

TEST(FusedElementwise, VeryLongChainReusesBuffers) {
  // 300 ops over two inputs: liveness must recycle tiles without ever clobbering a live value.
  Mirror m;
  const auto x = m.input(test::random_tensor({8, 1000}, 3));
  const auto w = m.input(test::random_tensor({1000}, 4, DType::bf16));
  auto v = x;
  for (int i = 0; i < 100; ++i) {
    const auto u = m.unary(i % 2 ? UnaryOp::tanh : UnaryOp::silu, v);
    v = m.binary(i % 3 ? BinaryOp::add : BinaryOp::sub, u, i % 2 ? w : x);
    v = m.binary(BinaryOp::mul, v, u);
  }
  m.expect_identical(v, "300-op chain");
}

TEST(FusedElementwise, MixedDtypes) {
  using B = BinaryOp;
  Mirror m;
  const auto x = m.input(test::random_tensor({40, 130}, 5));
  const auto w = m.input(test::random_tensor({40, 130}, 6, DType::bf16));
  const auto h = m.input(test::random_tensor({130}, 7, DType::f16));
  const auto sb = m.input(scalar(0.3, DType::bf16));
  auto v = m.binary(B::mul, x, w);  // f32 x bf16 -> f32: no round
  v = m.binary(B::add, v, h);       // f32 x f16 -> f32
  v = m.unary(UnaryOp::silu, v);
  auto b = m.cast(v, DType::bf16);  // round to bf16
  b = m.binary(B::mul, b, sb);      // bf16 x bf16 scalar -> bf16
  b = m.binary(B::add, b, w);
  const auto bh = m.binary(B::sub, w, h);  // bf16 x f16 meet in f32
  auto r = m.binary(B::add, b, x);         // bf16 x f32 -> f32
  r = m.binary(B::mul, r, bh);
  m.expect_identical(r, "mixed -> f32");
  m.expect_identical(b, "mixed -> bf16");
  m.expect_identical(m.cast(r, DType::f16), "mixed -> f16");
}

// Modulation as in the DiT blocks: x * (1 + scale) + shift + bias, with scale/shift broadcast
// over the sequence, written out by hand as the fuser will emit it.
TEST(FusedElementwise, BroadcastModulation) {
  enum class Layout { dense, views };
  for (DType t : {DType::f32, DType::bf16}) {
    for (Layout layout : {Layout::dense, Layout::views}) {
      Tensor x, scale, shift, bias;
      if (layout == Layout::dense) {
        x = test::random_tensor({2, 77, 96}, 11, t);
        scale = test::random_tensor({2, 1, 96}, 12, t);
        shift = test::random_tensor({2, 1, 96}, 13, t);
        bias = test::random_tensor({96}, 14, t);
      } else {
        x = transpose(test::random_tensor({2, 96, 77}, 11, t), -1, -2);             // transposed view
        scale = slice(test::random_tensor({2, 1, 192}, 12, t), -1, 0, 192, 2);     // stride 2
        shift = expand(test::random_tensor({1, 1, 96}, 13, t), {2, 1, 96});        // stride 0
        bias = slice(test::random_tensor({2, 96}, 14, t), 0, 1, 2);                 // offset row
        bias = reshape(bias, {96});
        ASSERT_FALSE(x.is_contiguous());
        ASSERT_FALSE(scale.is_contiguous());
      }
      const Tensor one = scalar(1, t);
      const Tensor eager = x * (one + scale) + shift + bias;

      FusedProgram p;
      auto emit = [&](FusedInstr in) {
        p.instrs.push_back(in);
        // Low-precision storage: eager stores each intermediate in t.
        if (t != DType::f32) p.instrs.push_back(round_to(t, int(p.instrs.size()) - 1));
        return int(p.instrs.size()) - 1;
      };
      p.instrs = {load(0), load(1), load(2), load(3), load(4)};  // x, scale, shift, bias, 1
      const int one_plus = emit(binary(BinaryOp::add, 4, 1));
      const int scaled = emit(binary(BinaryOp::mul, 0, one_plus));
      const int shifted = emit(binary(BinaryOp::add, scaled, 2));
      p.result = emit(binary(BinaryOp::add, shifted, 3));
      SCOPED_TRACE(p.describe());
      expect_same_bytes(run_fused(p, {x, scale, shift, bias, one}, {2, 77, 96}, t), eager,
                        std::string("modulation ") + dtype_name(t) + (layout == Layout::dense ? " dense" : " views"));
    }
  }
}

TEST(FusedElementwise, ComparisonsWhereAndCasts) {
  using B = BinaryOp;
  Mirror m;
  const auto x = m.input(test::random_tensor({33, 65}, 21, DType::f32, -4, 4));
  const auto y = m.input(test::random_tensor({33, 65}, 22, DType::f32, -4, 4));
  std::vector<int64_t> ks(65), bits(33 * 65);
  for (size_t i = 0; i < ks.size(); ++i) ks[i] = int64_t(i % 7) - 3;
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = (i * 7919) % 3 == 0;
  const auto k = m.input(from_ints(ks, {65}, DType::i64));
  const auto mask = m.input(from_ints(bits, {33, 65}, DType::boolean));
  const auto s0 = m.input(scalar(0.25)), s3 = m.input(scalar(3));

  const auto c = m.binary(B::gt, x, y);  // bool
  const auto d = m.binary(B::le, x, s0);
  const auto e = m.where(c, x, m.binary(B::mul, y, s3));
  const auto f = m.cast(m.binary(B::mul, e, s3), DType::i32);  // truncation toward zero
  const auto g = m.binary(B::add, f, k);                          // i32 + i64 -> i64
  const auto h = m.where(d, g, f);                                // i64
  const auto r = m.binary(B::mul, h, x);                          // i64 x f32 -> f32
  const auto nz = m.cast(m.binary(B::sub, r, m.cast(m.cast(r, DType::i32), DType::f32)), DType::boolean);
  const auto out = m.where(nz, m.where(mask, r, y), m.unary(UnaryOp::neg, r));
  m.expect_identical(out, "where chain -> f32");
  m.expect_identical(f, "cast -> i32");
  m.expect_identical(h, "where -> i64");
  m.expect_identical(c, "gt -> bool");  // earlier result: the later instructions are dead code
  m.expect_identical(m.binary(B::ne, out, e), "ne -> bool");
  m.expect_identical(m.cast(e, DType::bf16), "cast -> bf16");
}

TEST(FusedElementwise, ClampWithBounds) {
  for (DType t : {DType::f32, DType::bf16}) {
    Mirror m;
    const auto x = m.input(test::random_tensor({1237}, 31, t));
    auto v = m.clamp(x, -0.5, 0.75);
    v = m.binary(BinaryOp::add, v, m.clamp(x, std::nullopt, 0.1));
    v = m.binary(BinaryOp::mul, v, m.clamp(x, -0.3, std::nullopt));
    v = m.clamp(m.unary(UnaryOp::exp, v), 0.6, 2.2);
    m.expect_identical(v, std::string("clamp ") + dtype_name(t));
  }
}

TEST(FusedElementwise, OddSizesZeroDimAndEmpty) {
  {  // 1237 elements: a partial SIMD tail in every tile
    Mirror m;
    const auto x = m.input(test::random_tensor({1237}, 41));
    const auto y = m.input(test::random_tensor({1237}, 42, DType::bf16));
    m.expect_identical(m.unary(UnaryOp::gelu, m.binary(BinaryOp::sub, m.unary(UnaryOp::quick_gelu, x), y)),
                       "[1237]");
  }
  {  // [7, 1237] from a transposed view: several rows, each with partial tiles
    Mirror m;
    const auto x = m.input(transpose(test::random_tensor({1237, 7}, 43), 0, 1));
    const auto b = m.input(test::random_tensor({1237}, 44));
    m.expect_identical(m.unary(UnaryOp::sin, m.binary(BinaryOp::maximum, x, b)), "[7,1237] transposed");
  }
  {  // a 0-d output
    Mirror m;
    const auto a = m.input(scalar(0.7)), b = m.input(scalar(-1.3, DType::bf16));
    auto v = m.binary(BinaryOp::pow, m.unary(UnaryOp::abs, m.binary(BinaryOp::mul, a, b)), a);
    v = m.unary(UnaryOp::log, m.unary(UnaryOp::sqrt, v));
    m.expect_identical(v, "0-d f32");
    m.expect_identical(m.cast(v, DType::bf16), "0-d bf16");
  }
  {  // no elements: nothing to do, nothing touched
    const Tensor x = zeros({0, 5});
    FusedProgram p{{load(0), unary(UnaryOp::exp, 0)}, 1};
    const Tensor out = run_fused(p, {x}, {0, 5}, DType::f32);
    EXPECT_EQ(out.numel(), 0);
  }
}

TEST(FusedElementwise, LoadResultsAndRepeatedLoads) {
  // A program whose result is a bare load is a copy (or a cast into the output's dtype).
  const Tensor xt = transpose(test::random_tensor({50, 40}, 51), 0, 1);
  expect_same_bytes(run_fused(FusedProgram{{load(0)}, 0}, {xt}, {40, 50}, DType::f32), contiguous(xt), "copy");
  expect_same_bytes(run_fused(FusedProgram{{load(0)}, 0}, {xt}, {40, 50}, DType::bf16), cast(xt, DType::bf16),
                    "cast by store");
  const Tensor xb = test::random_tensor({40, 50}, 52, DType::bf16);
  expect_same_bytes(run_fused(FusedProgram{{load(0)}, 0}, {xb}, {40, 50}, DType::f32), cast(xb, DType::f32),
                    "bf16 -> f32");
  // The same input loaded twice gives the same values.
  expect_same_bytes(run_fused(FusedProgram{{load(0), load(0), binary(BinaryOp::mul, 0, 1)}, 2}, {xb}, {40, 50},
                              DType::bf16),
                    xb * xb, "x * x");
}

TEST(FusedElementwise, AllocatesNoDeviceMemory) {
  const Tensor x = test::random_tensor({64, 3000}, 61, DType::bf16);
  const Tensor s = scalar(0.5);
  Tensor out = zeros({64, 3000}, DType::bf16);
  FusedProgram p;
  p.instrs = {load(0), load(1)};
  for (int i = 0; i < 30; ++i) {
    p.instrs.push_back(binary(BinaryOp::mul, int(p.instrs.size()) - 1, 1));
    p.instrs.push_back(unary(UnaryOp::silu, int(p.instrs.size()) - 1));
    p.instrs.push_back(round_to(DType::bf16, int(p.instrs.size()) - 1));
  }
  p.result = int(p.instrs.size()) - 1;
  synchronize();
  DeviceRuntime& rt = runtime(Device::cpu());
  rt.reset_peak_memory();
  const size_t before = rt.memory().in_use_bytes;
  cpu::fused_elementwise(p, views_of({x, s}), TensorView::of(out));
  EXPECT_EQ(rt.memory().in_use_bytes, before);
  EXPECT_EQ(rt.memory().peak_bytes, before);  // not even transiently
}

TEST(FusedElementwise, ValidationErrors) {
  const Tensor x = test::random_tensor({4, 5}, 71);
  const Tensor out = zeros({4, 5});
  wait(out);
  auto run = [&](const FusedProgram& p, const std::vector<Tensor>& ins, const Tensor& o) {
    return [&, p, ins, o] { cpu::fused_elementwise(p, views_of(ins), TensorView::of(o)); };
  };
  // Registers must be earlier instructions.
  test::expect_error(run(FusedProgram{{load(0), unary(UnaryOp::exp, 1)}, 1}, {x}, out),
                     {"[fused]", "instr %1", "reads register 1", "not an earlier instruction"});
  test::expect_error(run(FusedProgram{{load(0), binary(BinaryOp::add, 0, 5)}, 1}, {x}, out),
                     {"[fused]", "reads register 5"});
  test::expect_error(run(FusedProgram{{load(0), pick(0, -1, 0)}, 1}, {x}, out), {"[fused]", "reads register -1"});
  test::expect_error(run(FusedProgram{{load(0), round_to(DType::bf16, -1)}, 1}, {x}, out),
                     {"[fused]", "(round) reads register -1"});
  // Inputs must exist.
  test::expect_error(run(FusedProgram{{load(0), load(2)}, 1}, {x}, out),
                     {"[fused]", "instr %1 loads input 2", "has 1 inputs"});
  test::expect_error(run(FusedProgram{{load(-1)}, 0}, {x}, out), {"[fused]", "loads input -1"});
  // The result must be an instruction; a program must have one.
  test::expect_error(run(FusedProgram{{load(0)}, 1}, {x}, out), {"[fused]", "result register 1"});
  test::expect_error(run(FusedProgram{{}, 0}, {x}, out), {"[fused]", "empty program"});
  // Unknown enum values.
  test::expect_error(run(FusedProgram{{load(0), unary(UnaryOp(99), 0)}, 1}, {x}, out),
                     {"[fused]", "unknown unary op 99"});
  // Shapes: inputs broadcast to the output; the output is dense.
  test::expect_error(run(FusedProgram{{load(0)}, 0}, {test::random_tensor({3}, 72)}, out),
                     {"[fused]", "input 0 of shape [3] does not broadcast to the output shape [4,5]"});
  const Tensor out_t = transpose(zeros({5, 4}), 0, 1);
  test::expect_error(run(FusedProgram{{load(0)}, 0}, {x}, out_t), {"[fused]", "not dense"});
  // validate() on its own, and the program text in the message.
  test::expect_error([] { validate_fused_program(FusedProgram{{load(0), load(1), binary(BinaryOp::add, 0, 1)}, 2}, 1); },
                     {"[fused]", "loads input 1", "%2 = add %0, %1"});
  EXPECT_NO_THROW(validate_fused_program(FusedProgram{{load(0), load(1), binary(BinaryOp::add, 0, 1)}, 2}, 2));
}

TEST(FusedElementwise, Describe) {
  const FusedProgram p{{load(0), load(1), unary(UnaryOp::clamp, 0, -1, 2), binary(BinaryOp::add, 2, 1),
                        round_to(DType::bf16, 3), pick(4, 0, 1)},
                       5};
  const std::string d = p.describe();
  for (const char* part : {"6 instrs, result %5", "%0 = load in0", "%2 = clamp %0 [-1, 2]", "%3 = add %2, %1",
                           "%4 = round.bf16 %3", "%5 = where %4 ? %0 : %1"})
    EXPECT_NE(d.find(part), std::string::npos) << d << "\nmissing: " << part;
}

}  // namespace
}  // namespace kiln
