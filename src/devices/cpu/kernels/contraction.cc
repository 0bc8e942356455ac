// Contraction kernels (matmul, linear, conv2d) and attention: thin adapters from tensors to
// the GEMM / convolution / attention routines, which compute in f32.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "devices/cpu/kernels/attention.h"
#include "devices/cpu/kernels/conv2d.h"
#include "devices/cpu/kernels/f32_io.h"
#include "devices/cpu/kernels/gemm.h"
#include "devices/cpu/kernels/kernel_table.h"

namespace kiln::cpu {

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
  const int64_t k = x.shape.back(), n = w.shape[0], rows = k ? x.numel() / k : 0;
  F32In fx(x), fw(w);
  F32Out fo(args.out);
  float* y = fo.get();
  float beta = 0.0f;
  if (args.in.size() > 2) {  // start from the bias rows and accumulate the product onto them
    F32In fbias(args.in[2]);
    for (int64_t i = 0; i < rows; ++i) std::memcpy(y + i * n, fbias.get(), size_t(n) * 4);
    beta = 1.0f;
  }
  sgemm(false, true, rows, n, k, 1.0f, fx.get(), k, fw.get(), k, beta, y, n);
}

void conv2d_kernel(const KernelArgs& args) {
  const TensorView &x = args.in[0], &w = args.in[1];
  const auto &st = args.attrs->get_ints("stride"), &pad = args.attrs->get_ints("padding");
  F32In fx(x), fw(w);
  std::vector<F32In> bias;
  if (args.in.size() > 2) bias.emplace_back(args.in[2]);
  F32Out fo(args.out);
  conv2d_f32(fx.get(), fw.get(), bias.empty() ? nullptr : bias[0].get(), fo.get(), x.shape[0], x.shape[1], x.shape[2],
             x.shape[3], w.shape[0], w.shape[2], w.shape[3], st[0], st[1], pad[0], pad[1]);
}

void sdpa_kernel(const KernelArgs& args) {
  const TensorView &q = args.in[0], &k = args.in[1], &v = args.in[2];
  const int64_t B = q.shape[0], H = q.shape[1], Lq = q.shape[2], D = q.shape[3], Lk = k.shape[2], Dv = v.shape[3];
  const float scale = float(args.attrs->get_float("scale", 1.0 / std::sqrt(double(D))));
  F32In fq(q), fk(k), fv(v);
  std::vector<F32In> mask;
  int64_t ms[4] = {0, 0, 0, 0};
  if (args.in.size() > 3) {
    mask.emplace_back(args.in[3]);
    const Strides s = broadcast_strides(args.in[3].shape, contiguous_strides(args.in[3].shape), {B, H, Lq, Lk});
    std::copy(s.begin(), s.end(), ms);
  }
  F32Out fo(args.out);
  attention_f32(fq.get(), fk.get(), fv.get(), mask.empty() ? nullptr : mask[0].get(), ms, fo.get(), B, H, Lq, Lk, D,
                Dv, scale);
}

}  // namespace

void add_contraction_kernels(KernelTable& table) {
  table["matmul"] = &matmul_kernel;
  table["linear"] = &linear_kernel;
  table["conv2d"] = &conv2d_kernel;
  table["sdpa"] = &sdpa_kernel;
}

}  // namespace kiln::cpu
