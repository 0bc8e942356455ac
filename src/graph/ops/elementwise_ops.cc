// Elementwise ops: unary maps, binary maps with NumPy broadcasting, where, cast.
#include <cmath>
#include <limits>

#include "graph/elementwise.h"
#include "graph/ops/ref_util.h"

namespace kiln {

namespace {

int category(DType t) { return t == DType::boolean ? 0 : is_floating(t) ? 2 : 1; }

// torch-style result type: a 0-d operand (a lifted host scalar) does not widen a tensor of
// the same or a higher category (bf16 tensor * 0.5 stays bf16).
DType binary_result_dtype(const Tensor& a, const Tensor& b) {
  if (a.rank() == 0 && b.rank() > 0 && category(a.dtype()) <= category(b.dtype())) return b.dtype();
  if (b.rank() == 0 && a.rank() > 0 && category(b.dtype()) <= category(a.dtype())) return a.dtype();
  if (a.rank() == 0 && b.rank() > 0 && category(a.dtype()) == 2 && category(b.dtype()) < 2) return DType::f32;
  if (b.rank() == 0 && a.rank() > 0 && category(b.dtype()) == 2 && category(a.dtype()) < 2) return DType::f32;
  return promote(a.dtype(), b.dtype());
}

void register_unary(UnaryOp op) {
  OpDef def;
  def.name = unary_name(op);
  def.kind = OpKind::elementwise;
  def.strided_inputs = true;
  def.infer = [op](const std::vector<Tensor>& in, const Attrs&) {
    const DType t = in[0].dtype();
    const DType out = is_floating(t) || keeps_integer(op) ? t : DType::f32;
    KILN_CHECK(!(t == DType::boolean && keeps_integer(op)), unary_name(op), "not defined for bool tensors");
    return OutputMeta{in[0].shape(), out};
  };
  def.reference = [op](const std::vector<HostTensor>& in, const Attrs& attrs, const OutputMeta&) {
    const double lo = attrs.get_float("min", -std::numeric_limits<double>::infinity());
    const double hi = attrs.get_float("max", std::numeric_limits<double>::infinity());
    std::vector<double> out(in[0].data.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = unary_ref(op, in[0].data[i], lo, hi);
    return out;
  };
  register_op(std::move(def));
}

void register_binary(BinaryOp op) {
  OpDef def;
  def.name = binary_name(op);
  def.kind = OpKind::elementwise;
  def.strided_inputs = true;
  def.min_inputs = def.max_inputs = 2;
  def.infer = [op](const std::vector<Tensor>& in, const Attrs&) {
    const Shape s = broadcast_shapes(in[0].shape(), in[1].shape(), binary_name(op));
    DType t = binary_result_dtype(in[0], in[1]);
    if (op == BinaryOp::div && !is_floating(t)) t = DType::f32;  // true division, like torch
    if (is_comparison(op)) t = DType::boolean;
    return OutputMeta{s, t};
  };
  def.reference = [op](const std::vector<HostTensor>& in, const Attrs&, const OutputMeta& out) {
    std::vector<double> r(static_cast<size_t>(numel(out.shape)));
    for (size_t i = 0; i < r.size(); ++i) {
      const auto idx = ref::unravel(int64_t(i), out.shape);
      r[i] = binary_ref(op, ref::at_broadcast(in[0], idx), ref::at_broadcast(in[1], idx));
    }
    return r;
  };
  register_op(std::move(def));
}

void register_where() {
  OpDef def;
  def.name = "where";
  def.kind = OpKind::elementwise;
  def.strided_inputs = true;
  def.min_inputs = def.max_inputs = 3;
  def.infer = [](const std::vector<Tensor>& in, const Attrs&) {
    KILN_CHECK(in[0].dtype() == DType::boolean, "where", "condition must be bool, got ",
               dtype_name(in[0].dtype()));
    Shape s = broadcast_shapes(in[0].shape(), in[1].shape(), "where");
    s = broadcast_shapes(s, in[2].shape(), "where");
    return OutputMeta{s, binary_result_dtype(in[1], in[2])};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs&, const OutputMeta& out) {
    std::vector<double> r(static_cast<size_t>(numel(out.shape)));
    for (size_t i = 0; i < r.size(); ++i) {
      const auto idx = ref::unravel(int64_t(i), out.shape);
      r[i] = ref::at_broadcast(in[0], idx) != 0 ? ref::at_broadcast(in[1], idx) : ref::at_broadcast(in[2], idx);
    }
    return r;
  };
  register_op(std::move(def));
}

void register_cast() {
  OpDef def;
  def.name = "cast";
  def.kind = OpKind::elementwise;
  def.strided_inputs = true;
  def.infer = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const int64_t t = attrs.get_int("dtype");
    KILN_CHECK(t >= 0 && t <= int64_t(DType::boolean), "cast", "bad dtype code ", t);
    return OutputMeta{in[0].shape(), DType(t)};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs&, const OutputMeta& out) {
    std::vector<double> r = in[0].data;
    // Float -> integer truncates toward zero (C and torch semantics); rounding to the
    // output dtype happens in reference_run.
    if (!is_floating(out.dtype) && out.dtype != DType::boolean)
      for (double& v : r) v = std::trunc(v);
    return r;
  };
  register_op(std::move(def));
}

}  // namespace

void register_elementwise_ops() {
  for (int i = 0; i <= int(UnaryOp::clamp); ++i) register_unary(UnaryOp(i));
  for (int i = 0; i <= int(BinaryOp::ge); ++i) register_binary(BinaryOp(i));
  register_where();
  register_cast();
}

}  // namespace kiln
