// Data-movement kernels (concat, pad, gather, nearest upsample) and factories (arange, full).
// Inputs arrive dense; these move bytes, so every dtype is handled exactly.
#include <cstring>

#include "core/error.h"
#include "devices/cpu/kernels/kernel_table.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

namespace {

int64_t prod(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

void concat_kernel(const KernelArgs& args) {
  const TensorView& out = args.out;
  const size_t axis = size_t(normalize_axis(args.attrs->get_int("axis"), out.rank(), "concat"));
  const int64_t outer = prod(out.shape, 0, axis), inner = prod(out.shape, axis + 1, out.shape.size());
  const size_t es = dtype_size(out.dtype);
  const size_t out_row = size_t(out.shape[axis] * inner) * es;
  size_t col = 0;
  for (const TensorView& in : args.in) {
    const size_t row = size_t(in.shape[axis] * inner) * es;
    const char* s = static_cast<const char*>(in.data);
    char* d = static_cast<char*>(out.data) + col;
#pragma omp parallel for schedule(static) if (outer * int64_t(row) >= (1 << 18))
    for (int64_t o = 0; o < outer; ++o) std::memcpy(d + size_t(o) * out_row, s + size_t(o) * row, row);
    col += row;
  }
}

void pad_kernel(const KernelArgs& args) {
  const TensorView &in = args.in[0], &out = args.out;
  const auto& pads = args.attrs->get_ints("pads");
  const size_t es = dtype_size(out.dtype);
  // Fill with the pad value, then copy each input row (last dim) into place.
  std::vector<char> value(es);
  store_from_double(value.data(), out.dtype, 0, args.attrs->get_float("value", 0.0));
  char* o = static_cast<char*>(out.data);
  for (int64_t i = 0; i < out.numel(); ++i) std::memcpy(o + size_t(i) * es, value.data(), es);
  if (in.numel() == 0) return;
  const size_t r = in.shape.size();
  const int64_t row = in.shape[r - 1], rows = in.numel() / row;
  const Strides os = contiguous_strides(out.shape);
  const char* s = static_cast<const char*>(in.data);
  for (int64_t k = 0; k < rows; ++k) {
    int64_t rem = k, off = pads[2 * (r - 1)];
    for (size_t d = r - 1; d-- > 0;) {
      off += (rem % in.shape[d] + pads[2 * d]) * os[d];
      rem /= in.shape[d];
    }
    std::memcpy(o + size_t(off) * es, s + size_t(k * row) * es, size_t(row) * es);
  }
}

void gather_kernel(const KernelArgs& args) {
  const TensorView &table = args.in[0], &idx = args.in[1], &out = args.out;
  const int64_t vocab = table.shape[0];
  const size_t row = size_t(table.numel() / std::max<int64_t>(vocab, 1)) * dtype_size(table.dtype);
  for (int64_t i = 0; i < idx.numel(); ++i) {
    const int64_t k = idx.dtype == DType::i64 ? idx.as<const int64_t>()[i] : idx.as<const int32_t>()[i];
    KILN_CHECK(k >= 0 && k < vocab, "gather", "index ", k, " at position ", i, " is out of range [0, ", vocab, ")");
    std::memcpy(static_cast<char*>(out.data) + size_t(i) * row, static_cast<const char*>(table.data) + size_t(k) * row,
                row);
  }
}

void upsample_kernel(const KernelArgs& args) {
  const TensorView &in = args.in[0], &out = args.out;
  if (args.attrs->get_int("channels_last", 0)) {  // [N, H, W, C]: each pixel's C values are one run
    const int64_t n = in.shape[0], h = in.shape[1], w = in.shape[2];
    const size_t pixel = size_t(in.shape[3]) * dtype_size(in.dtype);
    const char* s = static_cast<const char*>(in.data);
    char* d = static_cast<char*>(out.data);
#pragma omp parallel for schedule(static) if (out.numel() >= (1 << 15))
    for (int64_t r = 0; r < n * 2 * h; ++r) {  // output rows
      const int64_t i = r / (2 * h), y = r % (2 * h);
      const char* srow = s + size_t((i * h + y / 2) * w) * pixel;
      char* drow = d + size_t(r * 2 * w) * pixel;
      for (int64_t x = 0; x < 2 * w; ++x) std::memcpy(drow + size_t(x) * pixel, srow + size_t(x / 2) * pixel, pixel);
    }
    return;
  }
  const int64_t planes = in.shape[0] * in.shape[1], h = in.shape[2], w = in.shape[3];
  const size_t es = dtype_size(in.dtype);
  const char* s = static_cast<const char*>(in.data);
  char* d = static_cast<char*>(out.data);
#pragma omp parallel for schedule(static) if (out.numel() >= (1 << 15))
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t y = 0; y < 2 * h; ++y) {
      const char* srow = s + size_t((p * h + y / 2) * w) * es;
      char* drow = d + size_t((p * 2 * h + y) * 2 * w) * es;
      for (int64_t x = 0; x < 2 * w; ++x) std::memcpy(drow + size_t(x) * es, srow + size_t(x / 2) * es, es);
    }
}

void arange_kernel(const KernelArgs& args) {
  const double start = args.attrs->get_float("start"), step = args.attrs->get_float("step");
  for (int64_t i = 0; i < args.out.numel(); ++i) store_from_double(args.out.data, args.out.dtype, i, start + double(i) * step);
}

void full_kernel(const KernelArgs& args) {
  const size_t es = dtype_size(args.out.dtype);
  std::vector<char> value(es);
  store_from_double(value.data(), args.out.dtype, 0, args.attrs->get_float("value"));
  char* o = static_cast<char*>(args.out.data);
  for (int64_t i = 0; i < args.out.numel(); ++i) std::memcpy(o + size_t(i) * es, value.data(), es);
}

}  // namespace

void add_movement_kernels(KernelTable& table) {
  table["concat"] = &concat_kernel;
  table["pad"] = &pad_kernel;
  table["gather"] = &gather_kernel;
  table["upsample_nearest2x"] = &upsample_kernel;
  table["arange"] = &arange_kernel;
  table["full"] = &full_kernel;
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
