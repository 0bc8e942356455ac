// Helpers shared by the reference implementations (simple loops, not fast).
#pragma once
#include <vector>

#include "core/error.h"
#include "graph/op.h"

namespace kiln::ref {

// Multi-index of flat position `flat` in `shape`.
inline std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    idx[i] = shape[i] ? flat % shape[i] : 0;
    flat = shape[i] ? flat / shape[i] : 0;
  }
  return idx;
}

// Value of `t` at the output multi-index `idx` under NumPy broadcasting.
inline double at_broadcast(const HostTensor& t, const std::vector<int64_t>& idx) {
  const size_t off = idx.size() - t.shape.size();
  int64_t flat = 0;
  for (size_t i = 0; i < t.shape.size(); ++i) flat = flat * t.shape[i] + (t.shape[i] == 1 ? 0 : idx[off + i]);
  return t.data[size_t(flat)];
}

// The NCHW form of a channels-last tensor ([N, H, W, C] in memory order), and back: the
// references of the channels_last ops run their NCHW loops between the two.
inline HostTensor nhwc_to_nchw(const HostTensor& t) {
  const int64_t n = t.shape[0], h = t.shape[1], w = t.shape[2], c = t.shape[3];
  HostTensor r{{n, c, h, w}, t.dtype, std::vector<double>(t.data.size())};
  for (int64_t i = 0; i < n; ++i)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        for (int64_t k = 0; k < c; ++k)
          r.data[size_t(((i * c + k) * h + y) * w + x)] = t.data[size_t(((i * h + y) * w + x) * c + k)];
  return r;
}
inline std::vector<double> nchw_to_nhwc(const std::vector<double>& v, const Shape& nchw) {
  const int64_t n = nchw[0], c = nchw[1], h = nchw[2], w = nchw[3];
  std::vector<double> r(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x)
          r[size_t(((i * h + y) * w + x) * c + k)] = v[size_t(((i * c + k) * h + y) * w + x)];
  return r;
}
// An [N, H, W, C] shape as [N, C, H, W].
inline Shape nchw_shape(const Shape& nhwc) { return {nhwc[0], nhwc[3], nhwc[1], nhwc[2]}; }

// Normalised, sorted, de-duplicated reduction axes (empty list = all axes).
std::vector<int64_t> reduction_axes(const std::vector<int64_t>& axes, int64_t rank, const char* where);

}  // namespace kiln::ref
