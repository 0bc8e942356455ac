#include "devices/cpu/kernels/amx_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "devices/cpu/kernels/call_scratch.h"

#if defined(__x86_64__) && defined(__GNUC__) && __has_include(<amxtileintrin.h>)
#define KILN_AMX_KERNEL 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define KILN_AMX_KERNEL 0
#endif

namespace kiln::cpu::inline KILN_CPU_LEVEL {
namespace {

constexpr const char* kOp = "linear";

#if KILN_AMX_KERNEL

// The tiles: A (x) tiles are 16 rows by 32 k; B (w) tiles are 16 pairs of k by 16 columns, each
// pair adjacent (the layout TDPBF16PS reads); C tiles are 16 by 16 f32. One step of the inner
// loop multiplies a 32-row block of x by a 32-column panel of w over 32 k: 2 A tiles, 2 B tiles,
// 4 C tiles (the 8 tile registers).
constexpr int64_t kRows = 32;         // rows of x per block
constexpr int64_t kCols = 32;         // columns of w per panel
constexpr int64_t kStep = 32;         // k per tile product
constexpr int64_t kTileElems = 512;   // bf16 values in a 1 KiB tile
constexpr int64_t kGroupPanels = 4;   // panels whose packed chunk a thread keeps in L2 (128 columns)
constexpr int64_t kChunkMax = 3072;   // most k per packed chunk: 4 panels x 3072 k = 768 KiB
constexpr int64_t kGroupCols = kGroupPanels * kCols;

// ARCH_REQ_XCOMP_PERM and XFEATURE_XTILEDATA from <asm/prctl.h> (absent from older headers).
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

bool cpu_and_os_allow_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  if (!amx_bf16 || !amx_tile || !__builtin_cpu_supports("avx512f")) return false;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// The shapes of one call, padded to whole tiles.
struct Shape {
  int64_t M, N, K;
  int64_t row_blocks, panels, k_steps;  // padded M / 32, N / 32 (rounded up), padded K / 32
  int64_t chunk_steps;                  // k steps per chunk (the last may have fewer)
  int64_t chunks;
  Shape(int64_t m, int64_t n, int64_t k) : M(m), N(n), K(k) {
    row_blocks = (M + kRows - 1) / kRows;
    panels = (N + kCols - 1) / kCols;
    k_steps = (K + kStep - 1) / kStep;
    const int64_t max_steps = kChunkMax / kStep;
    chunks = (k_steps + max_steps - 1) / max_steps;
    chunk_steps = (k_steps + chunks - 1) / chunks;
  }
};

// x as the A tiles read it: row-major bf16 rows of `ld` elements (ld a multiple of 32), with
// zeros past K and past M up to whole row blocks. x itself where K is a multiple of 32, except its
// last partial row block, which is copied; else a zero-padded copy of the whole of x. (Reading x
// in place rather than repacking it saves a pass over x and its scratch: the pages of a fresh
// scratch cost more than the pass.)
class XOperand {
 public:
  XOperand(const uint16_t* x, const Shape& s)
      : x_(x),
        K_(s.K),
        ld_(s.k_steps * kStep),
        full_(ld_ == s.K ? s.M / kRows : 0),  // row blocks read in place
        copy_(kOp, size_t((s.row_blocks - full_) * kRows * ld_) * 2) {
    uint16_t* c = copy_.as<uint16_t>();
    const int64_t rows = (s.row_blocks - full_) * kRows;
#pragma omp parallel for schedule(static) if (rows * ld_ > (int64_t(1) << 16))
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = full_ * kRows + r, n = row < s.M ? s.K : 0;
      if (n > 0) std::memcpy(c + r * ld_, x + row * s.K, size_t(n) * 2);
      std::memset(c + r * ld_ + n, 0, size_t(ld_ - n) * 2);
    }
  }
  // Row 0 of row block b, k = 0.
  const uint16_t* block(int64_t b) const {
    return b < full_ ? x_ + b * kRows * K_ : copy_.as<uint16_t>() + (b - full_) * kRows * ld_;
  }
  // Elements between rows: K where x is read in place (K is then a multiple of 32), the padded K
  // in the copy.
  int64_t ld() const { return ld_; }

 private:
  const uint16_t* x_;
  int64_t K_, ld_, full_;
  CallScratch copy_;
};

// Transposes a 16x16 matrix of 32-bit elements held in 16 registers, in place. (The maskz forms
// with full masks are the plain instructions; GCC 12 warns about the plain intrinsics' undefined
// pass-through operand.)
__attribute__((target("avx512f"))) inline void transpose_16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_maskz_unpacklo_epi32(0xffff, r[i], r[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(0xffff, r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_maskz_unpacklo_epi64(0xff, t[i], t[i + 2]);
    r[i + 1] = _mm512_maskz_unpackhi_epi64(0xff, t[i], t[i + 2]);
    r[i + 2] = _mm512_maskz_unpacklo_epi64(0xff, t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_maskz_unpackhi_epi64(0xff, t[i + 1], t[i + 3]);
  }
  // Each 128-bit lane l of r[4g + j] now holds row j of the 4x4 block (rows 4g.., columns 4l..).
  for (int g = 0; g < 16; g += 8)
    for (int j = 0; j < 4; ++j) {
      t[g + j] = _mm512_maskz_shuffle_i32x4(0xffff, r[g + j], r[g + 4 + j], 0x88);
      t[g + 4 + j] = _mm512_maskz_shuffle_i32x4(0xffff, r[g + j], r[g + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_maskz_shuffle_i32x4(0xffff, t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_maskz_shuffle_i32x4(0xffff, t[j], t[8 + j], 0xdd);
  }
}

// One B tile: columns c0..c0+15 of w over k0..k0+31, as 16 rows (pairs of k) of 16 columns.
__attribute__((target("avx512f"))) void pack_w_tile(const uint16_t* w, uint16_t* dst, const Shape& s, int64_t c0,
                                                     int64_t k0) {
  if (c0 + 16 <= s.N && k0 + kStep <= s.K) {
    // Row p of the tile is the 32-bit pair (k0 + 2p, k0 + 2p + 1) of each of the 16 columns: the
    // 16 columns' 64-byte runs, as 16x16 pairs, transposed.
    __m512i r[16];
    for (int c = 0; c < 16; ++c) r[c] = _mm512_loadu_si512(w + (c0 + c) * s.K + k0);
    transpose_16x16(r);
    for (int p = 0; p < 16; ++p) _mm512_storeu_si512(dst + p * 32, r[p]);
    return;
  }
  for (int p = 0; p < 16; ++p)
    for (int c = 0; c < 16; ++c)
      for (int e = 0; e < 2; ++e) {
        const int64_t col = c0 + c, k = k0 + 2 * p + e;
        dst[p * 32 + c * 2 + e] = col < s.N && k < s.K ? w[col * s.K + k] : 0;
      }
}

// Panels [p0, p1) of w over steps [st0, st1) into `wb`: panel q, step t, half h at
// ((q * (st1 - st0) + t) * 2 + h) tiles.
void pack_w_chunk(const uint16_t* w, uint16_t* wb, const Shape& s, int64_t p0, int64_t p1, int64_t st0,
                  int64_t st1) {
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t st = st0; st < st1; ++st)
      for (int64_t h = 0; h < 2; ++h)
        pack_w_tile(w, wb + (((p - p0) * (st1 - st0) + (st - st0)) * 2 + h) * kTileElems, s, p * kCols + h * 16,
                    st * kStep);
}

// Rows of block b (those below M) of columns [c0, c1) from the f32 sums `acc` (row stride
// kGroupCols) plus the bias, into y; bf16 rounded as f32_to_bf16 rounds (to nearest even, NaN
// kept quiet).
__attribute__((target("avx512f"))) void store_rows(const float* acc, const float* bias, void* y, DType y_type,
                                                    const Shape& s, int64_t b, int64_t c0, int64_t c1) {
  const int64_t n = c1 - c0;
  const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x40);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  for (int64_t r = 0; r < kRows && b * kRows + r < s.M; ++r) {
    const float* src = acc + r * kGroupCols;
    const int64_t row = b * kRows + r;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
      __m512 v = _mm512_maskz_loadu_ps(m, src + j);
      if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + c0 + j));
      if (y_type == DType::f32) {
        _mm512_mask_storeu_ps(static_cast<float*>(y) + row * s.N + c0 + j, m, v);
        continue;
      }
      const __m512i u = _mm512_castps_si512(v);
      const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(0xffff, u, 16), one);
      __m512i h = _mm512_maskz_srli_epi32(0xffff, _mm512_add_epi32(u, _mm512_add_epi32(half, lsb)), 16);
      const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
      h = _mm512_mask_or_epi32(h, nan, _mm512_maskz_srli_epi32(0xffff, u, 16), quiet);
      _mm512_mask_cvtepi32_storeu_epi16(static_cast<uint16_t*>(y) + row * s.N + c0 + j, m, h);
    }
  }
}

// One thread's share: row blocks [b0, b1) by panels [p0, p1). `wb` holds one packed chunk
// (kGroupPanels x chunk_steps tiles pairs), `acc` the f32 sums of the thread's rows for one group.
__attribute__((target("amx-tile,amx-bf16,avx512f"))) void run_share(const XOperand& xa, const uint16_t* w,
                                                                     const float* bias, void* y, DType y_type,
                                                                     const Shape& s, int64_t b0, int64_t b1,
                                                                     int64_t p0, int64_t p1, uint16_t* wb,
                                                                     float* acc) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.bytes_per_row[t] = 64;
  }
  _tile_loadconfig(&cfg);
  constexpr int64_t ldc = kGroupCols * int64_t(sizeof(float));
  const int64_t lda = xa.ld() * 2;  // bytes
  for (int64_t g0 = p0; g0 < p1; g0 += kGroupPanels) {
    const int64_t g1 = std::min(p1, g0 + kGroupPanels), group = g1 - g0;
    for (int64_t ch = 0; ch < s.chunks; ++ch) {
      const int64_t st0 = ch * s.chunk_steps, st1 = std::min(s.k_steps, st0 + s.chunk_steps), steps = st1 - st0;
      pack_w_chunk(w, wb, s, g0, g1, st0, st1);
      // Lines of the next row block's chunk of x (32 rows of `steps` lines) to prefetch per step,
      // spread over the group's panels.
      const int64_t lines = steps * kRows, per_step = (lines + group * steps - 1) / (group * steps);
      for (int64_t b = b0; b < b1; ++b) {
        const uint16_t* a0 = xa.block(b) + st0 * kStep;
        const char* next = b + 1 < b1 ? reinterpret_cast<const char*>(xa.block(b + 1) + st0 * kStep) : nullptr;
        for (int64_t q = 0; q < group; ++q) {
          float* c = acc + (b - b0) * kRows * kGroupCols + q * kCols;
          if (ch == 0) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
          } else {
            _tile_loadd(0, c, ldc);
            _tile_loadd(1, c + 16, ldc);
            _tile_loadd(2, c + 16 * kGroupCols, ldc);
            _tile_loadd(3, c + 16 * kGroupCols + 16, ldc);
          }
          const uint16_t* a = a0;
          const uint16_t* bt = wb + q * steps * 2 * kTileElems;
          for (int64_t t = 0; t < steps; ++t, a += kStep, bt += 2 * kTileElems) {
            if (next) {
              const int64_t line = (q * steps + t) * per_step;
              for (int64_t l = line; l < std::min(lines, line + per_step); ++l)
                _mm_prefetch(next + (l % kRows) * lda + (l / kRows) * 64, _MM_HINT_T1);
            }
            _tile_loadd(4, a, lda);
            _tile_loadd(5, a + 16 * (lda / 2), lda);
            _tile_loadd(6, bt, 64);
            _tile_loadd(7, bt + kTileElems, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
          _tile_stored(0, c, ldc);
          _tile_stored(1, c + 16, ldc);
          _tile_stored(2, c + 16 * kGroupCols, ldc);
          _tile_stored(3, c + 16 * kGroupCols + 16, ldc);
        }
        if (ch + 1 == s.chunks) {
          store_rows(acc + (b - b0) * kRows * kGroupCols, bias, y, y_type, s, b, g0 * kCols,
                     std::min(s.N, g1 * kCols));
        }
      }
    }
  }
  _tile_release();
}

#endif  // KILN_AMX_KERNEL

}  // namespace

bool amx_bf16_usable() {
#if KILN_AMX_KERNEL
  static const bool usable = cpu_and_os_allow_amx();
  return usable;
#else
  return false;
#endif
}

void amx_linear_bf16(const void* x, const void* w, const void* bias, DType bias_type, void* y, DType y_type, int64_t M,
                     int64_t N, int64_t K) {
  KILN_CHECK(amx_bf16_usable(), kOp, "the AMX kernel runs only where the CPU and the OS allow AMX");
  KILN_CHECK(M > 0 && N > 0 && K > 0 && x && w && y, kOp, "amx_linear_bf16: bad call M=", M, " N=", N, " K=", K);
#if KILN_AMX_KERNEL
  const Shape s(M, N, K);
  std::vector<float> b32;
  if (bias) {
    b32.resize(size_t(N));
    convert_to_f32(bias, bias_type, b32.data(), N);
  }
  const XOperand xa(static_cast<const uint16_t*>(x), s);
  // Threads split the columns where there are enough panels (each then packs only its own part
  // of w), else the rows.
  const int threads = std::max(1, omp_get_max_threads());
  const bool split_cols = s.panels >= 2 * threads;
  const int64_t rows_per_thread = split_cols ? s.row_blocks : (s.row_blocks + threads - 1) / threads;
  const size_t wb_elems = size_t(kGroupPanels * s.chunk_steps * 2 * kTileElems);
  const size_t acc_elems = size_t(rows_per_thread * kRows * kGroupCols);
  const CallScratch per_thread(kOp, size_t(threads) * (wb_elems * 2 + acc_elems * 4));
  // One share per thread, each with its own buffers; the loop covers every share whatever number
  // of threads OpenMP gives.
#pragma omp parallel for schedule(static, 1)
  for (int share = 0; share < threads; ++share) {
    int64_t b0 = 0, b1 = s.row_blocks, p0 = 0, p1 = s.panels;
    if (split_cols) {
      p0 = s.panels * share / threads;
      p1 = s.panels * (share + 1) / threads;
    } else {
      b0 = std::min(s.row_blocks, share * rows_per_thread);
      b1 = std::min(s.row_blocks, b0 + rows_per_thread);
    }
    char* mine = per_thread.as<char>() + size_t(share) * (wb_elems * 2 + acc_elems * 4);
    if (b0 < b1 && p0 < p1) {
      run_share(xa, static_cast<const uint16_t*>(w), bias ? b32.data() : nullptr, y, y_type, s, b0,
                b1, p0, p1, reinterpret_cast<uint16_t*>(mine), reinterpret_cast<float*>(mine + wb_elems * 2));
    }
  }
#else
  (void)x, (void)w, (void)bias, (void)bias_type, (void)y, (void)y_type;
#endif
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
