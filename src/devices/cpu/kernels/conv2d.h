// 2-D convolution on the CPU through oneDNN. Primitives are created once per shape and
// cached (thread-safe), so the repeated VAE conv shapes pay creation only once.
#pragma once
#include <cstdint>

namespace kiln::cpu {

// 2-D convolution, NCHW, groups = 1, dilation 1. x [N,C,H,W], w [O,C,KH,KW], bias [O] or
// nullptr, y [N,O,OH,OW] with OH = (H + 2*pad_h - KH)/stride_h + 1 (OW likewise). All
// contiguous f32; y must not overlap x, w or bias. Callable from any thread.
// Builds a tiny convolution so oneDNN's global state exists before the CPU runtime registers
// its exit drain (see gemm_warm_up).
void conv2d_warm_up();

void conv2d_f32(const float* x, const float* w, const float* bias, float* y, int64_t N, int64_t C,
                int64_t H, int64_t W, int64_t O, int64_t KH, int64_t KW, int64_t stride_h,
                int64_t stride_w, int64_t pad_h, int64_t pad_w);

namespace detail {
// How the oneDNN primitive sees its tensors. conv2d_f32 uses kBlocked (measured faster,
// see conv2d.cc); kPlain is kept so tests and benchmarks can compare the two.
enum class ConvLayout {
  kBlocked,  // format_tag::any: oneDNN picks its layouts; reorders in and out per call
  kPlain,    // the primitive works on the caller's nchw / oihw buffers directly
};
void conv2d_f32_layout(ConvLayout layout, const float* x, const float* w, const float* bias,
                       float* y, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH,
                       int64_t KW, int64_t stride_h, int64_t stride_w, int64_t pad_h,
                       int64_t pad_w);
}  // namespace detail

}  // namespace kiln::cpu
