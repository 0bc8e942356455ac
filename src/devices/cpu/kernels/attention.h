// Scaled dot-product attention for the CPU device: a tiled online-softmax
// (flash-attention style) kernel that never materialises the [Lq,Lk] score matrix.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

// out = softmax(q k^T * scale + mask) v, independently for every (b,h).
// q [B,H,Lq,D], k [B,H,Lk,D], v [B,H,Lk,Dv], out [B,H,Lq,Dv]: contiguous f32.
// (The RowLayout overloads below also take K/V with fewer heads: RowLayout::group.)
// mask: optional (nullptr) additive f32 mask read as
//   mask[b*ms[0] + h*ms[1] + i*ms[2] + j*ms[3]]   (i: query, j: key)
// with strides in elements, 0 for broadcast dims; mask_strides may be null when mask is.
// A query row whose scores are all -inf (fully masked) yields an all-zero output row;
// PyTorch's reference SDPA would give NaN there. A NaN score (or a +inf one) makes its
// row NaN, as in PyTorch.
// Parallel over (b, h, query block) with OpenMP; inside an existing parallel region it
// runs on the calling thread. The GEMMs use gemm_backend().
void attention_f32(const float* q, const float* k, const float* v, const float* mask,
                   const int64_t mask_strides[4], float* out, int64_t B, int64_t H, int64_t Lq,
                   int64_t Lk, int64_t D, int64_t Dv, float scale);

// Where the rows of a [B,H,L,D] operand lie: row (b,h,i) starts at b*batch + (h/group)*head +
// i*row elements from the base pointer, and its D values are contiguous. Attention reads q/k/v
// this way, so a [B,L,H,D] projection viewed as [B,H,L,D] (a transpose) needs no copy.
// `group` > 1 is grouped-query attention (torch's enable_gqa): K and V store H/group heads, and
// query head h reads stored head h/group, so `group` consecutive query heads share one K/V head
// without a copy of it.
struct RowLayout {
  int64_t batch = 0, head = 0, row = 0;
  int64_t group = 1;
  static RowLayout dense(int64_t H, int64_t L, int64_t D) { return {H * L * D, L * D, D}; }
};
// `ol` places the output rows the same way, so a [B,H,L,Dv] result can be written straight into
// a [B,L,H,Dv] buffer (deferred mode folds the transpose that follows attention into it).
void attention_f32(const float* q, RowLayout ql, const float* k, RowLayout kl, const float* v, RowLayout vl,
                   const float* mask, const int64_t mask_strides[4], float* out, RowLayout ol, int64_t B, int64_t H,
                   int64_t Lq, int64_t Lk, int64_t D, int64_t Dv, float scale);

// An operand of attention(): f32 or bf16 elements whose rows lie as `layout` says (each row's
// values contiguous). `data` is written only for the output.
struct AttentionOperand {
  const void* data = nullptr;
  DType dtype = DType::f32;
  RowLayout layout;
};

// How attention's tile products multiply:
enum class AttentionProducts {
  kF32,      // every operand f32: sgemm on the operands in place
  kWidened,  // bf16 rows widened to f32 one tile at a time (exact), then sgemm
  kBf16Dot,  // bf16 q/k/v: oneDNN's bf16 matmul on the rows in place, f32 accumulation
};
// The products attention() uses for these dtypes: kBf16Dot for bf16 q/k/v where bf16 multiplies
// fast (onednn::bf16_dot_products_fast), else kWidened; kF32 for all-f32 operands.
AttentionProducts attention_products(DType q, DType k, DType v, DType out);

// attention_f32 for operands that may also be bf16 (each independently), as Diffusers runs
// attention under torch_dtype=bfloat16:
//  - the products are of bf16 values with f32 accumulation (AttentionProducts: bf16 rows widened
//    to f32 one tile at a time into per-thread scratch, or multiplied in bf16 by oneDNN); no
//    whole-tensor copy is made;
//  - the softmax statistics (running max and sum) stay f32;
//  - when v is bf16 the probability tile is rounded to bf16 before the PV product (what bf16
//    flash attention does; the row sums use the unrounded values);
//  - a bf16 output accumulates in an f32 tile and is rounded once, after the normalisation.
// Masks, fully masked rows and NaNs behave as in attention_f32; all-f32 operands give
// attention_f32's bits. Results never depend on the thread count: every output row is computed
// by one thread in a fixed order.
void attention(const AttentionOperand& q, const AttentionOperand& k, const AttentionOperand& v,
               const float* mask, const int64_t mask_strides[4], const AttentionOperand& out, int64_t B,
               int64_t H, int64_t Lq, int64_t Lk, int64_t D, int64_t Dv, float scale);

// Upper bound of the scratch attention() allocates (all threads together) for these sizes: a
// few query-block x key-block tiles, far below Lq*Lk*4 bytes per head. `widens` says whether any
// operand is bf16 (f32 tiles for the widened rows and the output accumulator). Excludes the GEMM
// library's own packing buffers.
size_t attention_workspace_bytes(int64_t Lq, int64_t Lk, int64_t D, int64_t Dv, bool widens = false);

namespace detail {
// attention() with the products given (tests run each on any CPU): kBf16Dot needs bf16 q/k/v;
// kF32 on non-f32 operands means kWidened. The two bf16 ways differ only in f32 summation order.
void attention_with(AttentionProducts products, const AttentionOperand& q, const AttentionOperand& k,
                    const AttentionOperand& v, const float* mask, const int64_t mask_strides[4],
                    const AttentionOperand& out, int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t D, int64_t Dv,
                    float scale);
}  // namespace detail

}  // namespace kiln::cpu::KILN_CPU_LEVEL
