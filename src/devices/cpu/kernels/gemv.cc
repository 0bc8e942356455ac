#include "devices/cpu/kernels/gemv.h"

#include <algorithm>

#include <hwy/highway.h>

#include "core/error.h"
#include "devices/cpu/kernels/dequantize.h"
#include "devices/cpu/kernels/f32_io.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using bf16 = hwy::bfloat16_t;

// A vector of f32 lanes from p: loaded as it is, or bf16 lanes widened (exact).
HWY_INLINE auto load(DF d, const float* p) { return hn::LoadU(d, p); }
HWY_INLINE auto load(DF d, const bf16* p) { return hn::PromoteTo(d, hn::LoadU(hn::Rebind<bf16, DF>(), p)); }
inline float widen(float v) { return v; }
inline float widen(bf16 v) { return bf16_to_f32(v.bits); }

// dot(x, w_r) over k for R rows w_r = w + r*k at once (x is loaded once for all of them). Each
// row's sum has the same order whatever R and the weight's dtype are: two vector accumulators
// over 2-vector chunks, one more whole vector into the first, their sum reduced across lanes,
// then a scalar tail.
template <int R, class W>
void dots(const float* x, const W* w, int64_t k, float* out) {
  const DF d;
  const int64_t L = int64_t(hn::Lanes(d));
  using V = decltype(hn::Zero(d));
  V a[R], b[R];
  for (int r = 0; r < R; ++r) a[r] = b[r] = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * L <= k; i += 2 * L) {
    const V x0 = hn::LoadU(d, x + i), x1 = hn::LoadU(d, x + i + L);
    for (int r = 0; r < R; ++r) {
      a[r] = hn::MulAdd(x0, load(d, w + r * k + i), a[r]);
      b[r] = hn::MulAdd(x1, load(d, w + r * k + i + L), b[r]);
    }
  }
  if (i + L <= k) {
    const V x0 = hn::LoadU(d, x + i);
    for (int r = 0; r < R; ++r) a[r] = hn::MulAdd(x0, load(d, w + r * k + i), a[r]);
    i += L;
  }
  for (int r = 0; r < R; ++r) {
    float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(a[r], b[r])));
    for (int64_t t = i; t < k; ++t) s += x[t] * widen(w[r * k + t]);
    out[r] = s;
  }
}

float load_at(const void* p, DType t, int64_t j) {
  return t == DType::bf16 ? bf16_to_f32(static_cast<const uint16_t*>(p)[j]) : static_cast<const float*>(p)[j];
}

void store_at(void* p, DType t, int64_t j, float v) {
  if (t == DType::bf16) {
    static_cast<uint16_t*>(p)[j] = f32_to_bf16(v);
  } else {
    static_cast<float*>(p)[j] = v;
  }
}

// Columns j0..j1 of one product.
template <class W>
void columns(const float* x, int64_t k, const RowProduct& pr, int64_t j0, int64_t j1) {
  const W* w = static_cast<const W*>(pr.w);
  float s[4];
  for (int64_t j = j0; j < j1;) {
    const int rows = j + 4 <= j1 ? 4 : 1;
    if (rows == 4) {
      dots<4>(x, w + j * k, k, s);
    } else {
      dots<1>(x, w + j * k, k, s);
    }
    for (int r = 0; r < rows; ++r, ++j)
      store_at(pr.y, pr.y_type, j, pr.bias != nullptr ? s[r] + load_at(pr.bias, pr.bias_type, j) : s[r]);
  }
}

// Columns j0..j1 of a product whose weight is quantized: four rows at a time dequantized to f32
// (exact), then the f32 kernel's dot products, so each column sums in the same order as the
// f32 kernel on the dequantized weight.
void columns_quantized(const float* x, int64_t k, const RowProduct& pr, int64_t j0, int64_t j1) {
  thread_local std::vector<float> rows;
  rows.resize(size_t(4 * k));
  const size_t row_bytes = storage_bytes(pr.w_type, k);
  const char* w = static_cast<const char*>(pr.w);
  float s[4];
  for (int64_t j = j0; j < j1;) {
    const int n = j + 4 <= j1 ? 4 : 1;
    for (int r = 0; r < n; ++r) dequantize_row_f32(pr.w_type, w + size_t(j + r) * row_bytes, rows.data() + r * k, k);
    if (n == 4) {
      dots<4>(x, rows.data(), k, s);
    } else {
      dots<1>(x, rows.data(), k, s);
    }
    for (int r = 0; r < n; ++r, ++j)
      store_at(pr.y, pr.y_type, j, pr.bias != nullptr ? s[r] + load_at(pr.bias, pr.bias_type, j) : s[r]);
  }
}

}  // namespace

void gemv_rows(const void* x, DType x_type, int64_t k, const std::vector<RowProduct>& products) {
  KILN_CHECK(f32_or_bf16(x_type), "linear", "gemv_rows: x of dtype ", dtype_name(x_type));
  for (const RowProduct& p : products)
    KILN_CHECK((f32_or_bf16(p.w_type) || is_storage_only(p.w_type)) && f32_or_bf16(p.y_type) && (p.bias == nullptr || f32_or_bf16(p.bias_type)),
               "linear", "gemv_rows: a product of dtypes w ", dtype_name(p.w_type), ", bias ", dtype_name(p.bias_type),
               ", y ", dtype_name(p.y_type));
  // A bf16 x is widened once (one row, exact): every column then reads the same f32 values.
  std::vector<float> x_wide;
  if (x_type == DType::bf16) {
    x_wide.resize(size_t(k));
    convert_to_f32(x, DType::bf16, x_wide.data(), k);
  }
  const float* xf = x_type == DType::bf16 ? x_wide.data() : static_cast<const float*>(x);
  // Columns of all products, in blocks small enough to balance but large enough to stream.
  constexpr int64_t kBlock = 64;
  std::vector<std::pair<size_t, int64_t>> blocks;  // (product, first column)
  int64_t total = 0;
  for (size_t p = 0; p < products.size(); ++p) {
    for (int64_t j = 0; j < products[p].n; j += kBlock) blocks.emplace_back(p, j);
    total += products[p].n;
  }
  const auto nb = int64_t(blocks.size());
#pragma omp parallel for schedule(static) if (total * k >= (int64_t(1) << 15))
  for (int64_t b = 0; b < nb; ++b) {
    const RowProduct& pr = products[blocks[size_t(b)].first];
    const int64_t j0 = blocks[size_t(b)].second, j1 = std::min(pr.n, j0 + kBlock);
    if (pr.w_type == DType::bf16) {
      columns<bf16>(xf, k, pr, j0, j1);
    } else if (is_storage_only(pr.w_type)) {
      columns_quantized(xf, k, pr, j0, j1);
    } else {
      columns<float>(xf, k, pr, j0, j1);
    }
  }
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
