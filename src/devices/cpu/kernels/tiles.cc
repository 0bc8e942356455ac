#include "devices/cpu/kernels/tiles.h"

namespace kiln::cpu {

const float* load_tile(const Operand& op, int64_t off, int64_t stride, int64_t n, float* buf) {
  const size_t es = dtype_size(op.dtype);
  if (op.dtype == DType::f32 && stride == 1) return reinterpret_cast<const float*>(op.base) + off;
  if (stride == 1) {
    convert_to_f32(op.base + off * int64_t(es), op.dtype, buf, n);
  } else if (stride == 0) {
    float v;
    convert_to_f32(op.base + off * int64_t(es), op.dtype, &v, 1);
    std::fill(buf, buf + n, v);
  } else {
    for (int64_t i = 0; i < n; ++i) convert_to_f32(op.base + (off + i * stride) * int64_t(es), op.dtype, buf + i, 1);
  }
  return buf;
}

TileGrid::TileGrid(const std::vector<TensorView>& in, const TensorView& out) {
  std::vector<Strides> strides;
  for (const TensorView& v : in) {
    strides.push_back(broadcast_strides(v.shape, v.strides, out.shape));
    ops_.push_back({static_cast<const char*>(v.data), v.dtype});
  }
  strides.push_back(contiguous_strides(out.shape));
  loop_ = make_strided_loop(out.shape, strides);
  tiles_per_row_ = (loop_.inner + kTile - 1) / kTile;
  tasks_ = loop_.outer_count() * tiles_per_row_;
  numel_ = out.numel();
  out_base_ = static_cast<char*>(out.data);
  out_dtype_ = out.dtype;
}

void TileGrid::store(const Tile& tile, const float* y) const {
  const int64_t off = out_offset(tile);
  convert_from_f32(y, out_base_ + off * int64_t(dtype_size(out_dtype_)), out_dtype_, tile.n);
}

}  // namespace kiln::cpu
