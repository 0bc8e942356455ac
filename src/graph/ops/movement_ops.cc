// Movement ops: views (reshape, permute, slice, flip, expand) that share their input's buffer,
// and data movement (copy, concat, pad, gather, nearest upsample) plus factories.
#include <cmath>

#include "graph/ops/ref_util.h"

namespace kiln {

namespace {

OutputMeta same_as_input(const std::vector<Tensor>& in, const Attrs&) {
  return OutputMeta{in[0].shape(), in[0].dtype()};
}

// Gathers the values of a strided view (shape/strides/offset over a dense input) for references.
std::vector<double> view_reference(const HostTensor& x, const ViewMeta& v) {
  std::vector<double> r(static_cast<size_t>(numel(v.shape)));
  for (size_t i = 0; i < r.size(); ++i) {
    const auto idx = ref::unravel(int64_t(i), v.shape);
    int64_t off = v.offset;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * v.strides[d];
    r[i] = x.data[size_t(off)];
  }
  return r;
}

// Registers a view op: the output's ViewMeta is computed from a contiguous tensor of the
// input's shape for the reference, and from the real input for execution.
void register_view(const char* name, std::function<ViewMeta(const Shape&, const Strides&, int64_t, const Attrs&)> fn) {
  OpDef def;
  def.name = name;
  def.kind = OpKind::movement;
  def.infer = [fn](const std::vector<Tensor>& in, const Attrs& attrs) {
    return OutputMeta{fn(in[0].shape(), in[0].strides(), in[0].offset(), attrs).shape, in[0].dtype()};
  };
  def.view = [fn](const Tensor& t, const Attrs& attrs) { return fn(t.shape(), t.strides(), t.offset(), attrs); };
  def.reference = [fn](const std::vector<HostTensor>& in, const Attrs& attrs, const OutputMeta&) {
    return view_reference(in[0], fn(in[0].shape, contiguous_strides(in[0].shape), 0, attrs));
  };
  register_op(std::move(def));
}

}  // namespace

// Strides that let `shape` view a tensor of shape `from`/`strides` without copying, if any
// (the dims of the new shape must split or merge runs of dims that are laid out densely).
std::optional<Strides> reshape_strides(const Shape& from, const Strides& strides, const Shape& to) {
  Strides out(to.size());
  if (numel(from) == 0) return contiguous_strides(to);
  size_t fi = 0, ti = 0;
  while (ti < to.size() || fi < from.size()) {
    // Skip size-1 dims, which place no constraint.
    if (ti < to.size() && to[ti] == 1) { out[ti] = 1; ++ti; continue; }
    if (fi < from.size() && from[fi] == 1) { ++fi; continue; }
    if (fi >= from.size() || ti >= to.size()) return std::nullopt;
    // Take a run of input dims that is contiguous with respect to itself.
    int64_t fsize = from[fi], tsize = to[ti];
    size_t fend = fi, tstart = ti;
    ++ti;
    while (fsize != tsize) {
      if (fsize < tsize) {
        size_t next = fend + 1;
        while (next < from.size() && from[next] == 1) ++next;
        if (next >= from.size() || strides[fend] != strides[next] * from[next]) return std::nullopt;
        fend = next;
        fsize *= from[fend];
      } else {
        if (ti >= to.size()) return std::nullopt;
        tsize *= to[ti++];
      }
    }
    int64_t st = strides[fend];
    for (size_t k = ti; k-- > tstart;) {
      out[k] = st;
      st *= to[k];
    }
    fi = fend + 1;
  }
  return out;
}

namespace {

ViewMeta reshape_view(const Shape& s, const Strides& st, int64_t off, const Attrs& attrs) {
  const auto& to = attrs.get_ints("shape");
  KILN_CHECK(numel(to) == numel(s), "reshape", "cannot reshape ", to_string(s), " (", numel(s),
             " elements) to ", to_string(to));
  auto strides = reshape_strides(s, st, to);
  KILN_CHECK(strides.has_value(), "reshape", "cannot view ", to_string(s), " as ", to_string(to),
             " without a copy (make it contiguous first)");
  return ViewMeta{to, *strides, off};
}

ViewMeta permute_view(const Shape& s, const Strides& st, int64_t off, const Attrs& attrs) {
  const auto& dims = attrs.get_ints("dims");
  KILN_CHECK(dims.size() == s.size(), "permute", "needs ", s.size(), " dims for ", to_string(s),
             ", got ", to_string(dims));
  std::vector<bool> seen(s.size());
  ViewMeta v{Shape(s.size()), Strides(s.size()), off};
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = normalize_axis(dims[i], int64_t(s.size()), "permute");
    KILN_CHECK(!seen[size_t(d)], "permute", "dim ", d, " repeated in ", to_string(dims));
    seen[size_t(d)] = true;
    v.shape[i] = s[size_t(d)];
    v.strides[i] = st[size_t(d)];
  }
  return v;
}

ViewMeta slice_view(const Shape& s, const Strides& st, int64_t off, const Attrs& attrs) {
  const int64_t axis = normalize_axis(attrs.get_int("axis"), int64_t(s.size()), "slice");
  const int64_t n = s[size_t(axis)], step = attrs.get_int("step", 1);
  KILN_CHECK(step > 0, "slice", "step must be positive, got ", step);
  auto clampi = [n](int64_t v) { return std::min(std::max(v < 0 ? v + n : v, int64_t(0)), n); };
  const int64_t start = clampi(attrs.get_int("start")), end = clampi(attrs.get_int("end"));
  ViewMeta v{s, st, off};
  v.shape[size_t(axis)] = end > start ? (end - start + step - 1) / step : 0;
  v.strides[size_t(axis)] = st[size_t(axis)] * step;
  v.offset = off + start * st[size_t(axis)];
  return v;
}

// Reverses one axis: a negative stride starting from the last element along it.
ViewMeta flip_view(const Shape& s, const Strides& st, int64_t off, const Attrs& attrs) {
  const int64_t axis = normalize_axis(attrs.get_int("axis"), int64_t(s.size()), "flip");
  ViewMeta v{s, st, off};
  const size_t a = size_t(axis);
  if (s[a] > 0) v.offset = off + (s[a] - 1) * st[a];
  v.strides[a] = -st[a];
  return v;
}

ViewMeta expand_view(const Shape& s, const Strides& st, int64_t off, const Attrs& attrs) {
  const auto& to = attrs.get_ints("shape");
  KILN_CHECK(to.size() >= s.size(), "expand", "cannot expand ", to_string(s), " to fewer dims ",
             to_string(to));
  ViewMeta v{Shape(to.size()), Strides(to.size(), 0), off};
  const size_t lead = to.size() - s.size();
  for (size_t i = 0; i < to.size(); ++i) {
    if (i < lead) {
      KILN_CHECK(to[i] >= 0, "expand", "new leading dim must be given, got ", to_string(to));
      v.shape[i] = to[i];
      continue;
    }
    const int64_t have = s[i - lead];
    const int64_t want = to[i] == -1 ? have : to[i];
    KILN_CHECK(want == have || have == 1, "expand", "cannot expand ", to_string(s), " to ", to_string(to));
    v.shape[i] = want;
    v.strides[i] = want == have ? st[i - lead] : 0;
  }
  return v;
}

void register_copy() {
  OpDef def;
  def.name = "copy";
  def.kind = OpKind::movement;
  def.strided_inputs = true;
  def.infer = same_as_input;
  def.reference = [](const std::vector<HostTensor>& in, const Attrs&, const OutputMeta&) { return in[0].data; };
  register_op(std::move(def));
}

void register_concat() {
  OpDef def;
  def.name = "concat";
  def.kind = OpKind::movement;
  def.max_inputs = -1;
  def.infer = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const int64_t axis = normalize_axis(attrs.get_int("axis"), in[0].rank(), "concat");
    Shape s = in[0].shape();
    for (size_t i = 1; i < in.size(); ++i) {
      KILN_CHECK(in[i].dtype() == in[0].dtype(), "concat", "input ", i, " is ", dtype_name(in[i].dtype()),
                 ", input 0 is ", dtype_name(in[0].dtype()));
      bool ok = in[i].rank() == in[0].rank();
      for (int64_t d = 0; ok && d < in[0].rank(); ++d)
        ok = d == axis || in[i].shape()[size_t(d)] == s[size_t(d)];
      KILN_CHECK(ok, "concat", "input ", i, " has shape ", to_string(in[i].shape()), ", expected ",
                 to_string(in[0].shape()), " except along axis ", axis);
      s[size_t(axis)] += in[i].shape()[size_t(axis)];
    }
    return OutputMeta{s, in[0].dtype()};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs& attrs, const OutputMeta& out) {
    const int64_t axis = normalize_axis(attrs.get_int("axis"), int64_t(out.shape.size()), "concat");
    std::vector<double> r(static_cast<size_t>(numel(out.shape)));
    for (size_t i = 0; i < r.size(); ++i) {
      auto idx = ref::unravel(int64_t(i), out.shape);
      size_t k = 0;
      while (idx[size_t(axis)] >= in[k].shape[size_t(axis)]) idx[size_t(axis)] -= in[k++].shape[size_t(axis)];
      int64_t flat = 0;
      for (size_t d = 0; d < idx.size(); ++d) flat = flat * in[k].shape[d] + idx[d];
      r[i] = in[k].data[size_t(flat)];
    }
    return r;
  };
  register_op(std::move(def));
}

void register_pad() {
  OpDef def;
  def.name = "pad";
  def.kind = OpKind::movement;
  def.infer = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const auto& pads = attrs.get_ints("pads");
    KILN_CHECK(int64_t(pads.size()) == 2 * in[0].rank(), "pad", "needs 2 pads per dim (", 2 * in[0].rank(),
               "), got ", pads.size());
    Shape s = in[0].shape();
    for (size_t d = 0; d < s.size(); ++d) {
      KILN_CHECK(pads[2 * d] >= 0 && pads[2 * d + 1] >= 0, "pad", "negative padding ", to_string(pads));
      s[d] += pads[2 * d] + pads[2 * d + 1];
    }
    return OutputMeta{s, in[0].dtype()};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs& attrs, const OutputMeta& out) {
    const auto& pads = attrs.get_ints("pads");
    const double value = attrs.get_float("value", 0.0);
    std::vector<double> r(size_t(numel(out.shape)), value);
    for (int64_t i = 0; i < in[0].numel(); ++i) {
      const auto idx = ref::unravel(i, in[0].shape);
      int64_t flat = 0;
      for (size_t d = 0; d < idx.size(); ++d) flat = flat * out.shape[d] + idx[d] + pads[2 * d];
      r[size_t(flat)] = in[0].data[size_t(i)];
    }
    return r;
  };
  register_op(std::move(def));
}

void register_gather() {
  OpDef def;
  def.name = "gather";
  def.kind = OpKind::movement;
  def.min_inputs = def.max_inputs = 2;
  def.infer = [](const std::vector<Tensor>& in, const Attrs&) {
    KILN_CHECK(in[0].rank() >= 1, "gather", "table must have at least one dim");
    KILN_CHECK(in[1].dtype() == DType::i32 || in[1].dtype() == DType::i64, "gather",
               "indices must be i32 or i64, got ", dtype_name(in[1].dtype()));
    Shape s = in[1].shape();
    s.insert(s.end(), in[0].shape().begin() + 1, in[0].shape().end());
    return OutputMeta{s, in[0].dtype()};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs&, const OutputMeta&) {
    const int64_t row = in[0].numel() / in[0].shape[0];
    std::vector<double> r;
    for (double id : in[1].data) {
      const int64_t k = int64_t(id);
      KILN_CHECK(k >= 0 && k < in[0].shape[0], "gather", "index ", k, " out of range [0, ", in[0].shape[0], ")");
      r.insert(r.end(), in[0].data.begin() + k * row, in[0].data.begin() + (k + 1) * row);
    }
    return r;
  };
  register_op(std::move(def));
}

// upsample_nearest2x: x [N, C, H, W] -> [N, C, 2H, 2W]; channels_last = 1: [N, H, W, C] ->
// [N, 2H, 2W, C] (a channels-last tensor's memory order, ops.h).
void register_upsample() {
  OpDef def;
  def.name = "upsample_nearest2x";
  def.kind = OpKind::movement;
  def.infer = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const bool cl = attrs.get_int("channels_last", 0) != 0;
    KILN_CHECK(in[0].rank() == 4, "upsample_nearest2x", "expects ", cl ? "[N,H,W,C]" : "[N,C,H,W]", ", got ",
               to_string(in[0].shape()));
    Shape s = in[0].shape();
    s[cl ? 1 : 2] *= 2;
    s[cl ? 2 : 3] *= 2;
    return OutputMeta{s, in[0].dtype()};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs& attrs, const OutputMeta& meta) {
    const bool cl = attrs.get_int("channels_last", 0) != 0;
    const HostTensor x = cl ? ref::nhwc_to_nchw(in[0]) : in[0];
    const Shape out = cl ? ref::nchw_shape(meta.shape) : meta.shape;
    std::vector<double> r(static_cast<size_t>(numel(out)));
    const int64_t h = x.shape[2], w = x.shape[3];
    for (size_t i = 0; i < r.size(); ++i) {
      const auto idx = ref::unravel(int64_t(i), out);
      r[i] = x.data[size_t(((idx[0] * x.shape[1] + idx[1]) * h + idx[2] / 2) * w + idx[3] / 2)];
    }
    return cl ? ref::nchw_to_nhwc(r, out) : r;
  };
  register_op(std::move(def));
}

void register_factories() {
  OpDef arange;
  arange.name = "arange";
  arange.kind = OpKind::factory;
  arange.min_inputs = arange.max_inputs = 0;
  arange.infer = [](const std::vector<Tensor>&, const Attrs& attrs) {
    const double start = attrs.get_float("start"), end = attrs.get_float("end"), step = attrs.get_float("step");
    KILN_CHECK(step != 0, "arange", "step must be non-zero");
    const int64_t n = std::max<int64_t>(0, int64_t(std::ceil((end - start) / step)));
    return OutputMeta{{n}, DType(attrs.get_int("dtype"))};
  };
  arange.reference = [](const std::vector<HostTensor>&, const Attrs& attrs, const OutputMeta& out) {
    std::vector<double> r(size_t(out.shape[0]));
    for (size_t i = 0; i < r.size(); ++i) r[i] = attrs.get_float("start") + double(i) * attrs.get_float("step");
    return r;
  };
  register_op(std::move(arange));

  OpDef full;
  full.name = "full";
  full.kind = OpKind::factory;
  full.min_inputs = full.max_inputs = 0;
  full.infer = [](const std::vector<Tensor>&, const Attrs& attrs) {
    const auto& s = attrs.get_ints("shape");
    for (int64_t d : s) KILN_CHECK(d >= 0, "full", "negative dimension in ", to_string(s));
    return OutputMeta{s, DType(attrs.get_int("dtype"))};
  };
  full.reference = [](const std::vector<HostTensor>&, const Attrs& attrs, const OutputMeta& out) {
    return std::vector<double>(size_t(numel(out.shape)), attrs.get_float("value"));
  };
  register_op(std::move(full));
}

}  // namespace

void register_movement_ops() {
  register_view("reshape", reshape_view);
  register_view("permute", permute_view);
  register_view("slice", slice_view);
  register_view("flip", flip_view);
  register_view("expand", expand_view);
  register_copy();
  register_concat();
  register_pad();
  register_gather();
  register_upsample();
  register_factories();
}

}  // namespace kiln
