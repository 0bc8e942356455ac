// Contraction kernels (matmul, linear, conv2d) and attention: thin adapters from tensors to
// the GEMM / convolution / attention routines, which compute in f32.
#include <cmath>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "graph/conv2d_inputs.h"
#include "devices/cpu/kernels/attention.h"
#include "devices/cpu/kernels/conv2d.h"
#include "devices/cpu/kernels/f32_io.h"
#include "devices/cpu/kernels/gemm.h"
#include "devices/cpu/kernels/gemv.h"
#include "devices/cpu/kernels/kernel_table.h"
#include "devices/cpu/kernels/linear_gemm.h"
#include "devices/cpu/kernels/strided.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

namespace {

// Offset (in elements) of batch `b` of an operand whose batch dims broadcast to `batch`.
int64_t batch_offset(const Shape& batch, const Shape& op_shape, int64_t b, int64_t mat_elems) {
  const size_t op_batch = op_shape.size() - 2, lead = batch.size() - op_batch;
  int64_t off = 0, stride = mat_elems;
  for (size_t d = batch.size(); d-- > lead;) {
    const int64_t dim = op_shape[d - lead];
    if (dim != 1) off += (b % batch[d]) * stride;
    b /= batch[d];
    stride *= dim;
  }
  return off;
}

void matmul_kernel(const KernelArgs& args) {
  const TensorView &a = args.in[0], &b = args.in[1], &out = args.out;
  const bool ta = args.attrs->get_int("transpose_a", 0), tb = args.attrs->get_int("transpose_b", 0);
  const size_t r = out.shape.size();
  const int64_t m = out.shape[r - 2], n = out.shape[r - 1];
  const int64_t k = ta ? a.shape[a.shape.size() - 2] : a.shape.back();
  const int64_t lda = a.shape.back(), ldb = b.shape.back();
  const Shape batch(out.shape.begin(), out.shape.end() - 2);
  const int64_t batches = numel(batch);
  F32In fa(a), fb(b);
  F32Out fo(out);
  // A shared right operand (weights) with a dense, untransposed left operand: one tall GEMM.
  const bool b_shared = numel(Shape(b.shape.begin(), b.shape.end() - 2)) == 1;
  if (b_shared && !ta && numel(Shape(a.shape.begin(), a.shape.end() - 2)) == batches) {
    sgemm(false, tb, batches * m, n, k, 1.0f, fa.get(), lda, fb.get(), ldb, 0.0f, fo.get(), n);
    return;
  }
  for (int64_t i = 0; i < batches; ++i) {
    const float* pa = fa.get() + batch_offset(batch, a.shape, i, m * k);
    const float* pb = fb.get() + batch_offset(batch, b.shape, i, k * n);
    sgemm(ta, tb, m, n, k, 1.0f, pa, lda, pb, ldb, 0.0f, fo.get() + i * m * n, n);
  }
}

void linear_kernel(const KernelArgs& args) {
  const TensorView &x = args.in[0], &w = args.in[1];
  const int64_t k = x.shape.back(), n = w.shape[0], rows = n ? args.out.numel() / n : 0;
  if (rows == 0) return;
  if (rows == 1) return grouped_linear_rows({args});  // weight-streaming: gemv.h
  const TensorView* b = args.in.size() > 2 ? &args.in[2] : nullptr;
  // A quantized weight is dequantized panel by panel (linear_gemm.h); x, bias and y of other
  // float dtypes through f32 copies (they are activations, not the weight).
  if (is_storage_only(w.dtype) && k > 0) {
    std::vector<F32In> xb;
    xb.reserve(2);
    const void* xp = x.data;
    DType xt = x.dtype;
    if (!f32_or_bf16(xt)) xp = xb.emplace_back(x).get(), xt = DType::f32;
    const void* bp = b ? b->data : nullptr;
    DType bt = b ? b->dtype : DType::f32;
    if (b && !f32_or_bf16(bt)) bp = xb.emplace_back(*b).get(), bt = DType::f32;
    if (f32_or_bf16(args.out.dtype)) {
      linear_quantized(xp, xt, w.data, w.dtype, bp, bt, args.out.data, args.out.dtype, rows, n, k);
    } else {
      F32Out fo(args.out);
      linear_quantized(xp, xt, w.data, w.dtype, bp, bt, fo.get(), DType::f32, rows, n, k);
    }
    return;
  }
  // bf16 x and w are read as they are (no f32 copies), with a bias and y of f32 or bf16.
  if (x.dtype == DType::bf16 && w.dtype == DType::bf16 && (!b || f32_or_bf16(b->dtype)) &&
      f32_or_bf16(args.out.dtype) && k > 0) {
    linear_bf16(x.data, w.data, static_cast<const PackedLinearWeight*>(args.prepared), b ? b->data : nullptr,
                b ? b->dtype : DType::f32, args.out.data, args.out.dtype, rows, n, k);
    return;
  }
  F32In fx(x), fw(w);
  std::vector<F32In> bias;
  if (args.in.size() > 2) bias.emplace_back(args.in[2]);
  F32Out fo(args.out);
  if (k == 0) {  // an empty sum: the bias rows, or zeros
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < n; ++j) fo.get()[i * n + j] = bias.empty() ? 0.0f : bias[0].get()[j];
    return;
  }
  if (linear_runs_on_primitive(rows)) {
    linear_f32(fx.get(), fw.get(), static_cast<const PackedLinearWeight*>(args.prepared),
               bias.empty() ? nullptr : bias[0].get(), fo.get(), rows, n, k);
    return;
  }
  float* y = fo.get();
  float beta = 0.0f;
  if (!bias.empty()) {  // start from the bias rows and accumulate the product onto them
    const float* b = bias[0].get();
    // Spread over the threads: at DiT sizes (1.5k rows x 12k) one thread copying the rows
    // took a few percent of the linear's time.
#pragma omp parallel for schedule(static) if (rows * n >= (int64_t(1) << 16))
    for (int64_t i = 0; i < rows; ++i) std::memcpy(y + i * n, b, size_t(n) * 4);
    beta = 1.0f;
  }
  sgemm(false, true, rows, n, k, 1.0f, fx.get(), k, fw.get(), k, beta, y, n);
}

}  // namespace

void grouped_linear_rows(const std::vector<KernelArgs>& linears) {
  if (linears.empty()) return;
  const TensorView& x = linears[0].in[0];
  const int64_t k = x.shape.back();
  // f32 and bf16 operands, and quantized weights, are read and written as they are (gemv.h);
  // other dtypes through f32 copies.
  std::vector<std::unique_ptr<F32In>> keep;
  std::vector<std::unique_ptr<F32Out>> outs;
  const auto in = [&](const TensorView& v, const void*& ptr, DType& type) {
    ptr = v.data;
    type = v.dtype;
    if (f32_or_bf16(v.dtype) || is_storage_only(v.dtype)) return;
    keep.push_back(std::make_unique<F32In>(v));
    ptr = keep.back()->get();
    type = DType::f32;
  };
  const void* xp = nullptr;
  DType xt = DType::f32;
  in(x, xp, xt);
  std::vector<RowProduct> products;
  for (const KernelArgs& a : linears) {
    KILN_CHECK(a.in[0].data == x.data && a.in[0].shape == x.shape && a.in[0].dtype == x.dtype && x.numel() == k,
               "linear", "a grouped launch's linears must read the same single row");
    RowProduct p{nullptr, nullptr, a.out.data, a.in[1].shape[0], DType::f32, DType::f32, a.out.dtype};
    in(a.in[1], p.w, p.w_type);
    if (a.in.size() > 2) in(a.in[2], p.bias, p.bias_type);
    if (!f32_or_bf16(a.out.dtype)) {
      outs.push_back(std::make_unique<F32Out>(a.out));
      p.y = outs.back()->get();
      p.y_type = DType::f32;
    }
    products.push_back(p);
  }
  gemv_rows(xp, xt, k, products);
}

namespace {

void conv2d_kernel(const KernelArgs& args) {
  const TensorView &x = args.in[0], &w = args.in[1], &y = args.out;
  const auto &st = args.attrs->get_ints("stride"), &pad = args.attrs->get_ints("padding");
  const Conv2dInputs inputs = conv2d_inputs(args.in.size(), *args.attrs);
  const TensorView* residual = inputs.residual ? &args.in.back() : nullptr;
  // channels_last: x is [N, H, W, C] (graph/ops/contraction_ops.cc).
  const bool cl = args.attrs->get_int("channels_last", 0) != 0;
  const int64_t N = x.shape[0], C = x.shape[cl ? 3 : 1], H = x.shape[cl ? 1 : 2], W = x.shape[cl ? 2 : 3];
  // f32 and bf16 tensors go to oneDNN as they are (its reorders change the dtype); others (f16)
  // through f32 copies.
  if (f32_or_bf16(x.dtype) && f32_or_bf16(w.dtype) && f32_or_bf16(y.dtype) &&
      (!inputs.bias || f32_or_bf16(args.in[2].dtype))) {
    const ConvOperand bias = inputs.bias ? ConvOperand{args.in[2].data, args.in[2].dtype} : ConvOperand{};
    const ConvOperand r = residual ? ConvOperand{residual->data, residual->dtype} : ConvOperand{};
    conv2d({x.data, x.dtype}, {w.data, w.dtype}, bias, y.data, y.dtype, N, C, H, W, w.shape[0], w.shape[2], w.shape[3],
           st[0], st[1], pad[0], pad[1], cl, r);
    return;
  }
  F32In fx(x), fw(w);
  std::vector<F32In> bias, r;
  if (inputs.bias) bias.emplace_back(args.in[2]);
  if (residual) r.emplace_back(*residual);
  F32Out fo(y);
  conv2d({fx.get(), DType::f32}, {fw.get(), DType::f32}, {bias.empty() ? nullptr : bias[0].get(), DType::f32}, fo.get(),
         DType::f32, N, C, H, W, w.shape[0], w.shape[2], w.shape[3], st[0], st[1], pad[0], pad[1], cl,
         {r.empty() ? nullptr : r[0].get(), DType::f32});
}

// A dense row-major f32 copy of any strided view.
std::vector<float> dense_f32(const TensorView& t) {
  std::vector<float> out(size_t(t.numel()));
  const StridedLoop loop = make_strided_loop(t.shape, {t.strides});
  const int64_t es = int64_t(dtype_size(t.dtype)), is = loop.inner_stride[0];
  float* dst = out.data();
  for (int64_t pos = 0; pos < loop.outer_count() && loop.inner > 0; ++pos, dst += loop.inner) {
    const char* src = static_cast<const char*>(t.data) + loop.offset(0, pos) * es;
    if (is == 1) {
      convert_to_f32(src, t.dtype, dst, loop.inner);
    } else {
      for (int64_t i = 0; i < loop.inner; ++i) convert_to_f32(src + i * is * es, t.dtype, dst + i, 1);
    }
  }
  return out;
}

// Whether attention() reads a [B,H,L,D] view in place: f32 or bf16 rows whose D values are
// contiguous (e.g. a transposed [B,L,H,D] projection) and do not overlap.
bool attention_reads_in_place(const TensorView& t) {
  const int64_t L = t.shape[2], D = std::max<int64_t>(t.shape[3], 1);
  const int64_t row = L <= 1 ? D : t.strides[2];  // a single row's stride is never used
  return f32_or_bf16(t.dtype) && (t.shape[3] <= 1 || t.strides[3] == 1) && row >= D;
}

RowLayout attention_layout(const TensorView& t) {
  const int64_t L = t.shape[2], D = std::max<int64_t>(t.shape[3], 1);
  return {t.strides[0], t.strides[1], L <= 1 ? D : t.strides[2]};
}

// An attention operand: read in place when attention() can (bf16 rows are widened a tile at a
// time inside it), else first made a dense f32 copy (other dtypes, rows with strided values).
// `group`: query heads per stored head (grouped-query K and V; 1 otherwise).
class AttentionRows {
 public:
  explicit AttentionRows(const TensorView& t, int64_t group = 1) {
    if (attention_reads_in_place(t)) {
      op_ = {t.data, t.dtype, attention_layout(t)};
    } else {
      copy_ = dense_f32(t);
      op_ = {copy_.data(), DType::f32, RowLayout::dense(t.shape[1], t.shape[2], t.shape[3])};
    }
    op_.layout.group = group;
  }
  const AttentionOperand& get() const { return op_; }

 private:
  AttentionOperand op_;
  std::vector<float> copy_;
};

void sdpa_kernel(const KernelArgs& args) {
  const TensorView &q = args.in[0], &k = args.in[1], &v = args.in[2];
  const int64_t B = q.shape[0], H = q.shape[1], Lq = q.shape[2], D = q.shape[3], Lk = k.shape[2], Dv = v.shape[3];
  const float scale = float(args.attrs->get_float("scale", 1.0 / std::sqrt(double(D))));
  // Grouped-query attention: K and V hold H / group heads, each read by `group` query heads.
  const int64_t group = k.shape[1] > 0 ? H / k.shape[1] : 1;
  const AttentionRows fq(q), fk(k, group), fv(v, group);
  // The mask is read through its own (broadcast) strides when it is f32, else from a dense copy.
  std::vector<float> mask_copy;
  const float* mask = nullptr;
  int64_t ms[4] = {0, 0, 0, 0};
  if (args.in.size() > 3) {
    const TensorView& m = args.in[3];
    Strides st = m.strides;
    if (m.dtype == DType::f32) {
      mask = m.as<const float>();
    } else {
      mask_copy = dense_f32(m);
      mask = mask_copy.data();
      st = contiguous_strides(m.shape);
    }
    const Strides s = broadcast_strides(m.shape, st, {B, H, Lq, Lk});
    std::copy(s.begin(), s.end(), ms);
  }
  // An f32 or bf16 output whose rows are contiguous is written in place through its strides
  // (deferred mode hands sdpa a [B,L,H,Dv] buffer viewed as [B,H,L,Dv]); anything else is dense.
  const TensorView& o = args.out;
  if (attention_reads_in_place(o)) {
    attention(fq.get(), fk.get(), fv.get(), mask, ms, {o.data, o.dtype, attention_layout(o)}, B, H, Lq, Lk, D, Dv,
              scale);
    return;
  }
  F32Out fo(o);
  attention(fq.get(), fk.get(), fv.get(), mask, ms, {fo.get(), DType::f32, RowLayout::dense(H, Lq, Dv)}, B, H, Lq,
            Lk, D, Dv, scale);
}

}  // namespace

void add_contraction_kernels(KernelTable& table) {
  table["matmul"] = &matmul_kernel;
  table["linear"] = &linear_kernel;
  table["conv2d"] = &conv2d_kernel;
  table["sdpa"] = &sdpa_kernel;
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
