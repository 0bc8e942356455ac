#include "devices/pjrt/lower_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "graph/conv2d_inputs.h"
#include "graph/elementwise.h"

namespace kiln::pjrt {

namespace {

const char* unary_instruction(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg: return "stablehlo.negate";
    case UnaryOp::abs: return "stablehlo.abs";
    case UnaryOp::exp: return "stablehlo.exponential";
    case UnaryOp::log: return "stablehlo.log";
    case UnaryOp::sqrt: return "stablehlo.sqrt";
    case UnaryOp::rsqrt: return "stablehlo.rsqrt";
    case UnaryOp::tanh: return "stablehlo.tanh";
    case UnaryOp::sin: return "stablehlo.sine";
    case UnaryOp::cos: return "stablehlo.cosine";
    case UnaryOp::sigmoid: return "stablehlo.logistic";
    default: return nullptr;
  }
}

const char* binary_instruction(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "stablehlo.add";
    case BinaryOp::sub: return "stablehlo.subtract";
    case BinaryOp::mul: return "stablehlo.multiply";
    case BinaryOp::div: return "stablehlo.divide";
    case BinaryOp::pow: return "stablehlo.power";
    case BinaryOp::maximum: return "stablehlo.maximum";
    case BinaryOp::minimum: return "stablehlo.minimum";
    default: return nullptr;
  }
}

const char* comparison(BinaryOp op) {
  switch (op) {
    case BinaryOp::eq: return "EQ";
    case BinaryOp::ne: return "NE";
    case BinaryOp::lt: return "LT";
    case BinaryOp::le: return "LE";
    case BinaryOp::gt: return "GT";
    default: return "GE";
  }
}

// The type an elementwise op computes in: f32 for floats (kiln's kernels load bf16/f16 as f32),
// the integer type otherwise.
std::string compute_elem(const std::string& out) { return is_float_elem(out) ? "f32" : out; }

Value scalar_like(FunctionBuilder& b, double value, const Value& like) { return b.splat(value, like.shape, like.elem); }

Value lower_unary(FunctionBuilder& b, UnaryOp op, const Attrs& attrs, const Value& in, const std::string& out) {
  const Value x = b.convert(in, compute_elem(out));
  auto k = [&](double v) { return scalar_like(b, v, x); };
  Value r;
  if (const char* inst = unary_instruction(op)) {
    r = b.unary(inst, x);
  } else {
    switch (op) {
      case UnaryOp::relu: r = b.select(b.compare("GT", x, k(0)), x, k(0)); break;
      case UnaryOp::silu: r = b.binary("stablehlo.multiply", x, b.unary("stablehlo.logistic", x)); break;
      case UnaryOp::gelu: {
        const Value e = b.unary("chlo.erf", b.binary("stablehlo.multiply", x, k(1.0 / std::sqrt(2.0))));
        r = b.binary("stablehlo.multiply", b.binary("stablehlo.multiply", k(0.5), x), b.binary("stablehlo.add", k(1), e));
        break;
      }
      case UnaryOp::gelu_tanh: {
        const Value x3 = b.binary("stablehlo.multiply", b.binary("stablehlo.multiply", x, x), x);
        const Value inner = b.binary("stablehlo.multiply", k(std::sqrt(2.0 / M_PI)),
                                     b.binary("stablehlo.add", x, b.binary("stablehlo.multiply", k(0.044715), x3)));
        r = b.binary("stablehlo.multiply", b.binary("stablehlo.multiply", k(0.5), x),
                     b.binary("stablehlo.add", k(1), b.unary("stablehlo.tanh", inner)));
        break;
      }
      case UnaryOp::quick_gelu:
        r = b.binary("stablehlo.multiply", x, b.unary("stablehlo.logistic", b.binary("stablehlo.multiply", k(1.702), x)));
        break;
      case UnaryOp::clamp: {
        // The bounds as kiln's kernels hold them: float(attr); fmin/fmax skip NaN bounds.
        r = x;
        if (attrs.has("min")) r = b.binary("stablehlo.maximum", r, k(double(float(attrs.get_float("min")))));
        if (attrs.has("max")) r = b.binary("stablehlo.minimum", r, k(double(float(attrs.get_float("max")))));
        break;
      }
      default: fail("pjrt", unary_name(op), " has no lowering");
    }
  }
  return b.convert(r, out);
}

Value lower_binary(FunctionBuilder& b, BinaryOp op, const Value& a0, const Value& b0, const Shape& shape,
                   const std::string& out) {
  if (is_comparison(op)) {
    // Compared in the promoted type: floats in f32, integers and bools as integers.
    const std::string t = is_float_elem(a0.elem) || is_float_elem(b0.elem) ? "f32"
                          : (a0.elem == "i64" || b0.elem == "i64")      ? "i64"
                                                                          : "i32";
    const Value x = b.broadcast_to(b.convert(a0, t), shape), y = b.broadcast_to(b.convert(b0, t), shape);
    return b.compare(comparison(op), x, y);
  }
  const std::string t = compute_elem(out);
  const Value x = b.broadcast_to(b.convert(a0, t), shape), y = b.broadcast_to(b.convert(b0, t), shape);
  return b.convert(b.binary(binary_instruction(op), x, y), out);
}

std::vector<int64_t> axes_of(const Attrs& attrs, const char* key, int64_t rank) {
  std::vector<int64_t> axes;
  const auto& given = attrs.get_ints(key);
  if (given.empty())
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  for (int64_t a : given) axes.push_back(normalize_axis(a, rank, "pjrt"));
  std::sort(axes.begin(), axes.end());
  return axes;
}

// `v` reduced over `axes`, broadcast back to v's shape (for norms and softmax).
Value keep_broadcast(FunctionBuilder& b, const Value& reduced, const Shape& shape, const std::vector<int64_t>& axes) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < int64_t(shape.size()); ++d)
    if (!std::binary_search(axes.begin(), axes.end(), d)) dims.push_back(d);
  return b.broadcast_in_dim(reduced, shape, dims);
}

Value mean_over(FunctionBuilder& b, const Value& x, const std::vector<int64_t>& axes) {
  int64_t n = 1;
  for (int64_t a : axes) n *= x.shape[size_t(a)];
  const Value s = b.reduce(x, axes, "stablehlo.add", 0);
  return b.binary("stablehlo.divide", s, b.splat(double(n), s.shape, "f32"));
}

// (x - mean) / sqrt(var + eps) over `axes` (mean 0 for RMSNorm), in f32.
Value normalize(FunctionBuilder& b, const Value& x, const std::vector<int64_t>& axes, double eps, bool rms) {
  Value centered = x;
  if (!rms) centered = b.binary("stablehlo.subtract", x, keep_broadcast(b, mean_over(b, x, axes), x.shape, axes));
  const Value var = mean_over(b, b.binary("stablehlo.multiply", centered, centered), axes);
  const Value inv = b.unary("stablehlo.rsqrt", b.binary("stablehlo.add", var, b.splat(double(float(eps)), var.shape, "f32")));
  return b.binary("stablehlo.multiply", centered, keep_broadcast(b, inv, x.shape, axes));
}

Value softmax(FunctionBuilder& b, const Value& x, int64_t axis) {
  const std::vector<int64_t> axes{axis};
  const Value m = b.reduce(x, axes, "stablehlo.maximum", -INFINITY);
  const Value e = b.unary("stablehlo.exponential", b.binary("stablehlo.subtract", x, keep_broadcast(b, m, x.shape, axes)));
  const Value s = b.reduce(e, axes, "stablehlo.add", 0);
  return b.binary("stablehlo.divide", e, keep_broadcast(b, s, x.shape, axes));
}

Value lower_reduce(FunctionBuilder& b, const std::string& op, const Attrs& attrs, const Value& in, const Shape& out_shape,
                   const std::string& out) {
  const Value x = b.convert(in, "f32");
  const std::vector<int64_t> axes = axes_of(attrs, "axes", int64_t(x.shape.size()));
  Value r;
  if (op == "sum") r = b.reduce(x, axes, "stablehlo.add", 0);
  else if (op == "max") r = b.reduce(x, axes, "stablehlo.maximum", -INFINITY);
  else if (op == "mean") r = mean_over(b, x, axes);
  else {  // var
    int64_t n = 1;
    for (int64_t a : axes) n *= x.shape[size_t(a)];
    const Value c = b.binary("stablehlo.subtract", x, keep_broadcast(b, mean_over(b, x, axes), x.shape, axes));
    const Value ss = b.reduce(b.binary("stablehlo.multiply", c, c), axes, "stablehlo.add", 0);
    r = b.binary("stablehlo.divide", ss, b.splat(double(n - attrs.get_int("correction", 1)), ss.shape, "f32"));
  }
  return b.convert(b.reshape(r, out_shape), out);
}

Value lower_matmul(FunctionBuilder& b, const Attrs& attrs, const Value& a0, const Value& b0, const Shape& out_shape,
                   const std::string& out) {
  const bool ta = attrs.get_int("transpose_a", 0) != 0, tb = attrs.get_int("transpose_b", 0) != 0;
  const size_t nb = out_shape.size() - 2;
  const Shape batch(out_shape.begin(), out_shape.end() - 2);
  auto batched = [&](const Value& v) {  // broadcast the batch dims to the output's
    Shape s = batch;
    s.push_back(v.shape[v.shape.size() - 2]);
    s.push_back(v.shape.back());
    return b.broadcast_to(b.convert(v, "f32"), s);
  };
  const Value x = batched(a0), y = batched(b0);
  std::vector<int64_t> bd(nb);
  std::iota(bd.begin(), bd.end(), 0);
  const int64_t ca = int64_t(ta ? nb : nb + 1), cb = int64_t(tb ? nb + 1 : nb);
  // dot_general's result: batch dims, a's free dim, b's free dim = [..., M, N].
  return b.convert(b.dot_general(x, y, bd, bd, {ca}, {cb}, out_shape), out);
}

Value lower_linear(FunctionBuilder& b, const std::vector<Value>& in, const Shape& out_shape, const std::string& out) {
  const Value x = b.convert(in[0], "f32"), w = b.convert(in[1], "f32");
  const int64_t k = x.shape.back(), n = w.shape[0];
  const int64_t rows = k ? x.numel() / k : 0;
  Value y = b.dot_general(b.reshape(x, {rows, k}), w, {}, {}, {1}, {1}, {rows, n});
  if (in.size() > 2) y = b.binary("stablehlo.add", y, b.broadcast_in_dim(b.convert(in[2], "f32"), {rows, n}, {1}));
  return b.convert(b.reshape(y, out_shape), out);
}

Value lower_conv2d(FunctionBuilder& b, const Attrs& attrs, const std::vector<Value>& in, const Shape& out_shape,
                   const std::string& out) {
  const bool cl = attrs.get_int("channels_last", 0) != 0;
  const Conv2dInputs inputs = conv2d_inputs(in.size(), attrs);
  Value y = b.conv2d(b.convert(in[0], "f32"), b.convert(in[1], "f32"), attrs.get_ints("stride"),
                     attrs.get_ints("padding"), cl, out_shape);
  if (inputs.bias) y = b.binary("stablehlo.add", y, b.broadcast_in_dim(b.convert(in[2], "f32"), out_shape, {cl ? 3 : 1}));
  // The residual is added to the result rounded as a separate add would see it.
  if (inputs.residual) {
    y = b.convert(b.convert(y, out), "f32");
    y = b.binary("stablehlo.add", y, b.convert(in.back(), "f32"));
  }
  return b.convert(y, out);
}

Value lower_sdpa(FunctionBuilder& b, const Attrs& attrs, const std::vector<Value>& in, const std::string& out) {
  const Value q = b.convert(in[0], "f32");
  Value k = b.convert(in[1], "f32"), v = b.convert(in[2], "f32");
  const int64_t B = q.shape[0], H = q.shape[1], Lq = q.shape[2], D = q.shape[3], Hkv = k.shape[1], Lk = k.shape[2],
                Dv = v.shape[3];
  if (Hkv != H) {  // grouped-query attention: query head h reads K/V head h / (H / Hkv)
    const int64_t g = H / Hkv;
    k = b.reshape(b.broadcast_in_dim(k, {B, Hkv, g, Lk, D}, {0, 1, 3, 4}), {B, H, Lk, D});
    v = b.reshape(b.broadcast_in_dim(v, {B, Hkv, g, Lk, Dv}, {0, 1, 3, 4}), {B, H, Lk, Dv});
  }
  const double scale = attrs.get_float("scale", 1.0 / std::sqrt(double(D)));
  Value s = b.dot_general(q, k, {0, 1}, {0, 1}, {3}, {3}, {B, H, Lq, Lk});
  s = b.binary("stablehlo.multiply", s, b.splat(double(float(scale)), s.shape, "f32"));
  if (in.size() > 3) s = b.binary("stablehlo.add", s, b.broadcast_to(b.convert(in[3], "f32"), s.shape));
  const Value p = softmax(b, s, 3);
  return b.convert(b.dot_general(p, v, {0, 1}, {0, 1}, {3}, {2}, {B, H, Lq, Dv}), out);
}

Value lower_group_norm(FunctionBuilder& b, const Attrs& attrs, const std::vector<Value>& in, const std::string& out) {
  const bool cl = attrs.get_int("channels_last", 0) != 0;
  const Value x = b.convert(in[0], "f32");
  const Shape& s = x.shape;
  const int64_t n = s[0], c = s[cl ? 3 : 1], g = attrs.get_int("groups");
  const int64_t hw = x.numel() / std::max<int64_t>(n * c, 1);
  Value y;
  if (cl) {  // [N, HW, G, C/G], statistics over HW and C/G
    const Value xg = b.reshape(x, {n, hw, g, c / g});
    y = b.reshape(normalize(b, xg, {1, 3}, attrs.get_float("eps"), false), s);
  } else {  // [N, G, C/G * HW]
    const Value xg = b.reshape(x, {n, g, c / g * hw});
    y = b.reshape(normalize(b, xg, {2}, attrs.get_float("eps"), false), s);
  }
  const int64_t channel_dim = cl ? 3 : 1;
  if (in.size() > 1) y = b.binary("stablehlo.multiply", y, b.broadcast_in_dim(b.convert(in[1], "f32"), s, {channel_dim}));
  if (in.size() > 2) y = b.binary("stablehlo.add", y, b.broadcast_in_dim(b.convert(in[2], "f32"), s, {channel_dim}));
  if (attrs.get_string("activation", "") == "silu") y = b.binary("stablehlo.multiply", y, b.unary("stablehlo.logistic", y));
  return b.convert(y, out);
}

Value lower_row_norm(FunctionBuilder& b, const Attrs& attrs, const std::vector<Value>& in, bool rms,
                     const std::string& out) {
  const Value x = b.convert(in[0], "f32");
  const int64_t last = int64_t(x.shape.size()) - 1;
  Value y = normalize(b, x, {last}, attrs.get_float("eps"), rms);
  if (in.size() > 1) y = b.binary("stablehlo.multiply", y, b.broadcast_in_dim(b.convert(in[1], "f32"), x.shape, {last}));
  if (in.size() > 2) y = b.binary("stablehlo.add", y, b.broadcast_in_dim(b.convert(in[2], "f32"), x.shape, {last}));
  return b.convert(y, out);
}

Value lower_upsample(FunctionBuilder& b, const Attrs& attrs, const Value& x, const Shape& out_shape) {
  const Shape& s = x.shape;
  if (attrs.get_int("channels_last", 0) != 0)  // [N,H,W,C] -> [N,H,2,W,2,C]
    return b.reshape(b.broadcast_in_dim(x, {s[0], s[1], 2, s[2], 2, s[3]}, {0, 1, 3, 5}), out_shape);
  return b.reshape(b.broadcast_in_dim(x, {s[0], s[1], s[2], 2, s[3], 2}, {0, 1, 2, 4}), out_shape);
}

}  // namespace

bool lowerable(const std::string& op, const std::vector<OperandMeta>& inputs, std::string* why) {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (is_storage_only(inputs[i].dtype)) {
      *why = std::string("input ") + std::to_string(i) + " is " + dtype_name(inputs[i].dtype) +
             ": quantized weights are not lowered to StableHLO yet (load them as bf16 or f32)";
      return false;
    }
  (void)op;  // every op lowers; the collectives over the program's replicas (pjrt_runtime.cc)
  return true;
}

Value lower_op(FunctionBuilder& b, const std::string& op, const Attrs& attrs, const std::vector<Value>& in,
               const Shape& out_shape, DType out_dtype, int replicas) {
  const std::string out = element_type(out_dtype);
  if (op == "all_reduce")  // summed in f32, rounded once (the CPU kernel's rule)
    return b.convert(replicas == 1 ? b.convert(in[0], "f32") : b.all_reduce_sum(b.convert(in[0], "f32"), replicas), out);
  if (op == "all_gather") {
    KILN_CHECK(attrs.get_int("world_size") == replicas, "pjrt", "an all_gather over ", attrs.get_int("world_size"),
               " ranks in a program for ", replicas, " replicas");
    return replicas == 1 ? in[0] : b.all_gather(in[0], attrs.get_int("axis"), replicas);
  }
  if (auto u = unary_from_name(op)) return lower_unary(b, *u, attrs, in[0], out);
  if (auto bin = binary_from_name(op)) return lower_binary(b, *bin, in[0], in[1], out_shape, out);
  if (op == "where") {
    const Value c = b.broadcast_to(in[0], out_shape);
    return b.select(c, b.broadcast_to(b.convert(b.convert(in[1], compute_elem(out)), out), out_shape),
                    b.broadcast_to(b.convert(b.convert(in[2], compute_elem(out)), out), out_shape));
  }
  if (op == "cast") return b.convert(in[0], out);  // floats to integers truncate toward zero
  if (op == "copy") return in[0];
  if (op == "concat") return b.concatenate(in, normalize_axis(attrs.get_int("axis"), int64_t(out_shape.size()), "concat"));
  if (op == "pad") {
    const auto& pads = attrs.get_ints("pads");
    std::vector<int64_t> lo, hi;
    for (size_t d = 0; d < out_shape.size(); ++d) lo.push_back(pads[2 * d]), hi.push_back(pads[2 * d + 1]);
    return b.pad(in[0], attrs.get_float("value", 0.0), lo, hi);
  }
  if (op == "gather") return b.take_rows(in[0], in[1]);
  if (op == "upsample_nearest2x") return lower_upsample(b, attrs, in[0], out_shape);
  if (op == "arange") {
    // start + i * step in double, then rounded into the dtype (the CPU kernel's formula).
    const Value i = b.convert(b.iota(out_shape, 0, "i64"), "f64");
    const Value v = b.binary("stablehlo.add", b.splat(attrs.get_float("start"), out_shape, "f64"),
                             b.binary("stablehlo.multiply", i, b.splat(attrs.get_float("step"), out_shape, "f64")));
    return b.convert(is_float_elem(out) ? b.convert(v, "f32") : v, out);
  }
  if (op == "full") return b.splat(attrs.get_float("value"), out_shape, out);
  if (op == "sum" || op == "mean" || op == "max" || op == "var") return lower_reduce(b, op, attrs, in[0], out_shape, out);
  if (op == "softmax")
    return b.convert(softmax(b, b.convert(in[0], "f32"), normalize_axis(attrs.get_int("axis"), int64_t(out_shape.size()), "softmax")), out);
  if (op == "layer_norm" || op == "rms_norm") return lower_row_norm(b, attrs, in, op == "rms_norm", out);
  if (op == "group_norm") return lower_group_norm(b, attrs, in, out);
  if (op == "matmul") return lower_matmul(b, attrs, in[0], in[1], out_shape, out);
  if (op == "linear") return lower_linear(b, in, out_shape, out);
  if (op == "conv2d") return lower_conv2d(b, attrs, in, out_shape, out);
  if (op == "sdpa") return lower_sdpa(b, attrs, in, out);
  fail("pjrt", op, " has no StableHLO lowering");
}

Value strided_view(FunctionBuilder& b, const Value& flat, int64_t offset, const Shape& shape, const Strides& strides) {
  // The dims that address memory: size > 1 and a non-zero stride (the rest are broadcasts).
  std::vector<int64_t> core;
  int64_t lo = 0, hi = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] <= 1 || strides[d] == 0) continue;
    core.push_back(int64_t(d));
    const int64_t span = (shape[d] - 1) * strides[d];
    (span < 0 ? lo : hi) += span;
  }
  if (numel(shape) == 0) return b.splat(0, shape, flat.elem);
  const int64_t first = offset + lo, count = hi - lo + 1;
  Value window = b.slice(flat, {first}, {first + count}, {1});
  Shape core_shape;
  for (int64_t d : core) core_shape.push_back(shape[size_t(d)]);
  // A permuted dense block: strides, sorted descending, are the dense strides of those sizes.
  std::vector<int64_t> order(core.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int64_t x, int64_t y) { return strides[size_t(core[size_t(x)])] > strides[size_t(core[size_t(y)])]; });
  bool block = true;
  int64_t expect = 1;
  for (size_t i = order.size(); i-- > 0;) {
    const int64_t st = strides[size_t(core[size_t(order[i])])];
    block = block && st == expect;
    expect *= core_shape[size_t(order[i])];
  }
  Value dense;
  if (block) {
    Shape sorted_shape;
    for (int64_t o : order) sorted_shape.push_back(core_shape[size_t(o)]);
    std::vector<int64_t> perm(order.size());  // sorted position of each core dim
    for (size_t i = 0; i < order.size(); ++i) perm[size_t(order[i])] = int64_t(i);
    dense = b.transpose(b.reshape(window, sorted_shape), perm);
  } else {
    // Gather: element (i...) is at sum(i_d * stride_d) - lo of the window.
    Value idx = b.splat(double(-lo), core_shape, "i64");
    for (size_t i = 0; i < core.size(); ++i) {
      const Value term = b.binary("stablehlo.multiply", b.iota(core_shape, int64_t(i), "i64"),
                                  b.splat(double(strides[size_t(core[i])]), core_shape, "i64"));
      idx = b.binary("stablehlo.add", idx, term);
    }
    dense = b.take_rows(window, idx);
  }
  // Back to the view's rank (size-1 dims where broadcasts or unit dims were), then broadcast.
  Shape kept(shape.size(), 1);
  for (int64_t d : core) kept[size_t(d)] = shape[size_t(d)];
  dense = b.reshape(dense, kept);
  if (kept == shape) return dense;
  std::vector<int64_t> dims(shape.size());
  std::iota(dims.begin(), dims.end(), 0);
  return b.broadcast_in_dim(dense, shape, dims);
}

}  // namespace kiln::pjrt
