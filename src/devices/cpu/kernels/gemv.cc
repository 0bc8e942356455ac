#include "devices/cpu/kernels/gemv.h"

#include <algorithm>

#include <hwy/highway.h>

namespace kiln::cpu {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// dot(x, w_r) over k for R rows w_r = w + r*k at once (x is loaded once for all of them). Each
// row's sum has the same order whatever R is: two vector accumulators over 2-vector chunks,
// one more whole vector into the first, their sum reduced across lanes, then a scalar tail.
template <int R>
void dots(const float* x, const float* w, int64_t k, float* out) {
  const DF d;
  const int64_t L = int64_t(hn::Lanes(d));
  using V = decltype(hn::Zero(d));
  V a[R], b[R];
  for (int r = 0; r < R; ++r) a[r] = b[r] = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * L <= k; i += 2 * L) {
    const V x0 = hn::LoadU(d, x + i), x1 = hn::LoadU(d, x + i + L);
    for (int r = 0; r < R; ++r) {
      a[r] = hn::MulAdd(x0, hn::LoadU(d, w + r * k + i), a[r]);
      b[r] = hn::MulAdd(x1, hn::LoadU(d, w + r * k + i + L), b[r]);
    }
  }
  if (i + L <= k) {
    const V x0 = hn::LoadU(d, x + i);
    for (int r = 0; r < R; ++r) a[r] = hn::MulAdd(x0, hn::LoadU(d, w + r * k + i), a[r]);
    i += L;
  }
  for (int r = 0; r < R; ++r) {
    float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(a[r], b[r])));
    for (int64_t t = i; t < k; ++t) s += x[t] * w[r * k + t];
    out[r] = s;
  }
}

}  // namespace

void gemv_rows(const float* x, int64_t k, const std::vector<RowProduct>& products) {
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
    float s[4];
    for (int64_t j = j0; j < j1;) {
      const int rows = j + 4 <= j1 ? 4 : 1;
      if (rows == 4) {
        dots<4>(x, pr.w + j * k, k, s);
      } else {
        dots<1>(x, pr.w + j * k, k, s);
      }
      for (int r = 0; r < rows; ++r, ++j) pr.y[j] = pr.bias != nullptr ? s[r] + pr.bias[j] : s[r];
    }
  }
}

}  // namespace kiln::cpu
