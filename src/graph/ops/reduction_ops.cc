// Reductions (sum, mean, max, var) and the normalisations built on them
// (softmax, LayerNorm, RMSNorm, GroupNorm).
#include <algorithm>
#include <cmath>
#include <limits>

#include "graph/ops/ref_util.h"

namespace kiln {

namespace ref {
std::vector<int64_t> reduction_axes(const std::vector<int64_t>& axes, int64_t rank, const char* where) {
  std::vector<int64_t> out;
  if (axes.empty()) {
    for (int64_t i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (int64_t a : axes) out.push_back(normalize_axis(a, rank, where));
  std::sort(out.begin(), out.end());
  KILN_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), where, "axis repeated");
  return out;
}
}  // namespace ref

namespace {

enum class Reduce { sum, mean, max, var };

Shape reduced_shape(const Shape& s, const std::vector<int64_t>& axes, bool keepdim) {
  Shape out;
  for (int64_t i = 0; i < int64_t(s.size()); ++i) {
    const bool reduced = std::binary_search(axes.begin(), axes.end(), i);
    if (!reduced) out.push_back(s[size_t(i)]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

void register_reduce(const char* name, Reduce kind) {
  OpDef def;
  def.name = name;
  def.kind = OpKind::reduction;
  def.infer = [name](const std::vector<Tensor>& in, const Attrs& attrs) {
    const auto axes = ref::reduction_axes(attrs.get_ints("axes"), in[0].rank(), name);
    for (int64_t a : axes)
      KILN_CHECK(in[0].shape()[size_t(a)] > 0, name, "cannot reduce over empty axis ", a, " of ",
                 to_string(in[0].shape()));
    const DType t = in[0].dtype();
    return OutputMeta{reduced_shape(in[0].shape(), axes, attrs.get_int("keepdim", 0) != 0),
                      is_floating(t) ? t : DType::f32};
  };
  def.reference = [name, kind](const std::vector<HostTensor>& in, const Attrs& attrs, const OutputMeta& out) {
    const HostTensor& x = in[0];
    const auto axes = ref::reduction_axes(attrs.get_ints("axes"), int64_t(x.shape.size()), name);
    // Group input elements by their output position (kept dims only).
    Shape kept = reduced_shape(x.shape, axes, true);
    const int64_t n_out = numel(kept);
    std::vector<std::vector<double>> groups(static_cast<size_t>(n_out));
    for (int64_t i = 0; i < x.numel(); ++i) {
      auto idx = ref::unravel(i, x.shape);
      for (int64_t a : axes) idx[size_t(a)] = 0;
      int64_t flat = 0;
      for (size_t d = 0; d < kept.size(); ++d) flat = flat * kept[d] + idx[d];
      groups[size_t(flat)].push_back(x.data[size_t(i)]);
    }
    const int64_t correction = attrs.get_int("correction", 1);
    std::vector<double> r(static_cast<size_t>(numel(out.shape)));
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& v = groups[g];
      double s = 0, m = -std::numeric_limits<double>::infinity();
      for (double e : v) s += e, m = std::max(m, e);
      const double mean = s / double(v.size());
      double ss = 0;
      for (double e : v) ss += (e - mean) * (e - mean);
      switch (kind) {
        case Reduce::sum: r[g] = s; break;
        case Reduce::mean: r[g] = mean; break;
        case Reduce::max: r[g] = m; break;
        case Reduce::var: r[g] = ss / double(int64_t(v.size()) - correction); break;
      }
    }
    return r;
  };
  register_op(std::move(def));
}

void check_float(const Tensor& t, const char* op) {
  KILN_CHECK(is_floating(t.dtype()), op, "expects a floating-point tensor, got ", t.describe());
}

// Checks an affine parameter of a norm: 1-D with `n` entries.
void check_param(const Tensor& p, int64_t n, const char* op, const char* what) {
  KILN_CHECK(p.rank() == 1 && p.dim(0) == n, op, what, " must have shape [", n, "], got ",
             to_string(p.shape()));
}

void register_softmax() {
  OpDef def;
  def.name = "softmax";
  def.kind = OpKind::reduction;
  def.infer = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    check_float(in[0], "softmax");
    normalize_axis(attrs.get_int("axis"), in[0].rank(), "softmax");
    return OutputMeta{in[0].shape(), in[0].dtype()};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs& attrs, const OutputMeta&) {
    const HostTensor& x = in[0];
    const int64_t axis = normalize_axis(attrs.get_int("axis"), int64_t(x.shape.size()), "softmax");
    int64_t inner = 1;
    for (size_t d = size_t(axis) + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
    const int64_t n = x.shape[size_t(axis)], outer = x.numel() / std::max<int64_t>(1, n * inner);
    std::vector<double> r(x.data.size());
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) {
        auto at = [&](int64_t k) { return size_t((o * n + k) * inner + j); };
        double m = -std::numeric_limits<double>::infinity(), s = 0;
        for (int64_t k = 0; k < n; ++k) m = std::max(m, x.data[at(k)]);
        for (int64_t k = 0; k < n; ++k) s += std::exp(x.data[at(k)] - m);
        for (int64_t k = 0; k < n; ++k) r[at(k)] = std::exp(x.data[at(k)] - m) / s;
      }
    return r;
  };
  register_op(std::move(def));
}

// LayerNorm / RMSNorm over the last dim; inputs (x [, weight [, bias]]).
void register_row_norm(const char* name, bool rms) {
  OpDef def;
  def.name = name;
  def.kind = OpKind::reduction;
  def.max_inputs = rms ? 2 : 3;
  def.infer = [name](const std::vector<Tensor>& in, const Attrs&) {
    check_float(in[0], name);
    KILN_CHECK(in[0].rank() >= 1, name, "needs at least one dimension");
    for (size_t i = 1; i < in.size(); ++i) check_param(in[i], in[0].dim(-1), name, i == 1 ? "weight" : "bias");
    return OutputMeta{in[0].shape(), in[0].dtype()};
  };
  def.reference = [rms](const std::vector<HostTensor>& in, const Attrs& attrs, const OutputMeta&) {
    const HostTensor& x = in[0];
    const int64_t c = x.shape.back(), rows = x.numel() / std::max<int64_t>(c, 1);
    const double eps = attrs.get_float("eps");
    std::vector<double> r(x.data.size());
    for (int64_t i = 0; i < rows; ++i) {
      const double* row = x.data.data() + i * c;
      double mean = 0, var = 0;
      for (int64_t j = 0; j < c; ++j) mean += row[j];
      mean = rms ? 0.0 : mean / double(c);
      for (int64_t j = 0; j < c; ++j) var += (row[j] - mean) * (row[j] - mean);
      const double inv = 1.0 / std::sqrt(var / double(c) + eps);
      for (int64_t j = 0; j < c; ++j) {
        double v = (row[j] - mean) * inv;
        if (in.size() > 1) v *= in[1].data[size_t(j)];
        if (in.size() > 2) v += in[2].data[size_t(j)];
        r[size_t(i * c + j)] = v;
      }
    }
    return r;
  };
  register_op(std::move(def));
}

// group_norm: x [N, C, ...], optional weight and bias [C]; attrs groups, eps; activation "silu"
// applies SiLU to the result (GroupNorm then SiLU in one pass, as every VAE resnet does);
// channels_last = 1: x is [N, H, W, C] (a channels-last tensor's memory order, ops.h).
void register_group_norm() {
  OpDef def;
  def.name = "group_norm";
  def.kind = OpKind::reduction;
  def.max_inputs = 3;
  def.infer = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    check_float(in[0], "group_norm");
    const bool cl = attrs.get_int("channels_last", 0) != 0;
    KILN_CHECK(cl ? in[0].rank() == 4 : in[0].rank() >= 2, "group_norm", "expects ", cl ? "[N, H, W, C]" : "[N, C, ...]",
               ", got ", to_string(in[0].shape()));
    const int64_t c = in[0].dim(cl ? 3 : 1), g = attrs.get_int("groups");
    KILN_CHECK(g > 0 && c % g == 0, "group_norm", "channels ", c, " not divisible by groups ", g);
    const std::string act = attrs.get_string("activation", "");
    KILN_CHECK(act.empty() || act == "silu", "group_norm", "activation '", act, "' is not supported (only silu)");
    for (size_t i = 1; i < in.size(); ++i) check_param(in[i], c, "group_norm", i == 1 ? "weight" : "bias");
    return OutputMeta{in[0].shape(), in[0].dtype()};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs& attrs, const OutputMeta&) {
    const bool cl = attrs.get_int("channels_last", 0) != 0;
    const HostTensor x = cl ? ref::nhwc_to_nchw(in[0]) : in[0];
    const bool silu = attrs.get_string("activation", "") == "silu";
    const int64_t n = x.shape[0], c = x.shape[1], g = attrs.get_int("groups");
    const int64_t hw = x.numel() / std::max<int64_t>(n * c, 1), per = c / g * hw;
    const double eps = attrs.get_float("eps");
    std::vector<double> r(x.data.size());
    for (int64_t b = 0; b < n * g; ++b) {
      const double* p = x.data.data() + b * per;
      double mean = 0, var = 0;
      for (int64_t j = 0; j < per; ++j) mean += p[j];
      mean /= double(per);
      for (int64_t j = 0; j < per; ++j) var += (p[j] - mean) * (p[j] - mean);
      const double inv = 1.0 / std::sqrt(var / double(per) + eps);
      for (int64_t j = 0; j < per; ++j) {
        const int64_t ch = (b % g) * (c / g) + j / hw;
        double v = (p[j] - mean) * inv;
        if (in.size() > 1) v *= in[1].data[size_t(ch)];
        if (in.size() > 2) v += in[2].data[size_t(ch)];
        if (silu) v = v / (1 + std::exp(-v));
        r[size_t(b * per + j)] = v;
      }
    }
    return cl ? ref::nchw_to_nhwc(r, x.shape) : r;
  };
  register_op(std::move(def));
}

}  // namespace

void register_reduction_ops() {
  register_reduce("sum", Reduce::sum);
  register_reduce("mean", Reduce::mean);
  register_reduce("max", Reduce::max);
  register_reduce("var", Reduce::var);
  register_softmax();
  register_row_norm("layer_norm", false);
  register_row_norm("rms_norm", true);
  register_group_norm();
}

}  // namespace kiln
