// The ops that are not elementwise or GEMMs, on the built-in kernels (builtin_kernels.h): the
// host side reads attributes and shapes as the CPU kernels do and launches one entry.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "graph/conv2d_inputs.h"
#include "devices/cuda/builtin_kernels.h"
#include "devices/cuda/kernels/kernel_table.h"
#include "devices/cuda/launch.h"

namespace kiln::cuda {

namespace {

constexpr unsigned kThreads = 256;

int code(DType t) { return int(t); }
const void* optional_input(const KernelArgs& a, size_t i) { return a.in.size() > i ? a.in[i].data : nullptr; }
int optional_code(const KernelArgs& a, size_t i) { return a.in.size() > i ? code(a.in[i].dtype) : 0; }

// A value's bytes in dtype `t`, for the kernels that write it as they are.
unsigned long long bytes_of(double value, DType t) {
  unsigned long long bits = 0;
  store_from_double(&bits, t, 0, value);
  return bits;
}

KilnDims dims(const Shape& s) {
  KILN_CHECK(s.size() <= size_t(kMaxRank), "cuda", "rank ", s.size(), " (at most ", kMaxRank, ")");
  KilnDims d;
  for (size_t i = 0; i < s.size(); ++i) d.d[i] = s[i];
  return d;
}

int64_t product(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

void row_norm(const KernelArgs& a, int rms) {
  const TensorView& x = a.in[0];
  long long c = x.shape.empty() ? 1 : x.shape.back();
  const long long rows = c == 0 ? 0 : x.numel() / c;
  float eps = float(a.attrs->get_float("eps"));
  const void *xp = x.data, *w = optional_input(a, 1), *b = optional_input(a, 2);
  int xt = code(x.dtype), wt = optional_code(a, 1), bt = optional_code(a, 2), yt = code(a.out.dtype);
  void* y = a.out.data;
  launch_builtin("kiln_row_norm", rows, kThreads, 0, {&xp, &xt, &w, &wt, &b, &bt, &y, &yt, &c, &eps, &rms});
}
void layer_norm_kernel(const KernelArgs& a) { row_norm(a, 0); }
void rms_norm_kernel(const KernelArgs& a) { row_norm(a, 1); }

void softmax_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const size_t axis = size_t(normalize_axis(a.attrs->get_int("axis"), x.rank(), "softmax"));
  long long n = x.shape[axis], inner = product(x.shape, axis + 1, x.shape.size());
  const long long outer = product(x.shape, 0, axis);
  const void* xp = x.data;
  int xt = code(x.dtype), yt = code(a.out.dtype);
  void* y = a.out.data;
  launch_builtin("kiln_softmax", outer * inner, kThreads, 0, {&xp, &xt, &y, &yt, &n, &inner});
}

template <int Kind>
void reduce_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const int64_t rank = x.rank();
  std::vector<int64_t> axes;
  for (int64_t ax : a.attrs->get_ints("axes")) axes.push_back(normalize_axis(ax, rank, "reduce"));
  if (axes.empty())
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  const Strides dense = contiguous_strides(x.shape);
  Shape kshape, rshape;
  Strides kstride, rstride;
  for (int64_t d = 0; d < rank; ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    (reduced ? rshape : kshape).push_back(x.shape[size_t(d)]);
    (reduced ? rstride : kstride).push_back(dense[size_t(d)]);
  }
  KilnDims ks = dims(kshape), kst = dims(kstride), rs = dims(rshape), rst = dims(rstride);
  int krank = int(kshape.size()), rrank = int(rshape.size()), kind = Kind;
  long long nred = numel(rshape), correction = a.attrs->get_int("correction", 1);
  const void* xp = x.data;
  int xt = code(x.dtype), yt = code(a.out.dtype);
  void* y = a.out.data;
  launch_builtin("kiln_reduce", numel(kshape), kThreads, 0,
                 {&xp, &xt, &y, &yt, &ks, &kst, &krank, &rs, &rst, &rrank, &nred, &kind, &correction});
}

void group_norm_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  int cl = a.attrs->get_int("channels_last", 0) != 0;
  long long C = x.shape[cl ? 3 : 1], G = a.attrs->get_int("groups");
  const long long N = x.shape[0];
  long long hw = N * C == 0 ? 0 : x.numel() / (N * C);
  float eps = float(a.attrs->get_float("eps"));
  int silu = a.attrs->get_string("activation", "") == "silu";
  const void *xp = x.data, *w = optional_input(a, 1), *b = optional_input(a, 2);
  int xt = code(x.dtype), wt = optional_code(a, 1), bt = optional_code(a, 2), yt = code(a.out.dtype);
  void* y = a.out.data;
  launch_builtin("kiln_group_norm", N * G, kThreads, 0,
                 {&xp, &xt, &w, &wt, &b, &bt, &y, &yt, &C, &hw, &G, &eps, &silu, &cl});
}

void concat_kernel(const KernelArgs& a) {
  const size_t axis = size_t(normalize_axis(a.attrs->get_int("axis"), a.out.rank(), "concat"));
  long long a_out = a.out.shape[axis], at = 0, inner = product(a.out.shape, axis + 1, a.out.shape.size());
  int es = int(dtype_size(a.out.dtype));
  void* y = a.out.data;
  for (const TensorView& x : a.in) {
    long long n = x.numel(), len = x.shape[axis];
    const void* xp = x.data;
    launch_builtin("kiln_concat_part", grid_for(n, kThreads), kThreads, 0, {&xp, &y, &es, &n, &len, &inner, &a_out, &at});
    at += len;
  }
}

void pad_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  const auto& pads = a.attrs->get_ints("pads");
  Shape before;
  for (size_t d = 0; d < x.shape.size(); ++d) before.push_back(pads[2 * d]);
  KilnDims os = dims(a.out.shape), xs = dims(x.shape), bs = dims(before);
  int es = int(dtype_size(x.dtype)), rank = int(x.rank());
  long long n = a.out.numel();
  unsigned long long value = bytes_of(a.attrs->get_float("value", 0.0), x.dtype);
  const void* xp = x.data;
  void* y = a.out.data;
  launch_builtin("kiln_pad", grid_for(n, kThreads), kThreads, 0, {&xp, &y, &es, &n, &os, &xs, &bs, &rank, &value});
}

void gather_kernel(const KernelArgs& a) {
  const TensorView &table = a.in[0], &idx = a.in[1];
  long long rows = table.shape[0], row = rows == 0 ? 0 : table.numel() / rows, n = a.out.numel();
  int it = code(idx.dtype), es = int(dtype_size(table.dtype));
  const void *tp = table.data, *ip = idx.data;
  void* y = a.out.data;
  launch_builtin("kiln_gather", grid_for(n, kThreads), kThreads, 0, {&tp, &ip, &it, &y, &es, &n, &row, &rows});
}

void upsample_kernel(const KernelArgs& a) {
  const TensorView& x = a.in[0];
  int cl = a.attrs->get_int("channels_last", 0) != 0;
  long long C = x.shape[cl ? 3 : 1], H = x.shape[cl ? 1 : 2], W = x.shape[cl ? 2 : 3], n = a.out.numel();
  int es = int(dtype_size(x.dtype));
  const void* xp = x.data;
  void* y = a.out.data;
  launch_builtin("kiln_upsample2x", grid_for(n, kThreads), kThreads, 0, {&xp, &y, &es, &n, &C, &H, &W, &cl});
}

// A factory's output dtype (it has no input for supports() to see).
void check_factory_dtype(const char* op, DType t) {
  KILN_CHECK(codegen_supports(t), op, "the CUDA kernel cannot store ", dtype_name(t));
}

void arange_kernel(const KernelArgs& a) {
  check_factory_dtype("arange", a.out.dtype);
  double start = a.attrs->get_float("start"), step = a.attrs->get_float("step");
  long long n = a.out.numel();
  int yt = code(a.out.dtype);
  void* y = a.out.data;
  launch_builtin("kiln_arange", grid_for(n, kThreads), kThreads, 0, {&y, &yt, &n, &start, &step});
}

void full_kernel(const KernelArgs& a) {
  check_factory_dtype("full", a.out.dtype);
  long long n = a.out.numel();
  int es = int(dtype_size(a.out.dtype));
  unsigned long long value = bytes_of(a.attrs->get_float("value"), a.out.dtype);
  void* y = a.out.data;
  launch_builtin("kiln_fill", grid_for(n, kThreads), kThreads, 0, {&y, &es, &n, &value});
}

// Strides of a view of `shape` broadcast to rank 4 (right-aligned, 0 where it broadcasts).
KilnDims broadcast4(const TensorView& v) {
  KilnDims d;
  const int lead = 4 - int(v.shape.size());
  for (int i = 0; i < int(v.shape.size()); ++i) d.d[lead + i] = v.shape[size_t(i)] == 1 ? 0 : v.strides[size_t(i)];
  return d;
}

void sdpa_kernel(const KernelArgs& a) {
  const TensorView &q = a.in[0], &k = a.in[1], &v = a.in[2];
  long long H = q.shape[1], hkv = k.shape[1], lq = q.shape[2], lk = k.shape[2], dq = q.shape[3], dv = v.shape[3];
  const size_t shared = size_t(lk) * sizeof(float);
  float scale = float(a.attrs->get_float("scale", 1.0 / std::sqrt(double(dq))));
  KilnDims qs = broadcast4(q), ks = broadcast4(k), vs = broadcast4(v), os = broadcast4(a.out), ms;
  const void *qp = q.data, *kp = k.data, *vp = v.data, *mp = nullptr;
  int t = code(q.dtype), mt = 0, yt = code(a.out.dtype);
  if (a.in.size() > 3) {
    mp = a.in[3].data;
    mt = code(a.in[3].dtype);
    ms = broadcast4(a.in[3]);
  }
  void* y = a.out.data;
  launch_builtin("kiln_sdpa", q.shape[0] * H * lq, kThreads, shared,
                 {&qp, &kp, &vp, &mp, &t, &mt, &y, &yt, &H, &hkv, &lq, &lk, &dq, &dv, &qs, &ks, &vs, &ms, &os, &scale});
}

void conv2d_kernel(const KernelArgs& a) {
  const TensorView &x = a.in[0], &w = a.in[1];
  int cl = a.attrs->get_int("channels_last", 0) != 0;
  const auto &st = a.attrs->get_ints("stride"), &pad = a.attrs->get_ints("padding");
  long long C = x.shape[cl ? 3 : 1], H = x.shape[cl ? 1 : 2], W = x.shape[cl ? 2 : 3];
  long long O = w.shape[0], KH = w.shape[2], KW = w.shape[3];
  long long OH = a.out.shape[cl ? 1 : 2], OW = a.out.shape[cl ? 2 : 3], n = a.out.numel();
  long long sh = st[0], sw = st[1], ph = pad[0], pw = pad[1];
  // A residual is added to the result (in y's dtype and element order).
  const Conv2dInputs inputs = conv2d_inputs(a.in.size(), *a.attrs);
  const void *xp = x.data, *wp = w.data, *bp = inputs.bias ? a.in[2].data : nullptr;
  const void* rp = inputs.residual ? a.in.back().data : nullptr;
  int t = code(x.dtype), yt = code(a.out.dtype);
  void* y = a.out.data;
  launch_builtin("kiln_conv2d", grid_for(n, kThreads), kThreads, 0,
                 {&xp, &wp, &bp, &rp, &t, &y, &yt, &n, &C, &H, &W, &O, &KH, &KW, &OH, &OW, &sh, &sw, &ph, &pw, &cl});
}

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }
bool floats(const std::vector<OperandMeta>& in) {
  for (const OperandMeta& m : in)
    if (!is_float(m.dtype)) return false;
  return true;
}
// Inputs of one float dtype (the kernel reads them all with one code; a mask may differ).
bool same_float(const std::vector<OperandMeta>& in) {
  return floats(in) && std::all_of(in.begin(), in.begin() + std::min<size_t>(in.size(), 3),
                                   [&](const OperandMeta& m) { return m.dtype == in[0].dtype; });
}
bool scalar_elements(const std::vector<OperandMeta>& in) {
  for (const OperandMeta& m : in)
    if (is_storage_only(m.dtype) || int(m.shape.size()) > kMaxRank) return false;
  return true;
}
bool reducible(const std::vector<OperandMeta>& in) {
  return codegen_supports(in[0].dtype) && int(in[0].shape.size()) <= kMaxRank;
}
bool always(const std::vector<OperandMeta>&) { return true; }

}  // namespace

void add_builtin_kernels(KernelTable& table) {
  table["layer_norm"] = {&layer_norm_kernel, floats};
  table["rms_norm"] = {&rms_norm_kernel, floats};
  table["softmax"] = {&softmax_kernel, floats};
  table["sum"] = {&reduce_kernel<0>, reducible};
  table["mean"] = {&reduce_kernel<1>, reducible};
  table["max"] = {&reduce_kernel<2>, reducible};
  table["var"] = {&reduce_kernel<3>, reducible};
  table["group_norm"] = {&group_norm_kernel, floats};
  table["concat"] = {&concat_kernel, scalar_elements};
  table["pad"] = {&pad_kernel, scalar_elements};
  table["gather"] = {&gather_kernel, scalar_elements};
  table["upsample_nearest2x"] = {&upsample_kernel, scalar_elements};
  table["arange"] = {&arange_kernel, always};
  table["full"] = {&full_kernel, always};
  table["sdpa"] = {&sdpa_kernel, same_float};
  table["conv2d"] = {&conv2d_kernel, same_float};
}

const KernelTable& cuda_kernels() {
  static const KernelTable table = [] {
    KernelTable t;
    add_elementwise_kernels(t);
    add_contraction_kernels(t);
    add_builtin_kernels(t);
    return t;
  }();
  return table;
}

}  // namespace kiln::cuda
