#include "devices/cpu/kernels/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <compare>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "core/error.h"
#include "core/tensor_view.h"
#include "devices/cpu/kernels/exp2_to_bf16.h"
#include "devices/cpu/kernels/exp2_vec.h"
#include "devices/cpu/kernels/f32_io.h"
#include "devices/cpu/kernels/gemm.h"
#include "devices/cpu/kernels/onednn.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

constexpr const char* kWhere = "attention";
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Tile sizes: 128 query rows x 512 keys was the best of a sweep on two threads (the optimum is
// flat within ~7%; docs/benchmarks-history.md, "Attention tile sizes"), and keeps the
// per-thread score tile at 256 KiB, well inside L2.
//
// Note: dnnl_sgemm mallocs its packing buffers on every call; this relies on glibc's
// default of serving them from the heap after the first call. Forcing a low mmap
// threshold (e.g. GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536) makes every inner
// GEMM mmap/munmap and slows this kernel ~4x.
constexpr int64_t kQBlock = 128;
constexpr int64_t kKBlock = 512;
// With bf16 operands every query block widens all of its head's k and v rows, so larger query
// blocks widen less: 256 halves that work (it was ~4% of the time at 128), and the thread's
// tiles (~1.3 MiB) still fit L2. Those products run as f32 GEMMs: on Intel's AVX-512 cores
// without AMX, vdpbf16ps retires half the multiply-adds per cycle of f32 FMA, and oneDNN's bf16
// matmul on these tiles was slower than sgemm (bench_attention's tiles_* cases compare the two).
// Where bf16 multiplies fast (onednn::bf16_dot_products_fast) the tiles of bf16 q/k/v go to
// oneDNN's bf16 matmul instead (AttentionProducts::kBf16Dot): on a Zen 5 core, 2.3x the widened
// tiles' rate at L=4608. Same tile shape (bench_attention measured it).
constexpr int64_t kQBlockWidened = 256;

// Tile geometry for one call: a thread scores `bq` queries against `bk` keys at a time.
// Score rows are padded to `ld` (a whole number of vectors) to keep rows aligned. When an
// operand is bf16, a thread also keeps f32 copies of its query rows (bq x D), of the current
// key block's k and v rows (bk x D, bk x Dv) and an f32 output accumulator (bq x Dv).
struct Tiles {
  int64_t bq, bk, ld;
  int64_t D, Dv;
  AttentionProducts products;
};

Tiles choose_tiles(int64_t Lq, int64_t Lk, int64_t D, int64_t Dv, AttentionProducts products) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t bq = std::max<int64_t>(1, std::min(products == AttentionProducts::kF32 ? kQBlock : kQBlockWidened, Lq));
  const int64_t bk = std::max<int64_t>(1, std::min(kKBlock, Lk));
  return {bq, bk, (bk + lanes - 1) / lanes * lanes, D, Dv, products};
}

// Where one thread's part of the scratch buffer keeps what, in floats from its start.
struct ScratchLayout {
  size_t stats, qf, kf, vf, pb, acc, total;
};

// Each part starts on a cache line, and the total is whole cache lines, so that each thread's
// part of the shared buffer starts aligned and shares no line.
ScratchLayout scratch_layout(const Tiles& t) {
  constexpr size_t kLine = 64 / sizeof(float);
  const auto lines = [](int64_t floats) { return (static_cast<size_t>(floats) + kLine - 1) / kLine * kLine; };
  ScratchLayout l{};
  l.stats = lines(t.bq * t.ld);  // the score tile comes first
  l.qf = l.stats + lines(3 * t.bq);
  switch (t.products) {
    case AttentionProducts::kF32:
      l.kf = l.vf = l.pb = l.acc = l.total = l.qf;
      return l;
    case AttentionProducts::kWidened:
      l.kf = l.qf + lines(t.bq * t.D);
      l.vf = l.kf + lines(t.bk * t.D);
      l.pb = l.acc = l.vf + lines(t.bk * t.Dv);
      break;
    case AttentionProducts::kBf16Dot:  // the probability tile in bf16: half a float per value
      l.kf = l.vf = l.pb = l.qf;
      l.acc = l.pb + lines((t.bq * t.ld + 1) / 2);
      break;
  }
  l.total = l.acc + lines(t.bq * t.Dv);
  return l;
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
  // Four running maxima, so that consecutive vectors do not wait on one another.
  auto vmax = hn::Set(d, kNegInf), vmax1 = vmax, vmax2 = vmax, vmax3 = vmax;
  int64_t j = 0;
  for (; j + 4 * lanes <= n; j += 4 * lanes) {
    vmax = hn::Max(vmax, hn::LoadU(d, row + j));
    vmax1 = hn::Max(vmax1, hn::LoadU(d, row + j + lanes));
    vmax2 = hn::Max(vmax2, hn::LoadU(d, row + j + 2 * lanes));
    vmax3 = hn::Max(vmax3, hn::LoadU(d, row + j + 3 * lanes));
  }
  vmax = hn::Max(hn::Max(vmax, vmax1), hn::Max(vmax2, vmax3));
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

// The bf16 bits of f32 lanes (as u32 lanes holding the upper half), rounded to nearest with ties
// to even as f32_to_bf16 rounds; NaN lanes are left to the caller.
hn::Vec<hn::RebindToUnsigned<DF>> bf16_rounded_bits(hn::Vec<DF> x) {
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::BitCast(du, x);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  return hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7fffu), lsb)));
}

void scale_row(float* row, int64_t n, float f) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vf = hn::Set(d, f);
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) hn::StoreU(hn::Mul(hn::LoadU(d, row + j), vf), d, row + j);
  for (; j < n; ++j) row[j] *= f;
}

// row[j] = float(bf16(row[j])) in place, rounding as f32_to_bf16 does (to nearest, ties to
// even), so each value is exactly the bf16 that convert_from_f32 would store. NaNs stay.
void round_to_bf16(float* row, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    const auto x = hn::LoadU(d, row + j);
    const auto r = hn::BitCast(d, hn::ShiftLeft<16>(bf16_rounded_bits(x)));
    hn::StoreU(hn::IfThenElse(hn::IsNaN(x), x, r), d, row + j);
  }
  for (; j < n; ++j) row[j] = std::isnan(row[j]) ? row[j] : bf16_to_f32(f32_to_bf16(row[j]));
}

// C[M,N] (f32, rows ldc apart) = A[M,K] B (+ C when accumulating), A and B bf16 with rows lda and
// ldb apart; B is read as stored [K,N], or as the transpose of a stored [N,K] (trans_b). Through
// oneDNN's bf16 matmul (f32 accumulation), one primitive per distinct shape and stride, built once
// and shared by the threads, each running it on its own stream with its own scratchpad. Called
// from inside the parallel region, it runs on the calling thread.
struct TileMatmulKey {
  int64_t M, N, K, lda, ldb, ldc;
  bool trans_b, accumulate;
  auto operator<=>(const TileMatmulKey&) const = default;
};
struct TileMatmul {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

const TileMatmul& tile_matmul(const TileMatmulKey& k) {
  static std::mutex mu;
  static std::map<TileMatmulKey, std::unique_ptr<TileMatmul>> plans;
  std::lock_guard<std::mutex> lock(mu);
  auto& plan = plans[k];
  if (!plan) {
    using md = dnnl::memory::desc;
    using dt = dnnl::memory::data_type;
    const md a({k.M, k.K}, dt::bf16, {k.lda, 1});
    const md b({k.K, k.N}, dt::bf16, k.trans_b ? dnnl::memory::dims{1, k.ldb} : dnnl::memory::dims{k.ldb, 1});
    const md c({k.M, k.N}, dt::f32, {k.ldc, 1});
    dnnl::primitive_attr attr = onednn::user_scratchpad_attr();
    if (k.accumulate) {
      dnnl::post_ops sum;
      sum.append_sum(1.0f);
      attr.set_post_ops(sum);
    }
    auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, onednn::engine());
    plan = std::make_unique<TileMatmul>(TileMatmul{pd, dnnl::matmul(pd)});
  }
  return *plan;
}

// One thread's arguments of one tile product: memory objects made once, whose data handles each
// call sets, and the primitive's scratchpad, allocated once per thread and shape rather than on
// every call (a key block's products are small: building them each time is work of the same order).
struct BoundTileMatmul {
  const TileMatmul* mm;
  dnnl::memory a, b, c;
  onednn::Args args;
};

BoundTileMatmul& bound_tile_matmul(const TileMatmulKey& k) {
  thread_local std::map<TileMatmulKey, BoundTileMatmul> bound;
  auto it = bound.find(k);
  if (it != bound.end()) return it->second;
  const TileMatmul& mm = tile_matmul(k);
  const dnnl::engine& eng = onednn::engine();
  BoundTileMatmul t{&mm, dnnl::memory(mm.pd.src_desc(), eng, nullptr), dnnl::memory(mm.pd.weights_desc(), eng, nullptr),
                    dnnl::memory(mm.pd.dst_desc(), eng, nullptr), {}};
  t.args = {{DNNL_ARG_SRC, t.a}, {DNNL_ARG_WEIGHTS, t.b}, {DNNL_ARG_DST, t.c}};
  onednn::add_scratchpad(t.args, mm.pd.scratchpad_desc());
  return bound.emplace(k, std::move(t)).first->second;
}

void bf16_tile_product(const TileMatmulKey& k, const void* a, const void* b, float* c) {
  BoundTileMatmul& t = bound_tile_matmul(k);
  t.a.set_data_handle(const_cast<void*>(a));
  t.b.set_data_handle(const_cast<void*>(b));
  t.c.set_data_handle(c);
  dnnl::stream& stream = onednn::thread_stream();
  t.mm->prim.execute(stream, t.args);
  stream.wait();
}

// Rows of one [L, width] matrix of a head: row r at base + r * ld elements.
struct Rows {
  const char* base;
  DType dtype;  // f32 or bf16
  int64_t ld;

  // Row r in the operand's own dtype.
  const void* row(int64_t r) const { return base + r * ld * int64_t(dtype_size(dtype)); }

  // Rows [r0, r0 + n) as f32: the operand's own memory when it is f32, else widened into
  // `buf` (rows `width` apart). Sets `ld_out` to the row stride of what it returns.
  const float* f32(int64_t r0, int64_t n, int64_t width, float* buf, int64_t& ld_out) const {
    if (dtype == DType::f32) {
      ld_out = ld;
      return static_cast<const float*>(row(r0));
    }
    for (int64_t r = 0; r < n; ++r) convert_to_f32(row(r0 + r), dtype, buf + r * width, width);
    ld_out = width;
    return buf;
  }
};

// The operands of one (b,h) pair, already offset to that head.
struct Head {
  Rows q, k, v;       // [Lq,D], [Lk,D], [Lk,Dv]
  const float* mask;  // mask + b*ms[0] + h*ms[1], or null
  int64_t mask_row_stride, mask_col_stride;
  char* out;  // [Lq,Dv], rows ldo elements apart
  DType out_dtype;
  int64_t ldo;
  int64_t Lk, D, Dv;
  float scale;
  bool round_p;  // v is bf16: the probabilities are rounded to bf16 before the PV product
};

// Running softmax state of the rows of one query block.
struct RowStats {
  float* max;   // running max of the scores seen so far (-inf before any)
  float* sum;   // running sum of exp(score - max)
  float* corr;  // rescale factor for the output rows after the current key block
};

// Turns the raw score tile s[nq, nk] of key block j0 into probabilities relative to the
// updated running max, and updates the running sums and per-row rescale factors. Scores are
// multiplied by `scale` first unless it is 1 (the bf16 products leave them unscaled); with `pb` the
// probabilities are also written rounded to bf16 there, rows `ld` apart. Each row goes through
// every step in turn while it is in L1, rather than the tile through L2 once per step.
void softmax_tile(const Head& h, int64_t i0, int64_t j0, int64_t nq, int64_t nk, float* s,
                  int64_t ld, RowStats& st, float scale = 1.0f, uint16_t* pb = nullptr) {
  for (int64_t r = 0; r < nq; ++r) {
    float* row = s + r * ld;
    if (pb != nullptr && h.mask == nullptr && scale > 0.0f) {
      // The steps below in two passes over the row, not four, the first only reading it: with
      // scale > 0 the scaled row's max is the scaled max, and scale joins the exponent's multiply-add.
      const float new_max = std::max(st.max[r], row_max(row, nk) * scale);
      const float shift = new_max == kNegInf ? 0.0f : new_max;
      const float tile_sum = exp2_sum_to_bf16(row, nk, scale * narrow::kLog2e, shift * narrow::kLog2e, pb + r * ld);
      st.corr[r] = std::exp(st.max[r] - shift);
      st.sum[r] = st.sum[r] * st.corr[r] + tile_sum;
      st.max[r] = new_max;
      continue;
    }
    if (scale != 1.0f) scale_row(row, nk, scale);
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
    if (pb != nullptr) convert_from_f32(row, pb + r * ld, DType::bf16, nk);  // to nearest even, as round_to_bf16
  }
}

// Computes the output rows [i0, i0+nq) of one head, streaming over key blocks. An f32 output
// accumulates in place; any other output accumulates in the scratch's f32 tile and is rounded
// into the output once, at the end.
void attend_query_block(const Head& h, int64_t i0, int64_t nq, const Tiles& t, float* scratch) {
  const ScratchLayout sl = scratch_layout(t);
  const bool dot = t.products == AttentionProducts::kBf16Dot;
  float* s = scratch;
  RowStats st{scratch + sl.stats, scratch + sl.stats + t.bq, scratch + sl.stats + 2 * t.bq};
  std::fill(st.max, st.max + nq, kNegInf);
  std::fill(st.sum, st.sum + nq, 0.0f);
  int64_t ldq = 0, ldk = 0, ldv = 0;
  const float* q = dot ? nullptr : h.q.f32(i0, nq, h.D, scratch + sl.qf, ldq);
  auto* pb = reinterpret_cast<uint16_t*>(scratch + sl.pb);  // dot: the probability tile in bf16
  const bool in_place = h.out_dtype == DType::f32;
  float* o = in_place ? reinterpret_cast<float*>(h.out) + i0 * h.ldo : scratch + sl.acc;
  const int64_t ldo = in_place ? h.ldo : h.Dv;
  for (int64_t j0 = 0; j0 < h.Lk; j0 += t.bk) {
    const int64_t nk = std::min(t.bk, h.Lk - j0);
    const bool first = j0 == 0;
    if (dot) {  // v is bf16 too: the probabilities go to the PV product rounded to bf16
      bf16_tile_product({nq, nk, h.D, h.q.ld, h.k.ld, t.ld, true, false}, h.q.row(i0), h.k.row(j0), s);
      softmax_tile(h, i0, j0, nq, nk, s, t.ld, st, h.scale, pb);
    } else {
      const float* k = h.k.f32(j0, nk, h.D, scratch + sl.kf, ldk);
      sgemm(false, true, nq, nk, h.D, h.scale, q, ldq, k, ldk, 0.0f, s, t.ld);
      softmax_tile(h, i0, j0, nq, nk, s, t.ld, st);
    }
    if (!first) {
      for (int64_t r = 0; r < nq; ++r) {
        if (st.corr[r] != 1.0f) scale_row(o + r * ldo, h.Dv, st.corr[r]);
      }
    }
    if (dot) {
      bf16_tile_product({nq, h.Dv, nk, t.ld, h.v.ld, ldo, false, !first}, pb, h.v.row(j0), o);
      continue;
    }
    if (h.round_p) {
      for (int64_t r = 0; r < nq; ++r) round_to_bf16(s + r * t.ld, nk);
    }
    const float* v = h.v.f32(j0, nk, h.Dv, scratch + sl.vf, ldv);
    sgemm(false, false, nq, h.Dv, nk, 1.0f, s, t.ld, v, ldv, first ? 0.0f : 1.0f, o, ldo);
  }
  for (int64_t r = 0; r < nq; ++r) {
    scale_row(o + r * ldo, h.Dv, st.sum[r] > 0.0f ? 1.0f / st.sum[r] : 0.0f);
  }
  if (!in_place) {
    const int64_t es = int64_t(dtype_size(h.out_dtype));
    for (int64_t r = 0; r < nq; ++r) convert_from_f32(o + r * ldo, h.out + (i0 + r) * h.ldo * es, h.out_dtype, h.Dv);
  }
}

void check_args(const AttentionOperand& q, const AttentionOperand& k, const AttentionOperand& v,
                const float* mask, const int64_t* ms, const AttentionOperand& out, int64_t B, int64_t H,
                int64_t Lq, int64_t Lk, int64_t D, int64_t Dv) {
  KILN_CHECK(B >= 0 && H >= 0 && Lq >= 0 && Lk >= 0 && D >= 0 && Dv >= 0, kWhere,
             "negative size B=", B, " H=", H, " Lq=", Lq, " Lk=", Lk, " D=", D, " Dv=", Dv);
  KILN_CHECK(q.layout.row >= D && k.layout.row >= D && v.layout.row >= Dv && out.layout.row >= Dv, kWhere,
             "row strides ", q.layout.row, "/", k.layout.row, "/", v.layout.row, "/", out.layout.row,
             " are shorter than the rows (", D, "/", Dv, ")");
  KILN_CHECK(f32_or_bf16(q.dtype) && f32_or_bf16(k.dtype) && f32_or_bf16(v.dtype) &&
                 f32_or_bf16(out.dtype),
             kWhere, "q, k, v and out must be f32 or bf16, got ", dtype_name(q.dtype), ", ", dtype_name(k.dtype),
             ", ", dtype_name(v.dtype), ", ", dtype_name(out.dtype));
  KILN_CHECK(mask == nullptr || ms != nullptr, kWhere, "mask given without mask strides");
  KILN_CHECK(q.layout.group == 1 && out.layout.group == 1 && k.layout.group >= 1 && v.layout.group >= 1 &&
                 H % k.layout.group == 0 && H % v.layout.group == 0,
             kWhere, "head groups q ", q.layout.group, ", k ", k.layout.group, ", v ", v.layout.group, ", out ",
             out.layout.group, " for ", H, " query heads (K/V groups must divide H; q and out are not grouped)");
  const bool any_q = B * H * Lq > 0, any_k = B * H * Lk > 0;
  KILN_CHECK((q.data != nullptr || !any_q || D == 0) && (out.data != nullptr || !any_q || Dv == 0) &&
                 (k.data != nullptr || !any_k || D == 0) && (v.data != nullptr || !any_k || Dv == 0),
             kWhere, "null q, k, v or out");
}

// Rows of (query) head (b, hh) of an operand: stored head hh / group.
Rows head_rows(const AttentionOperand& x, int64_t b, int64_t hh) {
  const int64_t off = (b * x.layout.batch + hh / x.layout.group * x.layout.head) * int64_t(dtype_size(x.dtype));
  return {static_cast<const char*>(x.data) + off, x.dtype, x.layout.row};
}

}  // namespace

AttentionProducts attention_products(DType q, DType k, DType v, DType out) {
  if (q == DType::f32 && k == DType::f32 && v == DType::f32 && out == DType::f32) return AttentionProducts::kF32;
  if (q == DType::bf16 && k == DType::bf16 && v == DType::bf16 && onednn::bf16_dot_products_fast())
    return AttentionProducts::kBf16Dot;
  return AttentionProducts::kWidened;
}

size_t attention_workspace_bytes(int64_t Lq, int64_t Lk, int64_t D, int64_t Dv, bool widens) {
  // An f32 output tile accumulates in `out` itself, so without bf16 operands only the score
  // tile and row stats need scratch, one per thread.
  const AttentionProducts products =
      widens ? attention_products(DType::bf16, DType::bf16, DType::bf16, DType::bf16) : AttentionProducts::kF32;
  return max_threads() * scratch_layout(choose_tiles(Lq, Lk, D, Dv, products)).total * sizeof(float);
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
  attention({q, DType::f32, ql}, {k, DType::f32, kl}, {v, DType::f32, vl}, mask, mask_strides,
            {out, DType::f32, ol}, B, H, Lq, Lk, D, Dv, scale);
}

void attention(const AttentionOperand& q, const AttentionOperand& k, const AttentionOperand& v,
               const float* mask, const int64_t mask_strides[4], const AttentionOperand& out, int64_t B,
               int64_t H, int64_t Lq, int64_t Lk, int64_t D, int64_t Dv, float scale) {
  detail::attention_with(attention_products(q.dtype, k.dtype, v.dtype, out.dtype), q, k, v, mask, mask_strides,
                         out, B, H, Lq, Lk, D, Dv, scale);
}

namespace detail {

void attention_with(AttentionProducts products, const AttentionOperand& q, const AttentionOperand& k,
                    const AttentionOperand& v, const float* mask, const int64_t mask_strides[4],
                    const AttentionOperand& out, int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t D, int64_t Dv,
                    float scale) {
  check_args(q, k, v, mask, mask_strides, out, B, H, Lq, Lk, D, Dv);
  const bool all_f32 = q.dtype == DType::f32 && k.dtype == DType::f32 && v.dtype == DType::f32 &&
                       out.dtype == DType::f32;
  const bool all_bf16_in = q.dtype == DType::bf16 && k.dtype == DType::bf16 && v.dtype == DType::bf16;
  KILN_CHECK(products != AttentionProducts::kBf16Dot || all_bf16_in, kWhere,
             "bf16 tile products need bf16 q, k and v, got ", dtype_name(q.dtype), ", ", dtype_name(k.dtype), ", ",
             dtype_name(v.dtype));
  if (products == AttentionProducts::kF32 && !all_f32) products = AttentionProducts::kWidened;
  if (B * H * Lq == 0 || Dv == 0) return;
  char* const out_base = static_cast<char*>(const_cast<void*>(out.data));
  const int64_t out_es = int64_t(dtype_size(out.dtype));
  const RowLayout ol = out.layout;
  if (Lk == 0) {  // empty softmax: treated like a fully masked row (+0.0 is all-zero bits in f32 and bf16)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hh = 0; hh < H; ++hh)
        for (int64_t i = 0; i < Lq; ++i)
          std::fill_n(out_base + (b * ol.batch + hh * ol.head + i * ol.row) * out_es, Dv * out_es, char(0));
    return;
  }
  const Tiles t = choose_tiles(Lq, Lk, D, Dv, products);
  const int64_t q_blocks = (Lq + t.bq - 1) / t.bq;
  const int64_t tasks = B * H * q_blocks;
  // Allocated here rather than per thread inside the region so that a failed allocation
  // throws normally; thread i uses part i.
  const size_t per_thread = scratch_layout(t).total;
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
      const Head head{head_rows(q, b, hh),
                      head_rows(k, b, hh),
                      head_rows(v, b, hh),
                      mask ? mask + b * mask_strides[0] + hh * mask_strides[1] : nullptr,
                      mask ? mask_strides[2] : 0,
                      mask ? mask_strides[3] : 0,
                      out_base + (b * ol.batch + hh * ol.head) * out_es,
                      out.dtype,
                      ol.row,
                      Lk,
                      D,
                      Dv,
                      scale,
                      v.dtype == DType::bf16};
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

}  // namespace detail

}  // namespace kiln::cpu::KILN_CPU_LEVEL
