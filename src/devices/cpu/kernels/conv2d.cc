// 2-D convolution through a cached oneDNN convolution_forward primitive.
//
// Layout: the primitive is created with format_tag::any so oneDNN picks its preferred
// layouts (on AVX-512 it chose brgconv with nhwc src/dst and Acdb64a weights); src,
// weights and dst are reordered per call. Channels-last callers (ConvLayout::kChannelsLast) hand
// it nhwc src and dst, read and written in place: only the weights are reordered. The blocked
// ("any") path is the default: reorders included, it beat plain nchw/oihw (im2col + GEMM) on the
// VAE's convolution shapes (docs/benchmarks-history.md, "Convolution layouts").
// Reordered weights are not cached: one shape serves many layers with different weights.
//
// A residual (y = conv(x) + r, a ResNet block's skip path) is a binary-add post-op of a bf16
// primitive that writes y itself (channels-last): the sum is formed from the f32 accumulator and
// rounded once, and y is never written without it. oneDNN then picks its jit AMX kernel over
// brgconv: on an AMX Xeon faster at 256x256x512, ~10% slower at 1024x1024x128, either way less
// than the pass over y and the residual that a separate add takes. Elsewhere the residual is added to y afterwards, as
// the add op would: an f32 primitive with a binary post-op is a different kernel (jit rather than
// brgconv) that sums in another order, and f32 results keep their bits. 1x1 kernels too: oneDNN
// 2.6's AMX jit_1x1 convolution with a binary post-op wrote past the end of a 6x7 y.
//
// bf16 tensors: the caller's nchw/oihw bf16 buffers enter through the same reorders, which
// change the dtype in the same pass as the layout. Whether the primitive itself computes in
// bf16 or in f32 is ConvMath's choice (conv2d.h); a bf16 y is rounded once, by the last reorder
// (or by the primitive when it writes y's layout directly).
//
// Thread safety: plans live in a mutex-guarded map and are immutable once built. The
// primitives use user-managed scratchpads (scratchpad_mode::user), which the oneDNN
// docs require for executing one primitive from several threads; every call allocates
// its own scratchpad and intermediate buffers. Streams are per thread.
#include "devices/cpu/kernels/conv2d.h"

#include <algorithm>
#include <atomic>
#include <compare>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/error.h"
#include "devices/cpu/kernels/elementwise_math.h"
#include "devices/cpu/kernels/f32_io.h"
#include "devices/cpu/kernels/onednn.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {
namespace {

using detail::ConvLayout;
using detail::ConvMath;
using dnnl::memory;
using tag = memory::format_tag;

constexpr const char* kOp = "conv2d";

struct ConvShape {
  int64_t N, C, H, W, O, KH, KW, stride_h, stride_w, pad_h, pad_w;
  bool has_bias;
  int64_t out_h() const { return (H + 2 * pad_h - KH) / stride_h + 1; }
  int64_t out_w() const { return (W + 2 * pad_w - KW) / stride_w + 1; }
  auto operator<=>(const ConvShape&) const = default;
};

// The dtypes of the caller's tensors and the one the primitive multiplies in.
struct ConvTypes {
  DType x, w, bias, y;
  bool bf16_math;  // the primitive reads bf16 src and weights (else f32)
  bool residual;   // y = conv + a residual of y's dtype and layout
  auto operator<=>(const ConvTypes&) const = default;
};

// Key for the plan cache: every parameter that changes the primitive.
struct PlanKey {
  ConvShape shape;
  ConvLayout layout;
  ConvTypes types;
  auto operator<=>(const PlanKey&) const = default;
};

struct Reorder {
  dnnl::reorder prim;
  memory::desc scratchpad;
};

// A ready-to-run convolution: the primitive plus the reorders between the caller's
// plain buffers and the primitive's layouts (absent when the layouts already match).
struct ConvPlan {
  memory::desc user_src, user_wei, user_dst, bias;
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward conv;
  std::optional<Reorder> src_in, wei_in, dst_out;
  bool residual_post_op = false;  // a residual is the binary-add post-op's operand (in user_dst's layout)
};

using onednn::add_scratchpad;
using onednn::user_scratchpad_attr;

// A reorder from -> to, or nothing when the two layouts are identical.
std::optional<Reorder> make_reorder(const memory::desc& from, const memory::desc& to) {
  if (from == to) return std::nullopt;
  const dnnl::reorder::primitive_desc pd(onednn::engine(), from, onednn::engine(), to,
                                         user_scratchpad_attr());
  return Reorder{dnnl::reorder(pd), pd.scratchpad_desc()};
}

std::shared_ptr<const ConvPlan> build_plan(const ConvShape& s, ConvLayout layout, const ConvTypes& types) {
  const memory::dims src_dims{s.N, s.C, s.H, s.W};
  const memory::dims wei_dims{s.O, s.C, s.KH, s.KW};
  const memory::dims dst_dims{s.N, s.O, s.out_h(), s.out_w()};
  const auto f32 = memory::data_type::f32, bf16 = memory::data_type::bf16;
  // f32 math reads an f32 bias (run_plan widens a bf16 one) and writes f32, rounded into a bf16
  // y by the reorder out; bf16 math takes the bias and writes y in their own dtypes.
  const auto math = types.bf16_math ? bf16 : f32;
  const auto bias_dt = types.bf16_math ? onednn::data_type(types.bias) : f32;
  const auto dst_dt = types.bf16_math ? onednn::data_type(types.y) : f32;

  auto plan = std::make_shared<ConvPlan>();
  const bool blocked = layout == ConvLayout::kBlocked, cl = layout == ConvLayout::kChannelsLast;
  const tag activations = cl ? tag::nhwc : tag::nchw;
  plan->user_src = memory::desc(src_dims, onednn::data_type(types.x), activations);
  plan->user_wei = memory::desc(wei_dims, onednn::data_type(types.w), tag::oihw);
  plan->user_dst = memory::desc(dst_dims, onednn::data_type(types.y), activations);
  plan->bias = s.has_bias ? memory::desc({s.O}, bias_dt, tag::x) : memory::desc();

  const memory::desc src(src_dims, math, blocked ? tag::any : activations);
  const memory::desc wei(wei_dims, math, blocked || cl ? tag::any : tag::oihw);
  const memory::desc dst(dst_dims, dst_dt, blocked ? tag::any : activations);

  // Symmetric padding: with floor division in out_h(), padding_r = pad is what PyTorch
  // does (trailing rows that do not fit a full window are dropped).
  const dnnl::convolution_forward::desc desc(
      dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, wei, plan->bias,
      dst, {s.stride_h, s.stride_w}, {s.pad_h, s.pad_w}, {s.pad_h, s.pad_w});
  dnnl::primitive_attr attr = user_scratchpad_attr();
  if (types.residual && types.bf16_math && cl && dst_dt == onednn::data_type(types.y) && s.KH * s.KW > 1) {
    plan->residual_post_op = true;
    dnnl::post_ops add;
    add.append_binary(dnnl::algorithm::binary_add, plan->user_dst);
    attr.set_post_ops(add);
  }
  plan->pd = dnnl::convolution_forward::primitive_desc(desc, attr, onednn::engine());
  plan->conv = dnnl::convolution_forward(plan->pd);
  plan->src_in = make_reorder(plan->user_src, plan->pd.src_desc());
  plan->wei_in = make_reorder(plan->user_wei, plan->pd.weights_desc());
  plan->dst_out = make_reorder(plan->pd.dst_desc(), plan->user_dst);
  return plan;
}

std::shared_ptr<const ConvPlan> get_plan(const ConvShape& s, ConvLayout layout, const ConvTypes& types) {
  static std::mutex* mu = new std::mutex;
  // Never destroyed: at exit the device queue may still be running a convolution.
  static auto* cache = new std::map<PlanKey, std::shared_ptr<const ConvPlan>>;
  const PlanKey key{s, layout, types};
  std::lock_guard<std::mutex> lock(*mu);
  auto it = cache->find(key);
  if (it == cache->end()) it = cache->emplace(key, build_plan(s, layout, types)).first;
  return it->second;
}

using onednn::Args;

void run_reorder(const Reorder& r, const memory& from, const memory& to, dnnl::stream& stream) {
  Args args{{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
  add_scratchpad(args, r.scratchpad);
  r.prim.execute(stream, args);
}

// The memory the primitive reads for one input: the caller's buffer itself, or a fresh
// buffer in the primitive's layout filled by the plan's reorder.
memory prepare_input(const std::optional<Reorder>& r, const memory& user,
                     const memory::desc& prim_desc, dnnl::stream& stream) {
  if (!r) return user;
  memory converted(prim_desc, onednn::engine());
  run_reorder(*r, user, converted, stream);
  return converted;
}

std::atomic<uint64_t> g_calls{0}, g_activation_reorders{0}, g_weight_reorders{0}, g_residual_post_ops{0};

// y[0, n) += r[0, n), both of `dtype`: in f32 and rounded once, as the add op computes, in
// chunks shared among the threads as the add op's tiles are.
void add_residual(void* y, const void* r, DType dtype, int64_t n) {
  constexpr int64_t kChunk = 4096;
  const size_t es = dtype_size(dtype);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel
  {
    std::vector<float> a, b;
    if (dtype != DType::f32) {
      a.resize(kChunk);
      b.resize(kChunk);
    }
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t i = c * kChunk, m = std::min(kChunk, n - i);
      char* yi = static_cast<char*>(y) + size_t(i) * es;
      const char* ri = static_cast<const char*>(r) + size_t(i) * es;
      if (dtype == DType::f32) {
        binary_f32(BinaryOp::add, reinterpret_cast<const float*>(yi), reinterpret_cast<const float*>(ri),
                   reinterpret_cast<float*>(yi), m);
        continue;
      }
      convert_to_f32(yi, dtype, a.data(), m);
      convert_to_f32(ri, dtype, b.data(), m);
      binary_f32(BinaryOp::add, a.data(), b.data(), a.data(), m);
      convert_from_f32(a.data(), yi, dtype, m);
    }
  }
}

void run_plan(const ConvPlan& p, const void* x, const void* w, ConvOperand bias, const void* residual, void* y,
              DType y_dtype) {
  g_calls.fetch_add(1, std::memory_order_relaxed);
  g_activation_reorders.fetch_add(uint64_t(p.src_in.has_value()) + uint64_t(p.dst_out.has_value()),
                                  std::memory_order_relaxed);
  g_weight_reorders.fetch_add(uint64_t(p.wei_in.has_value()), std::memory_order_relaxed);
  dnnl::stream& stream = onednn::thread_stream();
  const dnnl::engine& eng = onednn::engine();
  // oneDNN takes non-const handles but only reads inputs.
  const memory user_x(p.user_src, eng, const_cast<void*>(x));
  const memory user_w(p.user_wei, eng, const_cast<void*>(w));
  const memory user_y(p.user_dst, eng, y);

  const memory src = prepare_input(p.src_in, user_x, p.pd.src_desc(), stream);
  const memory wei = prepare_input(p.wei_in, user_w, p.pd.weights_desc(), stream);
  const memory dst = p.dst_out ? memory(p.pd.dst_desc(), eng) : user_y;

  Args args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
  std::vector<float> wide_bias;  // [O]: a bf16 bias for an f32 primitive
  if (bias.data) {
    const void* b = bias.data;
    if (p.bias.data_type() == memory::data_type::f32 && bias.dtype != DType::f32) {
      wide_bias.resize(static_cast<size_t>(p.bias.dims()[0]));
      convert_to_f32(bias.data, bias.dtype, wide_bias.data(), p.bias.dims()[0]);
      b = wide_bias.data();
    }
    args.emplace(DNNL_ARG_BIAS, memory(p.bias, eng, const_cast<void*>(b)));
  }
  const bool post_op = residual != nullptr && p.residual_post_op;
  if (post_op) {
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                 memory(p.user_dst, eng, const_cast<void*>(residual)));
    g_residual_post_ops.fetch_add(1, std::memory_order_relaxed);
  }
  add_scratchpad(args, p.pd.scratchpad_desc());
  p.conv.execute(stream, args);
  if (p.dst_out) run_reorder(*p.dst_out, dst, user_y, stream);
  stream.wait();
  if (residual != nullptr && !post_op) {
    const memory::dims& d = p.user_dst.dims();
    add_residual(y, residual, y_dtype, d[0] * d[1] * d[2] * d[3]);
  }
}

void check_shape(const ConvShape& s, const void* x, const void* w, const void* y) {
  KILN_CHECK(s.N > 0 && s.C > 0 && s.H > 0 && s.W > 0 && s.O > 0 && s.KH > 0 && s.KW > 0, kOp,
             "non-positive shape: x [", s.N, ",", s.C, ",", s.H, ",", s.W, "], w [", s.O, ",", s.C,
             ",", s.KH, ",", s.KW, "]");
  KILN_CHECK(s.stride_h > 0 && s.stride_w > 0 && s.pad_h >= 0 && s.pad_w >= 0, kOp,
             "bad stride/padding: stride (", s.stride_h, ",", s.stride_w, ") pad (", s.pad_h, ",",
             s.pad_w, ")");
  KILN_CHECK(s.H + 2 * s.pad_h >= s.KH && s.W + 2 * s.pad_w >= s.KW, kOp, "kernel ", s.KH, "x",
             s.KW, " larger than padded input ", s.H + 2 * s.pad_h, "x", s.W + 2 * s.pad_w);
  KILN_CHECK(x && w && y, kOp, "null input, weight or output pointer");
}

void run_conv(ConvLayout layout, ConvMath math, ConvOperand x, ConvOperand w, ConvOperand bias, void* y,
              DType y_dtype, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW,
              int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, ConvOperand residual = {}) {
  const ConvShape s{N, C, H, W, O, KH, KW, stride_h, stride_w, pad_h, pad_w, bias.data != nullptr};
  check_shape(s, x.data, w.data, y);
  KILN_CHECK(f32_or_bf16(x.dtype) && f32_or_bf16(w.dtype) && f32_or_bf16(bias.dtype) && f32_or_bf16(y_dtype), kOp,
             "x, weight, bias and y must be f32 or bf16, got ", dtype_name(x.dtype), ", ", dtype_name(w.dtype), ", ",
             dtype_name(bias.dtype), ", ", dtype_name(y_dtype));
  KILN_CHECK(residual.data == nullptr || residual.dtype == y_dtype, kOp, "the residual must be ", dtype_name(y_dtype),
             " like y, got ", dtype_name(residual.dtype));
  const bool bf16_math = math == ConvMath::kBf16 && x.dtype == DType::bf16 && w.dtype == DType::bf16;
  const ConvTypes types{x.dtype, w.dtype, bias.data ? bias.dtype : DType::f32, y_dtype, bf16_math,
                        residual.data != nullptr};
  try {
    run_plan(*get_plan(s, layout, types), x.data, w.data, bias, residual.data, y, y_dtype);
  } catch (const dnnl::error& e) {
    fail(kOp, "oneDNN error (status ", static_cast<int>(e.status), "): ", e.what());
  }
}

}  // namespace

Conv2dStats conv2d_stats() {
  return {g_calls.load(), g_activation_reorders.load(), g_weight_reorders.load(), g_residual_post_ops.load()};
}

namespace detail {

void conv2d_f32_layout(ConvLayout layout, const float* x, const float* w, const float* bias,
                       float* y, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH,
                       int64_t KW, int64_t stride_h, int64_t stride_w, int64_t pad_h,
                       int64_t pad_w) {
  run_conv(layout, ConvMath::kF32, {x, DType::f32}, {w, DType::f32}, {bias, DType::f32}, y, DType::f32, N, C, H, W,
           O, KH, KW, stride_h, stride_w, pad_h, pad_w);
}

ConvMath conv2d_bf16_math() {
  // Where bf16 multiplies at twice the f32 rate (AMX, AMD's AVX512-BF16) oneDNN's bf16 convolution
  // is the faster one; elsewhere the f32 kernel is (see ConvMath).
  static const ConvMath math = onednn::bf16_dot_products_fast() ? ConvMath::kBf16 : ConvMath::kF32;
  return math;
}

void conv2d_with_math(ConvMath math, ConvOperand x, ConvOperand w, ConvOperand bias, void* y, DType y_dtype,
                      int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW, int64_t stride_h,
                      int64_t stride_w, int64_t pad_h, int64_t pad_w, bool channels_last, ConvOperand residual) {
  run_conv(channels_last ? ConvLayout::kChannelsLast : ConvLayout::kBlocked, math, x, w, bias, y, y_dtype, N, C, H, W,
           O, KH, KW, stride_h, stride_w, pad_h, pad_w, residual);
}

}  // namespace detail

void conv2d_warm_up() {
  float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[9] = {0, 0, 0, 0, 1, 0, 0, 0, 0}, y[9] = {};
  conv2d_f32(x, w, nullptr, y, 1, 1, 3, 3, 1, 3, 3, 1, 1, 1, 1);
}

void conv2d_f32(const float* x, const float* w, const float* bias, float* y, int64_t N, int64_t C,
                int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW, int64_t stride_h,
                int64_t stride_w, int64_t pad_h, int64_t pad_w) {
  detail::conv2d_f32_layout(ConvLayout::kBlocked, x, w, bias, y, N, C, H, W, O, KH, KW, stride_h,
                            stride_w, pad_h, pad_w);
}

void conv2d(ConvOperand x, ConvOperand w, ConvOperand bias, void* y, DType y_dtype, int64_t N, int64_t C,
            int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW, int64_t stride_h, int64_t stride_w,
            int64_t pad_h, int64_t pad_w, bool channels_last, ConvOperand residual) {
  detail::conv2d_with_math(detail::conv2d_bf16_math(), x, w, bias, y, y_dtype, N, C, H, W, O, KH, KW, stride_h,
                           stride_w, pad_h, pad_w, channels_last, residual);
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
