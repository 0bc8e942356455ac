#include "devices/cpu/kernels/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "core/error.h"
#include "devices/cpu/kernels/gemm.h"

namespace kiln::cpu {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

constexpr const char* kWhere = "attention";
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Tile sizes, measured at L=4608, D=128 with oneDNN on a 2-core Zen 5 (GFLOP/s counting
// the two GEMMs' flops). One thread: q-block 64..256 x k-block 256..1024 all gave
// 160-172, a flat optimum. Two threads, 8 heads: 128x512 291, 128x1024 283, 256x512 282,
// 256x256 280, 128x256 277, 64x512 272. 128x512 also keeps the per-thread score tile at
// 256 KiB, well inside L2. With these the kernel takes ~1.03x (one thread) and ~1.2x
// (two threads, bench_attention) the time of the two plain per-head GEMMs it replaces.
//
// Note: dnnl_sgemm mallocs its packing buffers on every call; this relies on glibc's
// default of serving them from the heap after the first call. Forcing a low mmap
// threshold (e.g. GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536) makes every inner
// GEMM mmap/munmap and slows this kernel ~4x.
constexpr int64_t kQBlock = 128;
constexpr int64_t kKBlock = 512;

// Tile geometry for one call: a thread scores `bq` queries against `bk` keys at a time.
// Score rows are padded to `ld` (a whole number of vectors) to keep rows aligned.
struct Tiles {
  int64_t bq, bk, ld;
};

Tiles choose_tiles(int64_t Lq, int64_t Lk) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t bq = std::max<int64_t>(1, std::min(kQBlock, Lq));
  const int64_t bk = std::max<int64_t>(1, std::min(kKBlock, Lk));
  return {bq, bk, (bk + lanes - 1) / lanes * lanes};
}

// One thread's scratch, in floats: the score tile plus running max, running sum and the
// per-row rescale factor of the current key block. Rounded up to whole cache lines so
// that each thread's part of the shared buffer starts aligned and shares no line.
size_t scratch_floats(const Tiles& t) {
  constexpr int64_t kLine = 64 / sizeof(float);
  return static_cast<size_t>((t.bq * t.ld + 3 * t.bq + kLine - 1) / kLine * kLine);
}

// Threads the parallel region below may use; it sizes the shared scratch buffer.
size_t max_threads() { return static_cast<size_t>(std::max(1, omp_get_max_threads())); }

// row[j] += mask_row[j * stride] for j < n. stride 1 and 0 (broadcast) are vectorised.
void add_mask(float* row, int64_t n, const float* mask_row, int64_t stride) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  if (stride == 1) {
    for (; j + lanes <= n; j += lanes) {
      hn::StoreU(hn::Add(hn::LoadU(d, row + j), hn::LoadU(d, mask_row + j)), d, row + j);
    }
  } else if (stride == 0) {
    const auto m = hn::Set(d, *mask_row);
    for (; j + lanes <= n; j += lanes) hn::StoreU(hn::Add(hn::LoadU(d, row + j), m), d, row + j);
  }
  for (; j < n; ++j) row[j] += mask_row[j * stride];
}

float row_max(const float* row, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto vmax = hn::Set(d, kNegInf);
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) vmax = hn::Max(vmax, hn::LoadU(d, row + j));
  float mx = hn::GetLane(hn::MaxOfLanes(d, vmax));
  for (; j < n; ++j) mx = std::max(mx, row[j]);
  return mx;
}

// row[j] = exp(row[j] - shift) in place; returns the sum of the new values.
// hn::Exp maps NaN to 0; NaNs are kept instead so that a NaN score (or a NaN/inf shift)
// makes the output row NaN, as in PyTorch, rather than silently disappearing.
float exp_and_sum(float* row, int64_t n, float shift) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vshift = hn::Set(d, shift);
  auto vsum = hn::Zero(d);
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    const auto x = hn::Sub(hn::LoadU(d, row + j), vshift);
    const auto p = hn::IfThenElse(hn::IsNaN(x), x, hn::Exp(d, x));
    hn::StoreU(p, d, row + j);
    vsum = hn::Add(vsum, p);
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, vsum));
  for (; j < n; ++j) {
    row[j] = std::exp(row[j] - shift);
    sum += row[j];
  }
  return sum;
}

void scale_row(float* row, int64_t n, float f) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vf = hn::Set(d, f);
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) hn::StoreU(hn::Mul(hn::LoadU(d, row + j), vf), d, row + j);
  for (; j < n; ++j) row[j] *= f;
}

// The operands of one (b,h) pair, already offset to that head.
struct Head {
  const float* q;     // [Lq,D], rows ldq apart
  const float* k;     // [Lk,D], rows ldk apart
  const float* v;     // [Lk,Dv], rows ldv apart
  int64_t ldq, ldk, ldv;
  const float* mask;  // mask + b*ms[0] + h*ms[1], or null
  int64_t mask_row_stride, mask_col_stride;
  float* out;  // [Lq,Dv], rows ldo apart
  int64_t ldo;
  int64_t Lk, D, Dv;
  float scale;
};

// Running softmax state of the rows of one query block.
struct RowStats {
  float* max;   // running max of the scores seen so far (-inf before any)
  float* sum;   // running sum of exp(score - max)
  float* corr;  // rescale factor for the output rows after the current key block
};

// Turns the raw score tile s[nq, nk] of key block j0 into probabilities relative to the
// updated running max, and updates the running sums and per-row rescale factors.
void softmax_tile(const Head& h, int64_t i0, int64_t j0, int64_t nq, int64_t nk, float* s,
                  int64_t ld, RowStats& st) {
  for (int64_t r = 0; r < nq; ++r) {
    float* row = s + r * ld;
    if (h.mask != nullptr) {
      add_mask(row, nk, h.mask + (i0 + r) * h.mask_row_stride + j0 * h.mask_col_stride,
               h.mask_col_stride);
    }
    const float new_max = std::max(st.max[r], row_max(row, nk));
    // While every score of the row so far is -inf, shift by 0 so that exp() yields 0s
    // rather than exp(-inf - -inf) = NaN; the row's output then stays 0.
    const float shift = new_max == kNegInf ? 0.0f : new_max;
    const float tile_sum = exp_and_sum(row, nk, shift);
    st.corr[r] = std::exp(st.max[r] - shift);
    st.sum[r] = st.sum[r] * st.corr[r] + tile_sum;
    st.max[r] = new_max;
  }
}

// Computes the output rows [i0, i0+nq) of one head, streaming over key blocks and
// accumulating straight into `out`.
void attend_query_block(const Head& h, int64_t i0, int64_t nq, const Tiles& t, float* scratch) {
  float* s = scratch;
  RowStats st{s + t.bq * t.ld, s + t.bq * t.ld + t.bq, s + t.bq * t.ld + 2 * t.bq};
  std::fill(st.max, st.max + nq, kNegInf);
  std::fill(st.sum, st.sum + nq, 0.0f);
  const float* q = h.q + i0 * h.ldq;
  float* o = h.out + i0 * h.ldo;
  for (int64_t j0 = 0; j0 < h.Lk; j0 += t.bk) {
    const int64_t nk = std::min(t.bk, h.Lk - j0);
    sgemm(false, true, nq, nk, h.D, h.scale, q, h.ldq, h.k + j0 * h.ldk, h.ldk, 0.0f, s, t.ld);
    softmax_tile(h, i0, j0, nq, nk, s, t.ld, st);
    const bool first = j0 == 0;
    if (!first) {
      for (int64_t r = 0; r < nq; ++r) {
        if (st.corr[r] != 1.0f) scale_row(o + r * h.ldo, h.Dv, st.corr[r]);
      }
    }
    sgemm(false, false, nq, h.Dv, nk, 1.0f, s, t.ld, h.v + j0 * h.ldv, h.ldv, first ? 0.0f : 1.0f,
          o, h.ldo);
  }
  for (int64_t r = 0; r < nq; ++r) {
    scale_row(o + r * h.ldo, h.Dv, st.sum[r] > 0.0f ? 1.0f / st.sum[r] : 0.0f);
  }
}

void check_args(const float* q, const float* k, const float* v, const float* mask,
                const int64_t* ms, const float* out, int64_t B, int64_t H, int64_t Lq,
                int64_t Lk, int64_t D, int64_t Dv) {
  KILN_CHECK(B >= 0 && H >= 0 && Lq >= 0 && Lk >= 0 && D >= 0 && Dv >= 0, kWhere,
             "negative size B=", B, " H=", H, " Lq=", Lq, " Lk=", Lk, " D=", D, " Dv=", Dv);
  KILN_CHECK(mask == nullptr || ms != nullptr, kWhere, "mask given without mask strides");
  const bool any_q = B * H * Lq > 0, any_k = B * H * Lk > 0;
  KILN_CHECK((q != nullptr || !any_q || D == 0) && (out != nullptr || !any_q || Dv == 0) &&
                 (k != nullptr || !any_k || D == 0) && (v != nullptr || !any_k || Dv == 0),
             kWhere, "null q, k, v or out");
}

}  // namespace

size_t attention_workspace_bytes(int64_t Lq, int64_t Lk, int64_t /*D*/, int64_t /*Dv*/) {
  // The output tile accumulates in `out` itself, so only the score tile and row stats
  // need scratch, one per thread.
  return max_threads() * scratch_floats(choose_tiles(Lq, Lk)) * sizeof(float);
}

void attention_f32(const float* q, const float* k, const float* v, const float* mask,
                   const int64_t mask_strides[4], float* out, int64_t B, int64_t H, int64_t Lq,
                   int64_t Lk, int64_t D, int64_t Dv, float scale) {
  attention_f32(q, RowLayout::dense(H, Lq, D), k, RowLayout::dense(H, Lk, D), v, RowLayout::dense(H, Lk, Dv), mask,
                mask_strides, out, RowLayout::dense(H, Lq, Dv), B, H, Lq, Lk, D, Dv, scale);
}

void attention_f32(const float* q, RowLayout ql, const float* k, RowLayout kl, const float* v, RowLayout vl,
                   const float* mask, const int64_t mask_strides[4], float* out, RowLayout ol, int64_t B, int64_t H,
                   int64_t Lq, int64_t Lk, int64_t D, int64_t Dv, float scale) {
  KILN_CHECK(ql.row >= D && kl.row >= D && vl.row >= Dv && ol.row >= Dv, kWhere, "row strides ", ql.row, "/", kl.row,
             "/", vl.row, "/", ol.row, " are shorter than the rows (", D, "/", Dv, ")");
  check_args(q, k, v, mask, mask_strides, out, B, H, Lq, Lk, D, Dv);
  if (B * H * Lq == 0 || Dv == 0) return;
  if (Lk == 0) {  // empty softmax: treated like a fully masked row
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hh = 0; hh < H; ++hh)
        for (int64_t i = 0; i < Lq; ++i) std::fill_n(out + b * ol.batch + hh * ol.head + i * ol.row, Dv, 0.0f);
    return;
  }
  const Tiles t = choose_tiles(Lq, Lk);
  const int64_t q_blocks = (Lq + t.bq - 1) / t.bq;
  const int64_t tasks = B * H * q_blocks;
  // Allocated here rather than per thread inside the region so that a failed allocation
  // throws normally; thread i uses part i.
  const size_t per_thread = scratch_floats(t);
  const size_t threads = max_threads();
  const std::unique_ptr<float, decltype(&std::free)> scratch(
      static_cast<float*>(std::aligned_alloc(64, threads * per_thread * sizeof(float))),
      &std::free);
  KILN_CHECK(scratch != nullptr, kWhere, "cannot allocate ", threads * per_thread * sizeof(float),
             " bytes of scratch");
  std::exception_ptr error;
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    float* my_scratch = scratch.get() + static_cast<size_t>(omp_get_thread_num()) * per_thread;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t bh = task / q_blocks, b = bh / H, hh = bh % H;
      const int64_t i0 = (task % q_blocks) * t.bq;
      const Head head{q + b * ql.batch + hh * ql.head,
                      k + b * kl.batch + hh * kl.head,
                      v + b * vl.batch + hh * vl.head,
                      ql.row,
                      kl.row,
                      vl.row,
                      mask ? mask + b * mask_strides[0] + hh * mask_strides[1] : nullptr,
                      mask ? mask_strides[2] : 0,
                      mask ? mask_strides[3] : 0,
                      out + b * ol.batch + hh * ol.head,
                      ol.row,
                      Lk,
                      D,
                      Dv,
                      scale};
      // An exception must not leave the parallel region; keep the first, rethrow after.
      try {
        attend_query_block(head, i0, std::min(t.bq, Lq - i0), t, my_scratch);
      } catch (...) {
#pragma omp critical(kiln_attention_error)
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace kiln::cpu
