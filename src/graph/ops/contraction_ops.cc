// Contractions (matmul, linear, conv2d) and scaled-dot-product attention.
#include <cmath>
#include <limits>

#include "graph/conv2d_inputs.h"
#include "graph/ops/ref_util.h"

namespace kiln {

namespace {

void check_float(const Tensor& t, const char* op, const char* what) {
  KILN_CHECK(is_floating(t.dtype()), op, what, " must be floating point, got ", t.describe());
}

// matmul: a [..., M, K] (or [..., K, M] with transpose_a), b [..., K, N] (or [..., N, K]);
// batch dims broadcast.
void register_matmul() {
  OpDef def;
  def.name = "matmul";
  def.kind = OpKind::contraction;
  def.min_inputs = def.max_inputs = 2;
  def.infer = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Tensor &a = in[0], &b = in[1];
    check_float(a, "matmul", "a");
    check_float(b, "matmul", "b");
    KILN_CHECK(a.rank() >= 2 && b.rank() >= 2, "matmul", "needs operands of rank >= 2: ",
               to_string(a.shape()), " x ", to_string(b.shape()));
    const bool ta = attrs.get_int("transpose_a", 0), tb = attrs.get_int("transpose_b", 0);
    const int64_t m = ta ? a.dim(-1) : a.dim(-2), ka = ta ? a.dim(-2) : a.dim(-1);
    const int64_t kb = tb ? b.dim(-1) : b.dim(-2), n = tb ? b.dim(-2) : b.dim(-1);
    KILN_CHECK(ka == kb, "matmul", "inner dims differ: ", to_string(a.shape()), (ta ? "^T" : ""), " x ",
               to_string(b.shape()), (tb ? "^T" : ""));
    Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                   Shape(b.shape().begin(), b.shape().end() - 2), "matmul");
    batch.push_back(m);
    batch.push_back(n);
    return OutputMeta{batch, promote(a.dtype(), b.dtype())};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs& attrs, const OutputMeta& out) {
    const HostTensor &a = in[0], &b = in[1];
    const bool ta = attrs.get_int("transpose_a", 0), tb = attrs.get_int("transpose_b", 0);
    const size_t r = out.shape.size();
    const int64_t k = ta ? a.shape[a.shape.size() - 2] : a.shape.back();
    std::vector<double> res(static_cast<size_t>(numel(out.shape)));
    for (size_t i = 0; i < res.size(); ++i) {
      auto idx = ref::unravel(int64_t(i), out.shape);
      const int64_t row = idx[r - 2], col = idx[r - 1];
      double s = 0;
      for (int64_t j = 0; j < k; ++j) {
        idx[r - 2] = ta ? j : row;
        idx[r - 1] = ta ? row : j;
        const double av = ref::at_broadcast(a, idx);
        idx[r - 2] = tb ? col : j;
        idx[r - 1] = tb ? j : col;
        s += av * ref::at_broadcast(b, idx);
      }
      res[i] = s;
    }
    return res;
  };
  register_op(std::move(def));
}

// linear: x [..., K], weight [N, K] (PyTorch layout), optional bias [N] -> [..., N].
void register_linear() {
  OpDef def;
  def.name = "linear";
  def.kind = OpKind::contraction;
  def.quantized_input = 1;
  def.min_inputs = 2;
  def.max_inputs = 3;
  def.infer = [](const std::vector<Tensor>& in, const Attrs&) {
    const Tensor &x = in[0], &w = in[1];
    check_float(x, "linear", "input");
    // A weight may also be held in a storage type (fp8, ggml blocks: core/quant_blocks.h); the
    // linear then computes in x's dtype from the dequantized values.
    KILN_CHECK(is_floating(w.dtype()) || is_storage_only(w.dtype()), "linear",
               "weight must be floating point or a quantized storage type, got ", w.describe());
    KILN_CHECK(!is_storage_only(w.dtype()) || w.is_contiguous(), "linear", "a quantized weight must be dense, got ",
               w.describe());
    KILN_CHECK(x.rank() >= 1 && w.rank() == 2, "linear", "expects input [..., K] and weight [N, K], got ",
               to_string(x.shape()), " and ", to_string(w.shape()));
    KILN_CHECK(x.dim(-1) == w.dim(1), "linear", "inner dims differ: input ", to_string(x.shape()),
               " x weight ", to_string(w.shape()), "^T");
    if (in.size() > 2)
      KILN_CHECK(in[2].rank() == 1 && in[2].dim(0) == w.dim(0), "linear", "bias must have shape [", w.dim(0),
                 "], got ", to_string(in[2].shape()));
    Shape s = x.shape();
    s.back() = w.dim(0);
    return OutputMeta{s, is_storage_only(w.dtype()) ? x.dtype() : promote(x.dtype(), w.dtype())};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs&, const OutputMeta& out) {
    const int64_t k = in[0].shape.back(), n = in[1].shape[0], rows = in[0].numel() / std::max<int64_t>(k, 1);
    std::vector<double> r(static_cast<size_t>(numel(out.shape)));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = in.size() > 2 ? in[2].data[size_t(j)] : 0.0;
        for (int64_t l = 0; l < k; ++l) s += in[0].data[size_t(i * k + l)] * in[1].data[size_t(j * k + l)];
        r[size_t(i * n + j)] = s;
      }
    return r;
  };
  register_op(std::move(def));
}

// conv2d: x [N, C, H, W], weight [O, C, KH, KW], optional bias [O]; attrs stride [2], padding [2].
// With channels_last = 1, x is [N, H, W, C] and the output [N, OH, OW, O] (the memory order of a
// channels-last tensor, ops.h: the public conv2d() passes such tensors this way). With residual = 1
// the last input is added to the result: a tensor of the output's shape (in the same order) and
// dtype, as a ResNet block adds its skip path to its last convolution.
void register_conv2d() {
  OpDef def;
  def.name = "conv2d";
  def.kind = OpKind::contraction;
  def.min_inputs = 2;
  def.max_inputs = 4;
  def.infer = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Tensor &x = in[0], &w = in[1];
    const Conv2dInputs inputs = conv2d_inputs(in.size(), attrs);
    const size_t operands = in.size() - (inputs.residual ? 1 : 0);  // x, weight and the bias if any
    KILN_CHECK(operands >= 2 && operands <= 3, "conv2d", "expects x, weight, an optional bias",
               inputs.residual ? " and the residual" : "", ", got ", in.size(), " inputs");
    check_float(x, "conv2d", "input");
    check_float(w, "conv2d", "weight");
    const bool cl = attrs.get_int("channels_last", 0) != 0;
    KILN_CHECK(x.rank() == 4 && w.rank() == 4, "conv2d", "expects input ", cl ? "[N,H,W,C]" : "[N,C,H,W]",
               " and weight [O,C,KH,KW], got ", to_string(x.shape()), " and ", to_string(w.shape()));
    const int64_t c = x.dim(cl ? 3 : 1), h = x.dim(cl ? 1 : 2), wd = x.dim(cl ? 2 : 3);
    KILN_CHECK(c == w.dim(1), "conv2d", "input has ", c, " channels but weight ", to_string(w.shape()), " expects ",
               w.dim(1));
    const auto &st = attrs.get_ints("stride"), &pad = attrs.get_ints("padding");
    KILN_CHECK(st.size() == 2 && pad.size() == 2 && st[0] > 0 && st[1] > 0 && pad[0] >= 0 && pad[1] >= 0,
               "conv2d", "stride and padding must be 2 values (stride > 0, padding >= 0)");
    const int64_t oh = conv2d_out_size(h, w.dim(2), st[0], pad[0]);
    const int64_t ow = conv2d_out_size(wd, w.dim(3), st[1], pad[1]);
    KILN_CHECK(h + 2 * pad[0] >= w.dim(2) && wd + 2 * pad[1] >= w.dim(3), "conv2d",
               "kernel ", to_string(w.shape()), " larger than padded input ", to_string(x.shape()));
    if (inputs.bias)
      KILN_CHECK(in[2].rank() == 1 && in[2].dim(0) == w.dim(0), "conv2d", "bias must have shape [", w.dim(0),
                 "], got ", to_string(in[2].shape()));
    const Shape out = cl ? Shape{x.dim(0), oh, ow, w.dim(0)} : Shape{x.dim(0), w.dim(0), oh, ow};
    const DType dtype = promote(x.dtype(), w.dtype());
    if (inputs.residual)
      KILN_CHECK(in.back().shape() == out && in.back().dtype() == dtype, "conv2d", "the residual must be ",
                 dtype_name(dtype), to_string(out), " (the output's dtype and shape), got ",
                 dtype_name(in.back().dtype()), to_string(in.back().shape()));
    return OutputMeta{out, dtype};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs& attrs, const OutputMeta& meta) {
    const bool cl = attrs.get_int("channels_last", 0) != 0;
    const HostTensor x = cl ? ref::nhwc_to_nchw(in[0]) : in[0];
    const HostTensor& w = in[1];
    const OutputMeta out{cl ? ref::nchw_shape(meta.shape) : meta.shape, meta.dtype};
    const auto &st = attrs.get_ints("stride"), &pad = attrs.get_ints("padding");
    const int64_t C = x.shape[1], H = x.shape[2], W = x.shape[3], KH = w.shape[2], KW = w.shape[3];
    const Conv2dInputs inputs = conv2d_inputs(in.size(), attrs);
    std::vector<double> r(static_cast<size_t>(numel(out.shape)));
    for (size_t i = 0; i < r.size(); ++i) {
      const auto idx = ref::unravel(int64_t(i), out.shape);
      double s = inputs.bias ? in[2].data[size_t(idx[1])] : 0.0;
      for (int64_t c = 0; c < C; ++c)
        for (int64_t kh = 0; kh < KH; ++kh)
          for (int64_t kw = 0; kw < KW; ++kw) {
            const int64_t ih = idx[2] * st[0] - pad[0] + kh, iw = idx[3] * st[1] - pad[1] + kw;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            s += x.data[size_t(((idx[0] * C + c) * H + ih) * W + iw)] *
                 w.data[size_t(((idx[1] * C + c) * KH + kh) * KW + kw)];
          }
      r[i] = s;
    }
    if (cl) r = ref::nchw_to_nhwc(r, out.shape);
    if (inputs.residual)  // in the output's own order, like r now
      for (size_t i = 0; i < r.size(); ++i) r[i] += in.back().data[i];
    return r;
  };
  register_op(std::move(def));
}

// sdpa: q [B,H,Lq,D], k [B,Hkv,Lk,D], v [B,Hkv,Lk,Dv], optional additive mask broadcastable to
// [B,H,Lq,Lk]; attr scale (default 1/sqrt(D)). Hkv < H is grouped-query attention (torch's
// enable_gqa=True): H must be a multiple of Hkv, and query head h reads K/V head h / (H / Hkv).
void register_sdpa() {
  OpDef def;
  def.name = "sdpa";
  def.kind = OpKind::attention;
  // q/k/v rows are read in place when their last dim is contiguous (a transposed [B,L,H,D]
  // projection needs no copy); the mask is read through broadcast strides of a dense tensor.
  def.strided_inputs = true;
  def.min_inputs = 3;
  def.max_inputs = 4;
  def.infer = [](const std::vector<Tensor>& in, const Attrs&) {
    const Tensor &q = in[0], &k = in[1], &v = in[2];
    for (const Tensor* t : {&q, &k, &v}) {
      check_float(*t, "sdpa", "q, k and v");
      KILN_CHECK(t->rank() == 4, "sdpa", "expects q, k, v as [B, H, L, D], got ", to_string(t->shape()));
    }
    KILN_CHECK(q.dim(0) == k.dim(0) && q.dim(3) == k.dim(3) && k.dim(0) == v.dim(0) && k.dim(1) == v.dim(1) &&
                   k.dim(2) == v.dim(2) && (q.dim(1) == k.dim(1) || (k.dim(1) > 0 && q.dim(1) % k.dim(1) == 0)),
               "sdpa", "q ", to_string(q.shape()), ", k ", to_string(k.shape()), ", v ", to_string(v.shape()),
               " do not agree (need q [B,H,Lq,D], k [B,Hkv,Lk,D], v [B,Hkv,Lk,Dv] with H a multiple of Hkv)");
    if (in.size() > 3) {
      check_float(in[3], "sdpa", "mask");
      broadcast_shapes(in[3].shape(), {q.dim(0), q.dim(1), q.dim(2), k.dim(2)}, "sdpa mask");
      KILN_CHECK(in[3].rank() <= 4, "sdpa", "mask rank must be <= 4, got ", to_string(in[3].shape()));
    }
    return OutputMeta{{q.dim(0), q.dim(1), q.dim(2), v.dim(3)}, q.dtype()};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs& attrs, const OutputMeta& out) {
    const HostTensor &q = in[0], &k = in[1], &v = in[2];
    const int64_t B = q.shape[0], H = q.shape[1], Lq = q.shape[2], D = q.shape[3], Lk = k.shape[2],
                  Dv = v.shape[3], Hkv = k.shape[1], group = Hkv > 0 ? H / Hkv : 1;
    const double scale = attrs.get_float("scale", 1.0 / std::sqrt(double(D)));
    std::vector<double> r(static_cast<size_t>(numel(out.shape))), s(static_cast<size_t>(Lk));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Lq; ++i) {
          const double* qi = q.data.data() + ((b * H + h) * Lq + i) * D;
          double m = -std::numeric_limits<double>::infinity(), sum = 0;
          for (int64_t j = 0; j < Lk; ++j) {
            const double* kj = k.data.data() + ((b * Hkv + h / group) * Lk + j) * D;
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
            s[size_t(j)] = dot * scale + (in.size() > 3 ? ref::at_broadcast(in[3], {b, h, i, j}) : 0.0);
            m = std::max(m, s[size_t(j)]);
          }
          for (int64_t j = 0; j < Lk; ++j) sum += (s[size_t(j)] = std::exp(s[size_t(j)] - m));
          for (int64_t d = 0; d < Dv; ++d) {
            double acc = 0;
            for (int64_t j = 0; j < Lk; ++j)
              acc += s[size_t(j)] * v.data[size_t(((b * Hkv + h / group) * Lk + j) * Dv + d)];
            r[size_t(((b * H + h) * Lq + i) * Dv + d)] = acc / sum;
          }
        }
    return r;
  };
  register_op(std::move(def));
}

}  // namespace

void register_contraction_ops() {
  register_matmul();
  register_linear();
  register_conv2d();
  register_sdpa();
}

}  // namespace kiln
