// 2-D convolution on the CPU through oneDNN. Primitives are created once per shape and
// cached (thread-safe), so the repeated VAE conv shapes pay creation only once.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

// 2-D convolution, NCHW, groups = 1, dilation 1. x [N,C,H,W], w [O,C,KH,KW], bias [O] or
// nullptr, y [N,O,OH,OW] with OH = (H + 2*pad_h - KH)/stride_h + 1 (OW likewise). All
// contiguous f32; y must not overlap x, w or bias. Callable from any thread.
// Builds a tiny convolution so oneDNN's global state exists before the CPU runtime registers
// its exit drain (see gemm_warm_up).
void conv2d_warm_up();

void conv2d_f32(const float* x, const float* w, const float* bias, float* y, int64_t N, int64_t C,
                int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW, int64_t stride_h,
                int64_t stride_w, int64_t pad_h, int64_t pad_w);

// One tensor of conv2d(): contiguous f32 or bf16 elements (bias: data null when absent).
struct ConvOperand {
  const void* data = nullptr;
  DType dtype = DType::f32;
};

// conv2d_f32 for tensors that may also be bf16 (each independently; y is written as y_dtype).
// The products are of the operands' values with f32 accumulation, rounded once into y. How the
// primitive multiplies bf16 inputs is ConvMath's choice for this CPU (conv2d_bf16_math()); the
// weight is never converted as a whole beyond the reorder into the primitive's layout that the
// f32 path does too. `channels_last`: x is [N,H,W,C] and y [N,OH,OW,O] in memory (the dims
// passed stay N, C, H, W); the primitive then reads and writes them in place, with no reorder of
// activations (oneDNN's direct convolutions prefer that layout on AVX-512). With a `residual` (of
// y's dtype, shape and layout) y = conv + residual: added by a bf16 primitive from its f32
// accumulator where it writes y itself (channels-last), else to y after the convolution, as the
// add op would (so f32 results keep their bits).
void conv2d(ConvOperand x, ConvOperand w, ConvOperand bias, void* y, DType y_dtype, int64_t N, int64_t C,
            int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW, int64_t stride_h, int64_t stride_w,
            int64_t pad_h, int64_t pad_w, bool channels_last = false, ConvOperand residual = {});

// Convolutions run so far, and the reorders of their tensors into and out of the primitive's
// layouts (an activation reorder copies a whole input or output; channels-last callers need none),
// and the residuals the primitive added itself (no pass over y of their own).
struct Conv2dStats {
  uint64_t calls = 0, activation_reorders = 0, weight_reorders = 0, residual_post_ops = 0;
};
Conv2dStats conv2d_stats();

namespace detail {
// What a convolution with bf16 inputs multiplies in.
enum class ConvMath {
  // The reorders into the primitive's layouts widen bf16 to f32 (exact) and the f32 kernel runs:
  // without AMX, oneDNN's bf16 convolution (vdpbf16ps) is about half as fast as its f32 one on
  // Intel's AVX-512 cores (bench_conv2d shows it), and widening costs nothing extra there since
  // the f32 path reorders every tensor anyway.
  kF32,
  // A bf16 primitive: oneDNN's AMX (or AVX-512-BF16) kernels read bf16 directly. On a Zen 5 core
  // the FLUX.1 VAE's 512² bf16 decode took 3.97 s this way against 11.06 s with kF32.
  kBf16,
};
// kBf16 where bf16 multiplies fast (onednn::bf16_dot_products_fast: AMX, AMD's AVX512-BF16 cores),
// else kF32. Fixed for the process.
ConvMath conv2d_bf16_math();
void conv2d_with_math(ConvMath math, ConvOperand x, ConvOperand w, ConvOperand bias, void* y, DType y_dtype,
                      int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW, int64_t stride_h,
                      int64_t stride_w, int64_t pad_h, int64_t pad_w, bool channels_last = false,
                      ConvOperand residual = {});

// How the oneDNN primitive sees its tensors. conv2d_f32 uses kBlocked (measured faster,
// see conv2d.cc); kPlain is kept so tests and benchmarks can compare the two.
enum class ConvLayout {
  kBlocked,       // format_tag::any: oneDNN picks its layouts; reorders in and out per call
  kPlain,         // the primitive works on the caller's nchw / oihw buffers directly
  kChannelsLast,  // the caller's x and y are nhwc and the primitive reads and writes them in place
};
void conv2d_f32_layout(ConvLayout layout, const float* x, const float* w, const float* bias,
                       float* y, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH,
                       int64_t KW, int64_t stride_h, int64_t stride_w, int64_t pad_h,
                       int64_t pad_w);
}  // namespace detail

}  // namespace kiln::cpu::KILN_CPU_LEVEL
