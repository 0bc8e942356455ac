// Reduction kernels (sum, mean, max, var over any axes) and the normalisations, which
// delegate their row math to norms.h. Inputs arrive dense (the dispatcher copies views).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "core/error.h"
#include "devices/cpu/kernels/f32_io.h"
#include "devices/cpu/kernels/kernel_table.h"
#include "devices/cpu/kernels/norms.h"
#include "devices/cpu/kernels/strided.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

namespace {

enum class Reduce { sum, mean, max, var };

std::vector<int64_t> axes_of(const KernelArgs& args) {
  const auto& given = args.attrs->get_ints("axes");
  const int64_t rank = args.in[0].rank();
  std::vector<int64_t> axes;
  if (given.empty()) {
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  } else {
    for (int64_t a : given) axes.push_back(a < 0 ? a + rank : a);
    std::sort(axes.begin(), axes.end());
  }
  return axes;
}

// Reduces one gathered row with the SIMD row reductions of norms.h.
float reduce_row(Reduce kind, const float* v, int64_t n, int64_t correction) {
  switch (kind) {
    case Reduce::max: return row_max(v, n);
    case Reduce::sum: return row_sum(v, n);
    case Reduce::mean: return row_sum(v, n) / float(n);
    case Reduce::var: {
      const float mean = row_sum(v, n) / float(n);
      return row_squared_deviation_sum(v, n, mean) / float(n - correction);
    }
  }
  return 0;
}

void reduce_kernel(const KernelArgs& args, Reduce kind) {
  const TensorView& x = args.in[0];
  const auto axes = axes_of(args);
  const int64_t correction = args.attrs->get_int("correction", 1);
  // Split the input's dims into kept (outer) and reduced (inner) ones.
  const Strides xs = contiguous_strides(x.shape);
  Shape kept_shape, red_shape;
  Strides kept_strides, red_strides;
  for (int64_t d = 0; d < x.rank(); ++d) {
    const bool red = std::binary_search(axes.begin(), axes.end(), d);
    (red ? red_shape : kept_shape).push_back(x.shape[size_t(d)]);
    (red ? red_strides : kept_strides).push_back(xs[size_t(d)]);
  }
  const int64_t n_out = numel(kept_shape), n_red = numel(red_shape);
  const StridedLoop red = make_strided_loop(red_shape, {red_strides});
  const StridedLoop kept = make_strided_loop(kept_shape, {kept_strides});
  F32In in(x);
  F32Out out(args.out);
  const float* src = in.get();
  float* dst = out.get();
#pragma omp parallel if (n_out * n_red >= (1 << 15))
  {
    std::vector<float> row(static_cast<size_t>(n_red));
#pragma omp for schedule(static)
    for (int64_t o = 0; o < n_out; ++o) {
      const int64_t base = kept.offset(0, o / kept.inner) + (o % kept.inner) * kept.inner_stride[0];
      const float* r = src + base;
      if (!(red.outer.empty() && red.inner_stride[0] == 1)) {  // not one dense run: gather it
        float* g = row.data();
        for (int64_t p = 0, k = 0; p < red.outer_count(); ++p) {
          const float* s = src + base + red.offset(0, p);
          for (int64_t i = 0; i < red.inner; ++i) g[k++] = s[i * red.inner_stride[0]];
        }
        r = g;
      }
      dst[o] = reduce_row(kind, r, n_red, correction);
    }
  }
}

template <Reduce K>
void reduce_entry(const KernelArgs& args) { reduce_kernel(args, K); }

void softmax_kernel(const KernelArgs& args) {
  const TensorView& x = args.in[0];
  const int64_t axis = normalize_axis(args.attrs->get_int("axis"), x.rank(), "softmax");
  F32In in(x);
  F32Out out(args.out);
  const int64_t n = x.shape[size_t(axis)];
  int64_t inner = 1;
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.shape[size_t(d)];
  const int64_t outer = n * inner != 0 ? x.numel() / (n * inner) : 0;
  if (inner == 1) return softmax_rows(in.get(), out.get(), outer, n);
  // Softmax over a non-last axis: gather each lane into a row, normalise, scatter back.
  std::vector<float> row(static_cast<size_t>(n)), res(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      for (int64_t k = 0; k < n; ++k) row[size_t(k)] = in.get()[(o * n + k) * inner + j];
      softmax_rows(row.data(), res.data(), 1, n);
      for (int64_t k = 0; k < n; ++k) out.get()[(o * n + k) * inner + j] = res[size_t(k)];
    }
}

// Input i (a normalisation's optional weight or bias) as f32, or null when the op has fewer inputs.
class OptionalParam {
 public:
  OptionalParam(const KernelArgs& args, size_t i) {
    if (i < args.in.size()) in_.emplace(args.in[i]);
  }
  const float* get() const { return in_ ? in_->get() : nullptr; }

 private:
  std::optional<F32In> in_;
};

void layer_norm_kernel(const KernelArgs& args) {
  const TensorView& x = args.in[0];
  const OptionalParam w(args, 1), b(args, 2);
  const int64_t c = x.shape.back();
  layer_norm_rows(x.data, x.dtype, w.get(), b.get(), args.out.data, args.out.dtype, c ? x.numel() / c : 0, c,
                  float(args.attrs->get_float("eps")));
}

void rms_norm_kernel(const KernelArgs& args) {
  const TensorView& x = args.in[0];
  const OptionalParam w(args, 1);
  const int64_t c = x.shape.back();
  rms_norm_rows(x.data, x.dtype, w.get(), args.out.data, args.out.dtype, c ? x.numel() / c : 0, c,
                float(args.attrs->get_float("eps")));
}

void group_norm_kernel(const KernelArgs& args) {
  const TensorView& x = args.in[0];
  const OptionalParam w(args, 1), b(args, 2);
  const int64_t groups = args.attrs->get_int("groups");
  const float eps = float(args.attrs->get_float("eps"));
  const bool silu = args.attrs->get_string("activation", "") == "silu";
  if (args.attrs->get_int("channels_last", 0)) {  // x [N, H, W, C], read and written in its dtype
    group_norm_nhwc(x.data, x.dtype, w.get(), b.get(), args.out.data, args.out.dtype, x.shape[0],
                    x.shape[1] * x.shape[2], x.shape[3], groups, eps, silu);
    return;
  }
  F32In in(x);
  F32Out out(args.out);
  const int64_t n = x.shape[0], c = x.shape[1];
  group_norm_nchw(in.get(), w.get(), b.get(), out.get(), n, c, n * c != 0 ? x.numel() / (n * c) : 0, groups, eps,
                  silu, group_norm_math_for(x.dtype));
}

}  // namespace

void add_reduction_kernels(KernelTable& table) {
  table["sum"] = &reduce_entry<Reduce::sum>;
  table["mean"] = &reduce_entry<Reduce::mean>;
  table["max"] = &reduce_entry<Reduce::max>;
  table["var"] = &reduce_entry<Reduce::var>;
  table["softmax"] = &softmax_kernel;
  table["layer_norm"] = &layer_norm_kernel;
  table["rms_norm"] = &rms_norm_kernel;
  table["group_norm"] = &group_norm_kernel;
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
