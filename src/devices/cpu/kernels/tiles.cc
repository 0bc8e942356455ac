#include "devices/cpu/kernels/tiles.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

const float* load_tile(const Operand& op, int64_t off, int64_t stride, int64_t n, float* buf) {
  if (op.iota) {
    for (int64_t i = 0; i < n; ++i) buf[i] = float(op.start + double(off + i * stride) * op.step);
    return buf;
  }
  const size_t es = dtype_size(op.dtype);
  if (op.dtype == DType::f32 && stride == 1) return reinterpret_cast<const float*>(op.base) + off;
  if (stride == 1) {
    convert_to_f32(op.base + off * int64_t(es), op.dtype, buf, n);
  } else if (stride == 0) {
    float v;
    convert_to_f32(op.base + off * int64_t(es), op.dtype, &v, 1);
    std::fill(buf, buf + n, v);
  } else if (op.dtype == DType::f32) {
    const float* src = reinterpret_cast<const float*>(op.base) + off;
    for (int64_t i = 0; i < n; ++i) buf[i] = src[i * stride];
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
  for (size_t k = 0; k <= in.size(); ++k) {
    bool flat = loop_.inner_stride[k] == 1 || loop_.inner <= 1;
    int64_t expect = loop_.inner;
    for (size_t d = loop_.outer.size(); flat && d-- > 0;) {
      flat = loop_.outer[d] == 1 || loop_.outer_strides[k][d] == expect;
      expect *= loop_.outer[d];
    }
    flat_.push_back(flat);
  }
  // Short rows (under a quarter tile) are grouped into multi-row tiles, so a kernel does not
  // pay its per-tile overhead for every few elements.
  if (loop_.inner > 0 && loop_.inner * 4 <= kTile && loop_.outer_count() > 1) {
    rows_per_tile_ = kTile / loop_.inner;
    tiles_per_row_ = 1;
    tasks_ = (loop_.outer_count() + rows_per_tile_ - 1) / rows_per_tile_;
    own_.resize(in.size());
    for (size_t k = 0; k < in.size(); ++k)
      if (!flat_[k]) own_[k] = make_strided_loop(out.shape, {strides[k]});
  } else {
    tiles_per_row_ = (loop_.inner + kTile - 1) / kTile;
    tasks_ = loop_.outer_count() * tiles_per_row_;
  }
  numel_ = out.numel();
  out_base_ = static_cast<char*>(out.data);
  out_dtype_ = out.dtype;
}

const float* TileGrid::load_rows(size_t k, const Tile& tile, float* buf) const {
  // The tile is the flat output range [first, first + n); walk it in operand k's own runs.
  const StridedLoop& own = own_[k];
  const int64_t run = own.inner, first = tile.row * loop_.inner, is = own.inner_stride[0];
  const Shape& outer = own.outer;
  const Strides& st = own.outer_strides[0];
  int64_t row = first / run, j = first % run;
  // The run's outer index as an odometer, instead of re-deriving each run's offset.
  std::vector<int64_t> idx(outer.size());
  for (int64_t pos = row, d = int64_t(outer.size()) - 1; d >= 0; --d) {
    idx[size_t(d)] = pos % outer[size_t(d)];
    pos /= outer[size_t(d)];
  }
  int64_t off = own.offset(0, row);
  const bool f32 = ops_[k].dtype == DType::f32 && !ops_[k].iota;
  const float* base = reinterpret_cast<const float*>(ops_[k].base);
  for (int64_t done = 0; done < tile.n;) {
    const int64_t m = std::min(run - j, tile.n - done);
    float* dst = buf + done;
    if (f32 && m <= 16) {  // short runs: gather inline rather than call per run
      for (int64_t i = 0; i < m; ++i) dst[i] = base[off + (j + i) * is];
    } else {
      const float* got = load_tile(ops_[k], off + j * is, is, m, dst);
      if (got != dst) std::copy(got, got + m, dst);
    }
    done += m;
    j = 0;
    for (size_t d = outer.size(); d-- > 0;) {
      off += st[d];
      if (++idx[d] < outer[d]) break;
      off -= st[d] * outer[d];
      idx[d] = 0;
    }
  }
  return buf;
}

void TileGrid::store(const Tile& tile, const float* y) const {
  const int64_t off = out_offset(tile);
  convert_from_f32(y, out_base_ + off * int64_t(dtype_size(out_dtype_)), out_dtype_, tile.n);
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
