// Grouped-query attention (torch's scaled_dot_product_attention(..., enable_gqa=True)): K and V
// with fewer heads than Q, query head h reading KV head h / (Hq / Hkv) without a copy of K/V.
// Checked against attention over K/V whose heads are repeated (repeat_interleave), which must give
// the same bits: in the CPU kernel (every tile-product path, f32 and bf16) and through the sdpa op
// in strict eager, deferred and compiled mode; plus the op's shape rule and double reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "devices/cpu/kernels/attention.h"
#include "devices/cpu/kernels/onednn.h"
#include "exec/compile.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "graph/op.h"
#include "test_util.h"

namespace kiln {
namespace {

// [B, Hkv, L, D] rows -> [B, Hkv·G, L, D], each KV head repeated G times in place.
std::vector<float> repeat_heads(const std::vector<float>& x, int64_t B, int64_t Hkv, int64_t G, int64_t L, int64_t D) {
  std::vector<float> out(static_cast<size_t>(B * Hkv * G * L * D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv * G; ++h)
      std::memcpy(&out[size_t(((b * Hkv * G + h) * L) * D)], &x[size_t(((b * Hkv + h / G) * L) * D)],
                  size_t(L * D) * sizeof(float));
  return out;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
  return out;
}

// One kernel call on operands of `dtype` (f32 or bf16 storage of the same values), K/V with
// `kv_heads` heads read with RowLayout::group = H / kv_heads; returns the output's bytes.
struct KernelCase {
  int64_t B = 2, H = 8, Lq = 37, Lk = 300, D = 24, Dv = 16;
};

std::vector<char> run_kernel(cpu::AttentionProducts products, DType dtype, const KernelCase& c, int64_t kv_heads,
                             const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                             const std::vector<float>& mask, const int64_t ms[4]) {
  const auto operand = [&](const std::vector<float>& x, std::vector<uint16_t>& keep_bf16, int64_t heads, int64_t L,
                           int64_t width) {
    cpu::AttentionOperand op;
    op.dtype = dtype;
    op.layout = cpu::RowLayout::dense(heads, L, width);
    op.layout.group = c.H / heads;
    if (dtype == DType::bf16) {
      keep_bf16 = to_bf16(x);
      op.data = keep_bf16.data();
    } else {
      op.data = x.data();
    }
    return op;
  };
  std::vector<uint16_t> qb, kb, vb;
  const cpu::AttentionOperand qo = operand(q, qb, c.H, c.Lq, c.D), ko = operand(k, kb, kv_heads, c.Lk, c.D),
                              vo = operand(v, vb, kv_heads, c.Lk, c.Dv);
  std::vector<char> out(size_t(c.B * c.H * c.Lq * c.Dv) * dtype_size(dtype));
  cpu::detail::attention_with(products, qo, ko, vo, mask.data(), ms,
                              {out.data(), dtype, cpu::RowLayout::dense(c.H, c.Lq, c.Dv)}, c.B, c.H, c.Lq, c.Lk, c.D,
                              c.Dv, 1.0f / std::sqrt(float(c.D)));
  return out;
}

TEST(GqaAttentionKernel, GroupedKvHeadsGiveTheBitsOfRepeatedKvHeads) {
  const KernelCase c;
  for (const int64_t kv_heads : {1, 2, 4}) {
    const int64_t G = c.H / kv_heads;
    const std::vector<float> q = test::random_values(c.B * c.H * c.Lq * c.D, 1, -1, 1),
                             k = test::random_values(c.B * kv_heads * c.Lk * c.D, 2, -1, 1),
                             v = test::random_values(c.B * kv_heads * c.Lk * c.Dv, 3, -1, 1);
    const std::vector<float> k_rep = repeat_heads(k, c.B, kv_heads, G, c.Lk, c.D),
                             v_rep = repeat_heads(v, c.B, kv_heads, G, c.Lk, c.Dv);
    // A causal + key-padding mask per batch row, [B, 1, Lq, Lk] broadcast over heads.
    std::vector<float> mask(size_t(c.B * c.Lq * c.Lk), 0.0f);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t i = 0; i < c.Lq; ++i)
        for (int64_t j = 0; j < c.Lk; ++j)
          if (j > i + 200 || (b == 1 && j < 5)) mask[size_t((b * c.Lq + i) * c.Lk + j)] = -INFINITY;
    const int64_t ms[4] = {c.Lq * c.Lk, 0, c.Lk, 1};
    for (const DType dtype : {DType::f32, DType::bf16}) {
      std::vector<cpu::AttentionProducts> paths = {cpu::AttentionProducts::kF32, cpu::AttentionProducts::kWidened};
      // oneDNN's bf16 matmul exists only with AVX-512 (see test_cpu_bf16_attention_conv.cc).
      if (dtype == DType::bf16 && cpu::onednn::bf16_primitives_available())
        paths.push_back(cpu::AttentionProducts::kBf16Dot);
      for (const cpu::AttentionProducts p : paths) {
        const auto got = run_kernel(p, dtype, c, kv_heads, q, k, v, mask, ms);
        const auto want = run_kernel(p, dtype, c, c.H, q, k_rep, v_rep, mask, ms);
        EXPECT_EQ(got, want) << dtype_name(dtype) << " products " << int(p) << ", " << kv_heads << " KV heads";
      }
    }
  }
}

TEST(GqaAttentionKernel, RejectsGroupsThatDoNotDivideTheHeads) {
  const float x[4] = {0, 0, 0, 0};
  float out[4];
  cpu::AttentionOperand q{x, DType::f32, cpu::RowLayout::dense(4, 1, 1)};
  cpu::AttentionOperand k{x, DType::f32, cpu::RowLayout::dense(1, 1, 1)};
  k.layout.group = 3;  // 4 query heads cannot share KV heads three by three
  test::expect_error([&] { cpu::attention(q, k, k, nullptr, nullptr, {out, DType::f32, q.layout}, 1, 4, 1, 1, 1, 1, 1.0f); },
                     {"[attention]", "K/V groups must divide H"});
}

// ---- the sdpa op ----

// [B, Hkv, L, D] -> [B, Hkv·G, L, D] with ops (a copy: what GQA avoids).
Tensor repeat_kv(const Tensor& x, int64_t G) {
  const int64_t B = x.dim(0), H = x.dim(1), L = x.dim(2), D = x.dim(3);
  return reshape(contiguous(expand(unsqueeze(x, 2), {B, H, G, L, D})), {B, H * G, L, D});
}

struct OpInputs {
  Tensor q, k, v, mask;  // q, k, v as transposed [B, L, H, D] projections, as models pass them
};

OpInputs op_inputs(DType dtype, int64_t B, int64_t H, int64_t Hkv, int64_t L, int64_t D) {
  OpInputs in;
  in.q = transpose(test::random_tensor({B, L, H, D}, 5, dtype, -1, 1), 1, 2);
  in.k = transpose(test::random_tensor({B, L, Hkv, D}, 6, dtype, -1, 1), 1, 2);
  in.v = transpose(test::random_tensor({B, L, Hkv, D}, 7, dtype, -1, 1), 1, 2);
  std::vector<float> m(size_t(B * L * L), 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = i + 1; j < L; ++j) m[size_t((b * L + i) * L + j)] = -INFINITY;  // causal
  in.mask = from_vector(m, {B, 1, L, L});
  return in;
}

std::vector<float> sdpa_in_mode(const std::string& mode, const OpInputs& in, int64_t G) {
  const auto fn = [G](const std::vector<Tensor>& a) {
    const Tensor k = G > 0 ? repeat_kv(a[1], G) : a[1], v = G > 0 ? repeat_kv(a[2], G) : a[2];
    return std::vector<Tensor>{scaled_dot_product_attention(a[0], k, v, a[3])};
  };
  const std::vector<Tensor> args = {in.q, in.k, in.v, in.mask};
  if (mode == "compile") {
    CompileOptions o;
    o.fullgraph = true;
    return to_vector(CompiledFunction("gqa", fn, o)(args, {})[0]);
  }
  EagerModeGuard guard(mode == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
  return to_vector(fn(args)[0]);
}

TEST(GqaAttentionOp, FewerKvHeadsGiveTheBitsOfRepeatedHeadsInEveryMode) {
  const int64_t B = 2, H = 6, Hkv = 2, L = 40, D = 16;
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const OpInputs in = op_inputs(dtype, B, H, Hkv, L, D);
    const std::vector<float> want = sdpa_in_mode("eager", in, H / Hkv);  // K/V heads repeated (copied)
    for (const std::string mode : {"eager", "defer", "compile"}) {
      const std::vector<float> got = sdpa_in_mode(mode, in, 0);  // grouped: no copy
      EXPECT_EQ(got, want) << dtype_name(dtype) << " " << mode;
    }
  }
}

TEST(GqaAttentionOp, MatchesTheDoubleReferenceAndChecksTheHeadRule) {
  const int64_t B = 2, H = 4, Hkv = 2, L = 9, D = 8;
  const OpInputs in = op_inputs(DType::f32, B, H, Hkv, L, D);
  const Tensor got = scaled_dot_product_attention(in.q, in.k, in.v, in.mask);
  EXPECT_EQ(got.shape(), Shape({B, H, L, D}));
  // The op's double-precision reference reads grouped K/V as it reads repeated heads.
  const OutputMeta meta{{B, H, L, D}, DType::f32};
  const HostTensor grouped = reference_run("sdpa", {to_host(in.q), to_host(in.k), to_host(in.v), to_host(in.mask)}, {}, meta);
  const HostTensor repeated = reference_run(
      "sdpa", {to_host(in.q), to_host(repeat_kv(in.k, H / Hkv)), to_host(repeat_kv(in.v, H / Hkv)), to_host(in.mask)},
      {}, meta);
  EXPECT_EQ(grouped.data, repeated.data);
  const std::vector<float> g = to_vector(got);
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::fabs(double(g[i]) - grouped.data[i]));
  EXPECT_LE(worst, 1e-6) << "kernel against the op's reference";
  test::expect_error([&] { scaled_dot_product_attention(in.q, slice(in.k, 1, 0, 1), in.v); },
                     {"[sdpa]", "H a multiple of Hkv"});
  const Tensor k3 = test::random_tensor({B, 3, L, D}, 8);
  test::expect_error([&] { scaled_dot_product_attention(in.q, k3, k3); }, {"[sdpa]", "H a multiple of Hkv"});
}

}  // namespace
}  // namespace kiln
