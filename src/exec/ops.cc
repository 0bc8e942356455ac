#include "exec/ops.h"

#include "distributed/process_group.h"

#include "core/error.h"
#include "exec/dispatch.h"
#include "exec/host.h"
#include "graph/conv2d_inputs.h"
#include "graph/op.h"

namespace kiln {

namespace {

// Channels-last tensors (ops.h) enter ops as their memory order, [N, H, W, C] (a dense view), and
// the result, in that order too, is viewed back as [N, C, H, W]: the layout flows through.
const std::vector<int64_t> kToNhwc{0, 2, 3, 1}, kToNchw{0, 3, 1, 2};
Tensor as_nhwc(const Tensor& x) { return permute(x, kToNhwc); }
Tensor from_nhwc(const Tensor& y) { return permute(y, kToNchw); }
// An operand of an elementwise op with a channels-last 4-D result, in that result's NHWC order
// (fewer dims broadcast from the right, as in NCHW).
Tensor nhwc_operand(const Tensor& t) {
  if (t.rank() == 0) return t;
  Shape s = t.shape();
  s.insert(s.begin(), size_t(4 - t.rank()), 1);
  return as_nhwc(t.rank() == 4 ? t : reshape(t, s));
}

Tensor unary(const char* op, const Tensor& x, Attrs attrs = {}) {
  if (is_channels_last(x)) return from_nhwc(dispatch(op, {as_nhwc(x)}, std::move(attrs)));
  return dispatch(op, {x}, std::move(attrs));
}
// Whether `from` broadcasts to `to` without growing it (NumPy rules).
bool broadcasts_into(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 0; i < from.size(); ++i) {
    const int64_t f = from[from.size() - 1 - i], t = to[to.size() - 1 - i];
    if (f != 1 && f != t) return false;
  }
  return true;
}
Tensor binary(const char* op, const Tensor& a, const Tensor& b) {
  // A channels-last operand of the result's full shape keeps the result channels-last.
  const bool keep = (is_channels_last(a) && broadcasts_into(b.shape(), a.shape())) ||
                    (is_channels_last(b) && broadcasts_into(a.shape(), b.shape()));
  if (keep) return from_nhwc(dispatch(op, {nhwc_operand(a), nhwc_operand(b)}));
  return dispatch(op, {a, b});
}
// A host scalar as a 0-d operand on the other operand's device, in its float type.
Tensor lift(double v, const Tensor& like) {
  return scalar(v, is_floating(like.dtype()) ? like.dtype() : DType::f32, like.device());
}
// Whether conv2d's kernel can add `residual` itself: the result's [N, O, OH, OW] shape and dtype, on
// the same device, in the layout the result takes (channels-last when x is). Anything else (a
// broadcast, another dtype) is left to `+` and its promotion.
bool residual_fits_conv2d(const Tensor& x, const Tensor& w, const std::vector<int64_t>& stride,
                          const std::vector<int64_t>& padding, const Tensor& residual, bool channels_last) {
  if (x.rank() != 4 || w.rank() != 4 || stride.size() != 2 || padding.size() != 2 || stride[0] <= 0 ||
      stride[1] <= 0)
    return false;
  const Shape out{x.dim(0), w.dim(0), conv2d_out_size(x.dim(2), w.dim(2), stride[0], padding[0]),
                  conv2d_out_size(x.dim(3), w.dim(3), stride[1], padding[1])};
  return residual.shape() == out && residual.dtype() == promote(x.dtype(), w.dtype()) &&
         residual.device() == x.device() && is_channels_last(residual) == channels_last;
}
std::vector<Tensor> present(std::initializer_list<Tensor> ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts)
    if (t.defined()) out.push_back(t);
  return out;
}
}  // namespace

Tensor scalar(double value, DType dtype, const Device& device) {
  std::vector<char> bytes(dtype_size(dtype));
  store_from_double(bytes.data(), dtype, 0, value);
  return from_data(bytes.data(), {}, dtype, device);
}

Tensor full(const Shape& shape, double value, DType dtype, const Device& device) {
  return dispatch("full", {}, Attrs{{"shape", shape}, {"value", value}, {"dtype", int64_t(dtype)}}, device);
}
Tensor zeros(const Shape& shape, DType dtype, const Device& device) { return full(shape, 0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, const Device& device) { return full(shape, 1, dtype, device); }
Tensor arange(double start, double end, double step, DType dtype, const Device& device) {
  return dispatch("arange", {}, Attrs{{"start", start}, {"end", end}, {"step", step}, {"dtype", int64_t(dtype)}},
                  device);
}

Tensor neg(const Tensor& x) { return unary("neg", x); }
Tensor abs(const Tensor& x) { return unary("abs", x); }
Tensor exp(const Tensor& x) { return unary("exp", x); }
Tensor log(const Tensor& x) { return unary("log", x); }
Tensor sqrt(const Tensor& x) { return unary("sqrt", x); }
Tensor rsqrt(const Tensor& x) { return unary("rsqrt", x); }
Tensor tanh(const Tensor& x) { return unary("tanh", x); }
Tensor sin(const Tensor& x) { return unary("sin", x); }
Tensor cos(const Tensor& x) { return unary("cos", x); }
Tensor sigmoid(const Tensor& x) { return unary("sigmoid", x); }
Tensor relu(const Tensor& x) { return unary("relu", x); }
Tensor silu(const Tensor& x) { return unary("silu", x); }
Tensor gelu(const Tensor& x, const std::string& approximate) {
  KILN_CHECK(approximate == "none" || approximate == "tanh", "gelu", "approximate must be 'none' or 'tanh', got '",
             approximate, "'");
  return unary(approximate == "none" ? "gelu" : "gelu_tanh", x);
}
Tensor quick_gelu(const Tensor& x) { return unary("quick_gelu", x); }
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  Attrs attrs;
  if (min) attrs.set("min", *min);
  if (max) attrs.set("max", *max);
  return unary("clamp", x, std::move(attrs));
}
Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return unary("cast", x, Attrs{{"dtype", int64_t(dtype)}});
}

Tensor add(const Tensor& a, const Tensor& b) { return binary("add", a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary("sub", a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary("mul", a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary("div", a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary("pow", a, b); }
Tensor pow(const Tensor& a, double exponent) { return binary("pow", a, lift(exponent, a)); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary("maximum", a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary("minimum", a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary("eq", a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary("ne", a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary("lt", a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary("le", a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary("gt", a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary("ge", a, b); }
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) { return dispatch("where", {cond, a, b}); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double b) { return add(a, lift(b, a)); }
Tensor operator-(const Tensor& a, double b) { return sub(a, lift(b, a)); }
Tensor operator*(const Tensor& a, double b) { return mul(a, lift(b, a)); }
Tensor operator/(const Tensor& a, double b) { return div(a, lift(b, a)); }
Tensor operator+(double a, const Tensor& b) { return add(lift(a, b), b); }
Tensor operator-(double a, const Tensor& b) { return sub(lift(a, b), b); }
Tensor operator*(double a, const Tensor& b) { return mul(lift(a, b), b); }
Tensor operator/(double a, const Tensor& b) { return div(lift(a, b), b); }

namespace {
Tensor reduce(const char* op, const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, Attrs extra = {}) {
  extra.set("axes", axes);
  extra.set("keepdim", int64_t(keepdim));
  return dispatch(op, {x}, std::move(extra));
}
}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) { return reduce("sum", x, axes, keepdim); }
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) { return reduce("mean", x, axes, keepdim); }
Tensor max(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) { return reduce("max", x, axes, keepdim); }
Tensor var(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, int64_t correction) {
  return reduce("var", x, axes, keepdim, Attrs{{"correction", correction}});
}
Tensor softmax(const Tensor& x, int64_t axis) { return dispatch("softmax", {x}, Attrs{{"axis", axis}}); }
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  KILN_CHECK(weight.defined() || !bias.defined(), "layer_norm", "a bias without a weight is not supported");
  return dispatch("layer_norm", present({x, weight, bias}), Attrs{{"eps", eps}});
}
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  return dispatch("rms_norm", present({x, weight}), Attrs{{"eps", eps}});
}
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, double eps,
                  bool then_silu) {
  KILN_CHECK(weight.defined() || !bias.defined(), "group_norm", "a bias without a weight is not supported");
  Attrs attrs{{"groups", groups}, {"eps", eps}};
  if (then_silu) attrs.set("activation", std::string("silu"));
  if (!is_channels_last(x)) return dispatch("group_norm", present({x, weight, bias}), std::move(attrs));
  attrs.set("channels_last", int64_t(1));
  return from_nhwc(dispatch("group_norm", present({as_nhwc(x), weight, bias}), std::move(attrs)));
}

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  return dispatch("matmul", {a, b},
                  Attrs{{"transpose_a", int64_t(transpose_a)}, {"transpose_b", int64_t(transpose_b)}});
}
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return dispatch("linear", present({x, weight, bias}));
}
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, std::vector<int64_t> stride,
              std::vector<int64_t> padding, const Tensor& residual) {
  const bool cl = is_channels_last(x);
  if (residual.defined() && !residual_fits_conv2d(x, weight, stride, padding, residual, cl))
    return conv2d(x, weight, bias, std::move(stride), std::move(padding)) + residual;
  Attrs attrs{{"stride", stride}, {"padding", padding}};
  if (residual.defined()) attrs.set("residual", int64_t(1));
  if (!cl) return dispatch("conv2d", present({x, weight, bias, residual}), std::move(attrs));
  attrs.set("channels_last", int64_t(1));
  const Tensor r = residual.defined() ? as_nhwc(residual) : Tensor();
  return from_nhwc(dispatch("conv2d", present({as_nhwc(x), weight, bias, r}), std::move(attrs)));
}
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    std::optional<double> scale) {
  Attrs attrs;
  if (scale) attrs.set("scale", *scale);
  return dispatch("sdpa", present({q, k, v, mask}), std::move(attrs));
}

Tensor reshape(const Tensor& x, Shape shape) {
  int64_t known = 1, infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      KILN_CHECK(infer_at < 0, "reshape", "only one dim may be -1 in ", to_string(shape));
      infer_at = int64_t(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    KILN_CHECK(known > 0 && x.numel() % known == 0, "reshape", "cannot reshape ", to_string(x.shape()), " to ",
               to_string(shape));
    shape[size_t(infer_at)] = x.numel() / known;
  }
  KILN_CHECK(numel(shape) == x.numel(), "reshape", "cannot reshape ", to_string(x.shape()), " (", x.numel(),
             " elements) to ", to_string(shape));
  const bool viewable = reshape_strides(x.shape(), x.strides(), shape).has_value();
  return dispatch("reshape", {viewable ? x : contiguous(x)}, Attrs{{"shape", shape}});
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  return dispatch("permute", {x}, Attrs{{"dims", dims}});
}
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> dims(size_t(x.rank()));
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = int64_t(i);
  std::swap(dims[size_t(normalize_axis(dim0, x.rank(), "transpose"))],
            dims[size_t(normalize_axis(dim1, x.rank(), "transpose"))]);
  return permute(x, dims);
}
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  return dispatch("slice", {x}, Attrs{{"axis", axis}, {"start", start}, {"end", end}, {"step", step}});
}
Tensor flip(const Tensor& x, int64_t axis) { return dispatch("flip", {x}, Attrs{{"axis", axis}}); }
Tensor expand(const Tensor& x, const Shape& shape) { return dispatch("expand", {x}, Attrs{{"shape", shape}}); }
Tensor broadcast_to(const Tensor& x, const Shape& shape) { return expand(x, shape); }
Tensor unsqueeze(const Tensor& x, int64_t axis) {
  const int64_t a = normalize_axis(axis, x.rank() + 1, "unsqueeze");
  Shape s = x.shape();
  s.insert(s.begin() + a, 1);
  return reshape(x, s);
}
Tensor squeeze(const Tensor& x, int64_t axis) {
  const int64_t a = normalize_axis(axis, x.rank(), "squeeze");
  KILN_CHECK(x.shape()[size_t(a)] == 1, "squeeze", "dim ", axis, " of ", to_string(x.shape()), " is not 1");
  Shape s = x.shape();
  s.erase(s.begin() + a);
  return reshape(x, s);
}
Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.rank() == 0) return reshape(x, {1});
  const int64_t s0 = normalize_axis(start_dim, x.rank(), "flatten"), s1 = normalize_axis(end_dim, x.rank(), "flatten");
  Shape s(x.shape().begin(), x.shape().begin() + s0);
  int64_t merged = 1;
  for (int64_t i = s0; i <= s1; ++i) merged *= x.shape()[size_t(i)];
  s.push_back(merged);
  s.insert(s.end(), x.shape().begin() + s1 + 1, x.shape().end());
  return reshape(x, s);
}
Tensor all_reduce(const Tensor& x) { return dispatch("all_reduce", {x}); }
Tensor all_gather(const Tensor& x, int64_t axis) { return all_gather(x, axis, ProcessGroup::world()->size()); }
Tensor all_gather(const Tensor& x, int64_t axis, int64_t world_size) {
  if (axis < 0) axis += x.rank();
  return dispatch("all_gather", {x}, Attrs{{"axis", axis}, {"world_size", world_size}});
}

Tensor contiguous(const Tensor& x) { return x.is_contiguous() ? x : dispatch("copy", {x}); }
Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  KILN_CHECK(!xs.empty(), "concat", "needs at least one tensor");
  if (xs.size() == 1) return xs[0];
  return dispatch("concat", xs, Attrs{{"axis", axis}});
}
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  const int64_t a = normalize_axis(axis, x.rank(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  KILN_CHECK(total == x.dim(a), "split", "sizes ", to_string(sizes), " do not add up to dim ", a, " of ",
             to_string(x.shape()));
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(slice(x, a, start, start + s));
    start += s;
  }
  return out;
}
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t axis) {
  const int64_t a = normalize_axis(axis, x.rank(), "chunk");
  KILN_CHECK(chunks > 0 && x.dim(a) % chunks == 0, "chunk", "dim ", a, " of ", to_string(x.shape()),
             " is not divisible into ", chunks, " chunks");
  return split(x, std::vector<int64_t>(size_t(chunks), x.dim(a) / chunks), a);
}
Tensor gather(const Tensor& table, const Tensor& indices) { return dispatch("gather", {table, indices}); }
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value) {
  return dispatch("pad", {x}, Attrs{{"pads", pads}, {"value", value}});
}
Tensor upsample_nearest2x(const Tensor& x) {
  if (!is_channels_last(x)) return dispatch("upsample_nearest2x", {x});
  return from_nhwc(dispatch("upsample_nearest2x", {as_nhwc(x)}, Attrs{{"channels_last", int64_t(1)}}));
}

bool is_channels_last(const Tensor& x) {
  if (x.rank() != 4 || x.dim(1) == 1) return false;  // one channel: both layouts are the same bytes
  const int64_t c = x.dim(1), w = x.dim(3), h = x.dim(2);
  return x.strides() == Strides{h * w * c, 1, w * c, c};
}
Tensor to_channels_last(const Tensor& x) {
  KILN_CHECK(x.rank() == 4, "to_channels_last", "expects [N, C, H, W], got ", to_string(x.shape()));
  return is_channels_last(x) ? x : from_nhwc(contiguous(as_nhwc(x)));
}
Tensor to(const Tensor& x, const Device& device) { return x.device() == device ? x : to_device(x, device); }

}  // namespace kiln
