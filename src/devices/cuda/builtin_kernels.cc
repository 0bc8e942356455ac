#include "devices/cuda/builtin_kernels.h"

#include <string>

namespace kiln::cuda {

namespace {

// Block-wide reductions over blockDim.x <= 1024 threads (warp shuffles, then one warp).
constexpr const char* kSource = R"(
__device__ float kiln_block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = threadIdx.x < (blockDim.x + 31) / 32 ? shared[threadIdx.x] : 0.0f;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if (threadIdx.x == 0) shared[0] = v;
  __syncthreads();
  return shared[0];
}
__device__ float kiln_block_max(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = threadIdx.x < (blockDim.x + 31) / 32 ? shared[threadIdx.x] : -__int_as_float(0x7f800000);
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  if (threadIdx.x == 0) shared[0] = v;
  __syncthreads();
  return shared[0];
}

// LayerNorm (rms = 0) or RMSNorm over rows of c elements; w, b may be null.
extern "C" __global__ void kiln_row_norm(const void* x, int xt, const void* w, int wt, const void* b, int bt, void* y,
                                         int yt, long long c, float eps, int rms) {
  __shared__ float shared[32];
  const long long row = blockIdx.x;
  float s = 0.0f;
  for (long long j = threadIdx.x; j < c; j += blockDim.x) s += kiln_ld(x, xt, row * c + j);
  const float mean = rms ? 0.0f : kiln_block_sum(s, shared) / (float)c;
  float ss = 0.0f;
  for (long long j = threadIdx.x; j < c; j += blockDim.x) {
    const float d = kiln_ld(x, xt, row * c + j) - mean;
    ss += d * d;
  }
  const float inv = 1.0f / sqrtf(kiln_block_sum(ss, shared) / (float)c + eps);
  for (long long j = threadIdx.x; j < c; j += blockDim.x) {
    float v = (kiln_ld(x, xt, row * c + j) - mean) * inv;
    if (w) v *= kiln_ld(w, wt, j);
    if (b) v += kiln_ld(b, bt, j);
    kiln_st(y, yt, row * c + j, v);
  }
}

// softmax along an axis of n elements: block o * inner + j covers (o, :, j).
extern "C" __global__ void kiln_softmax(const void* x, int xt, void* y, int yt, long long n, long long inner) {
  __shared__ float shared[32];
  const long long o = blockIdx.x / inner, j = blockIdx.x % inner;
  const long long base = o * n * inner + j;
  float m = -__int_as_float(0x7f800000);
  for (long long k = threadIdx.x; k < n; k += blockDim.x) m = fmaxf(m, kiln_ld(x, xt, base + k * inner));
  m = kiln_block_max(m, shared);
  float s = 0.0f;
  for (long long k = threadIdx.x; k < n; k += blockDim.x) s += expf(kiln_ld(x, xt, base + k * inner) - m);
  s = kiln_block_sum(s, shared);
  for (long long k = threadIdx.x; k < n; k += blockDim.x)
    kiln_st(y, yt, base + k * inner, expf(kiln_ld(x, xt, base + k * inner) - m) / s);
}

// sum (0), mean (1), max (2), var (3) of a dense input: block i is output element i, at kept
// coordinates from `kshape` (input strides `kstride`); it visits the reduced coordinates.
extern "C" __global__ void kiln_reduce(const void* x, int xt, void* y, int yt, KilnDims kshape, KilnDims kstride,
                                       int krank, KilnDims rshape, KilnDims rstride, int rrank, long long nred, int kind,
                                       long long correction) {
  __shared__ float shared[32];
  long long rem = blockIdx.x, base = 0;
  for (int d = krank - 1; d >= 0; --d) {
    base += (rem % kshape.d[d]) * kstride.d[d];
    rem /= kshape.d[d];
  }
  float s = 0.0f, m = -__int_as_float(0x7f800000);
  for (long long r = threadIdx.x; r < nred; r += blockDim.x) {
    long long rr = r, off = base;
    for (int d = rrank - 1; d >= 0; --d) {
      off += (rr % rshape.d[d]) * rstride.d[d];
      rr /= rshape.d[d];
    }
    const float v = kiln_ld(x, xt, off);
    s += v;
    m = fmaxf(m, v);
  }
  if (kind == 2) {
    m = kiln_block_max(m, shared);
    if (threadIdx.x == 0) kiln_st(y, yt, blockIdx.x, m);
    return;
  }
  s = kiln_block_sum(s, shared);
  const float mean = s / (float)nred;
  if (kind != 3) {
    if (threadIdx.x == 0) kiln_st(y, yt, blockIdx.x, kind == 0 ? s : mean);
    return;
  }
  float ss = 0.0f;
  for (long long r = threadIdx.x; r < nred; r += blockDim.x) {
    long long rr = r, off = base;
    for (int d = rrank - 1; d >= 0; --d) {
      off += (rr % rshape.d[d]) * rstride.d[d];
      rr /= rshape.d[d];
    }
    const float dv = kiln_ld(x, xt, off) - mean;
    ss += dv * dv;
  }
  ss = kiln_block_sum(ss, shared);
  if (threadIdx.x == 0) kiln_st(y, yt, blockIdx.x, ss / (float)(nred - correction));
}

// GroupNorm: block (n, g) normalises channels [g C/G, (g+1) C/G) over hw positions; NCHW or NHWC.
extern "C" __global__ void kiln_group_norm(const void* x, int xt, const void* w, int wt, const void* b, int bt,
                                           void* y, int yt, long long C, long long hw, long long G, float eps,
                                           int silu, int channels_last) {
  __shared__ float shared[32];
  const long long n = blockIdx.x / G, g = blockIdx.x % G, cpg = C / G, per = cpg * hw;
#define KILN_AT(j) (channels_last ? (n * hw + (j) % hw) * C + g * cpg + (j) / hw : (n * C + g * cpg) * hw + (j))
  float s = 0.0f;
  for (long long j = threadIdx.x; j < per; j += blockDim.x) s += kiln_ld(x, xt, KILN_AT(j));
  const float mean = kiln_block_sum(s, shared) / (float)per;
  float ss = 0.0f;
  for (long long j = threadIdx.x; j < per; j += blockDim.x) {
    const float d = kiln_ld(x, xt, KILN_AT(j)) - mean;
    ss += d * d;
  }
  const float inv = 1.0f / sqrtf(kiln_block_sum(ss, shared) / (float)per + eps);
  for (long long j = threadIdx.x; j < per; j += blockDim.x) {
    const long long ch = g * cpg + j / hw;
    float v = (kiln_ld(x, xt, KILN_AT(j)) - mean) * inv;
    if (w) v *= kiln_ld(w, wt, ch);
    if (b) v += kiln_ld(b, bt, ch);
    if (silu) v = v * kiln_sigmoid(v);
    kiln_st(y, yt, KILN_AT(j), v);
  }
#undef KILN_AT
}

// Element bytes moved as they are (es = 1, 2, 4 or 8).
__device__ __forceinline__ void kiln_move(void* y, long long i, const void* x, long long j, int es) {
  switch (es) {
    case 1: ((unsigned char*)y)[i] = ((const unsigned char*)x)[j]; break;
    case 2: ((unsigned short*)y)[i] = ((const unsigned short*)x)[j]; break;
    case 4: ((unsigned int*)y)[i] = ((const unsigned int*)x)[j]; break;
    default: ((unsigned long long*)y)[i] = ((const unsigned long long*)x)[j]; break;
  }
}
#define KILN_GRID_LOOP(i, n) \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

// One dense input of concat, [outer, a, inner], into the output's [outer, a_out, inner] at offset `at`.
extern "C" __global__ void kiln_concat_part(const void* x, void* y, int es, long long n, long long a, long long inner,
                                            long long a_out, long long at) {
  KILN_GRID_LOOP(i, n) {
    const long long o = i / (a * inner), r = i % (a * inner);
    kiln_move(y, (o * a_out + at) * inner + r, x, i, es);
  }
}

// pad: output element i takes the input element at its coordinates less the leading pads, or
// `value` (its bytes in the dtype) outside.
extern "C" __global__ void kiln_pad(const void* x, void* y, int es, long long n, KilnDims oshape, KilnDims xshape,
                                    KilnDims before, int rank, unsigned long long value) {
  KILN_GRID_LOOP(i, n) {
    long long rem = i, src = 0, scale = 1;
    bool inside = true;
    for (int d = rank - 1; d >= 0; --d) {
      const long long c = rem % oshape.d[d] - before.d[d];
      rem /= oshape.d[d];
      inside = inside && c >= 0 && c < xshape.d[d];
      src += c * scale;
      scale *= xshape.d[d];
    }
    if (inside) kiln_move(y, i, x, src, es);
    else kiln_move(y, i, &value, 0, es);
  }
}

// gather: rows of `row` elements of the table, by i32 (it = 3) or i64 indices. An index out of
// range reads the nearest row (a kernel cannot raise; the CPU's gather refuses it): kiln's
// indices are token ids, which the tokenizers keep within the vocabulary.
extern "C" __global__ void kiln_gather(const void* table, const void* idx, int it, void* y, int es, long long n,
                                       long long row, long long rows) {
  KILN_GRID_LOOP(i, n) {
    const long long r = i / row;
    long long k = it == 3 ? (long long)((const int*)idx)[r] : ((const long long*)idx)[r];
    k = k < 0 ? 0 : (k >= rows ? rows - 1 : k);
    kiln_move(y, i, table, k * row + i % row, es);
  }
}

// Nearest 2x upsampling of [N, C, H, W] (or [N, H, W, C]).
extern "C" __global__ void kiln_upsample2x(const void* x, void* y, int es, long long n, long long C, long long H,
                                           long long W, int channels_last) {
  KILN_GRID_LOOP(i, n) {
    long long src;
    if (channels_last) {
      const long long c = i % C, ox = i / C % (2 * W), oy = i / C / (2 * W) % (2 * H), b = i / C / (2 * W) / (2 * H);
      src = ((b * H + oy / 2) * W + ox / 2) * C + c;
    } else {
      const long long ox = i % (2 * W), oy = i / (2 * W) % (2 * H), bc = i / (2 * W) / (2 * H);
      src = (bc * H + oy / 2) * W + ox / 2;
    }
    kiln_move(y, i, x, src, es);
  }
}

// arange: start + i * step, computed in double; full: one value. Integers are stored exactly.
extern "C" __global__ void kiln_arange(void* y, int yt, long long n, double start, double step) {
  KILN_GRID_LOOP(i, n) {
    const double v = start + (double)i * step;
    if (yt == 4) ((long long*)y)[i] = (long long)v;
    else if (yt == 3) ((int*)y)[i] = (int)v;
    else kiln_st(y, yt, i, (float)v);
  }
}
extern "C" __global__ void kiln_fill(void* y, int es, long long n, unsigned long long value) {
  KILN_GRID_LOOP(i, n) kiln_move(y, i, &value, 0, es);
}

// Scaled dot-product attention, one block per query row (b, h, i): scores for every key in
// shared memory (dynamic: lk floats), their softmax, then each output feature as a sum over the
// keys. q/k/v and the output are at their strides ([B, H, L, D] order); the mask through
// broadcast strides.
extern "C" __global__ void kiln_sdpa(const void* q, const void* k, const void* v, const void* mask, int t, int mt,
                                     void* y, int yt, long long H, long long hkv, long long lq, long long lk,
                                     long long dq, long long dv, KilnDims qs, KilnDims ks, KilnDims vs, KilnDims ms,
                                     KilnDims os, float scale) {
  extern __shared__ float scores[];
  __shared__ float shared[32];
  const long long i = blockIdx.x % lq, h = blockIdx.x / lq % H, b = blockIdx.x / lq / H, hk = h / (H / hkv);
  const long long qrow = b * qs.d[0] + h * qs.d[1] + i * qs.d[2];
  float m = -__int_as_float(0x7f800000);
  for (long long j = threadIdx.x; j < lk; j += blockDim.x) {
    const long long krow = b * ks.d[0] + hk * ks.d[1] + j * ks.d[2];
    float dot = 0.0f;
    for (long long d = 0; d < dq; ++d) dot += kiln_ld(q, t, qrow + d * qs.d[3]) * kiln_ld(k, t, krow + d * ks.d[3]);
    float s = dot * scale;
    if (mask) s += kiln_ld(mask, mt, b * ms.d[0] + h * ms.d[1] + i * ms.d[2] + j * ms.d[3]);
    scores[j] = s;
    m = fmaxf(m, s);
  }
  m = kiln_block_max(m, shared);
  // A row every key of which is masked out (or with no keys) is zeros, as on the CPU: no shift.
  if (m == -__int_as_float(0x7f800000)) m = 0.0f;
  float sum = 0.0f;
  for (long long j = threadIdx.x; j < lk; j += blockDim.x) sum += (scores[j] = expf(scores[j] - m));
  sum = kiln_block_sum(sum, shared);
  // The output is written through its strides: deferred and compiled mode hand sdpa a transposed
  // view of the buffer the heads are merged in ([B, L, H, Dv] seen as [B, H, L, Dv]).
  const long long orow = b * os.d[0] + h * os.d[1] + i * os.d[2];
  for (long long d = threadIdx.x; d < dv; d += blockDim.x) {
    float acc = 0.0f;
    for (long long j = 0; j < lk; ++j) acc += scores[j] * kiln_ld(v, t, b * vs.d[0] + hk * vs.d[1] + j * vs.d[2] + d * vs.d[3]);
    kiln_st(y, yt, orow + d * os.d[3], sum > 0.0f ? acc / sum : 0.0f);
  }
}

// conv2d, one output element per thread (NCHW, or NHWC with channels_last); weight [O, C, KH, KW];
// res (or null): added to the result, in y's dtype and element order.
extern "C" __global__ void kiln_conv2d(const void* x, const void* w, const void* bias, const void* res, int t,
                                       void* y, int yt,
                                       long long n, long long C, long long H, long long W, long long O, long long KH,
                                       long long KW, long long OH, long long OW, long long sh, long long sw,
                                       long long ph, long long pw, int channels_last) {
  KILN_GRID_LOOP(i, n) {
    long long o, oy, ox, b;
    if (channels_last) {
      o = i % O; ox = i / O % OW; oy = i / O / OW % OH; b = i / O / OW / OH;
    } else {
      ox = i % OW; oy = i / OW % OH; o = i / OW / OH % O; b = i / OW / OH / O;
    }
    float acc = bias ? kiln_ld(bias, t, o) : 0.0f;
    for (long long c = 0; c < C; ++c)
      for (long long kh = 0; kh < KH; ++kh) {
        const long long iy = oy * sh - ph + kh;
        if (iy < 0 || iy >= H) continue;
        for (long long kw = 0; kw < KW; ++kw) {
          const long long ix = ox * sw - pw + kw;
          if (ix < 0 || ix >= W) continue;
          const long long xi = channels_last ? ((b * H + iy) * W + ix) * C + c : ((b * C + c) * H + iy) * W + ix;
          acc += kiln_ld(x, t, xi) * kiln_ld(w, t, ((o * C + c) * KH + kh) * KW + kw);
        }
      }
    if (res) acc += kiln_ld(res, yt, i);
    kiln_st(y, yt, i, acc);
  }
}
)";

constexpr const char* kEntries[] = {"kiln_row_norm",   "kiln_softmax",    "kiln_reduce",      "kiln_group_norm",
                                    "kiln_concat_part", "kiln_pad",       "kiln_gather",      "kiln_upsample2x",
                                    "kiln_arange",     "kiln_fill",       "kiln_sdpa",        "kiln_conv2d",
                                    nullptr};

}  // namespace

const KernelSource& builtin_kernels() {
  static const KernelSource k = [] {
    const std::string source = std::string(kKernelPrelude) + kSource;
    return KernelSource{"kiln_builtins_" + text_hash(source), source};
  }();
  return k;
}

const char* const* builtin_kernel_entries() { return kEntries; }

}  // namespace kiln::cuda
