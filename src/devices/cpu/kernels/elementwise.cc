// Elementwise kernels: read strided, broadcast operands of any dtype into f32 tiles, apply
// the op's f32 formula (elementwise_math.h), and round into the output dtype (tiles.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "devices/cpu/kernels/elementwise_math.h"
#include "devices/cpu/kernels/kernel_table.h"
#include "devices/cpu/kernels/strided.h"
#include "devices/cpu/kernels/tiles.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

namespace {

void unary_kernel(const KernelArgs& args, UnaryOp op) {
  const float lo = float(args.attrs->get_float("min", -std::numeric_limits<double>::infinity()));
  const float hi = float(args.attrs->get_float("max", std::numeric_limits<double>::infinity()));
  run_tiles(args, [&](const float* const* in, float* y, int64_t n) { unary_f32(op, in[0], y, n, lo, hi); });
}

void binary_kernel(const KernelArgs& args, BinaryOp op) {
  run_tiles(args, [&](const float* const* in, float* y, int64_t n) { binary_f32(op, in[0], in[1], y, n); });
}

template <UnaryOp Op>
void unary_entry(const KernelArgs& args) { unary_kernel(args, Op); }
template <BinaryOp Op>
void binary_entry(const KernelArgs& args) { binary_kernel(args, Op); }

void where_kernel(const KernelArgs& args) {
  run_tiles(args, [](const float* const* in, float* y, int64_t n) { where_f32(in[0], in[1], in[2], y, n); });
}

// n elements of type T (the dtype's bits) from every `stride`-th element of src into dst: a plain
// load and store each, where a memcpy of a run-time size would be a call per element.
template <class T>
void copy_strided(const char* src, char* dst, int64_t n, int64_t stride) {
  T* d = reinterpret_cast<T*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * stride * int64_t(sizeof(T)), sizeof(T));
    d[i] = v;
  }
}

// A transposing copy: the last outer dim (count rows, dst stride = the inner run) is contiguous in
// src while the inner run is strided. Copied in blocks of kRowsPerBlock rows by kRunPerBlock
// elements, reading each source run of the block's rows at once, so every source cache line is
// used while it is in cache (row by row, each line would be fetched once per row it serves).
template <class T>
void copy_transposing(const char* s, char* d, const StridedLoop& loop, int64_t stride) {
  constexpr int64_t kRowsPerBlock = 16, kRunPerBlock = 64;
  const size_t last = loop.outer.size() - 1;
  const int64_t rows = loop.outer[last], inner = loop.inner;
  const int64_t planes = loop.outer_count() / rows, row_blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
#pragma omp parallel for schedule(static) if (planes * rows * inner >= kParallelMin)
  for (int64_t t = 0; t < planes * row_blocks; ++t) {
    const int64_t plane = t / row_blocks, r0 = (t % row_blocks) * kRowsPerBlock;
    const int64_t r1 = std::min(rows, r0 + kRowsPerBlock);
    const T* src = reinterpret_cast<const T*>(s) + loop.offset(0, plane * rows + r0);
    T* dst = reinterpret_cast<T*>(d) + loop.offset(1, plane * rows + r0);
    for (int64_t i0 = 0; i0 < inner; i0 += kRunPerBlock)
      for (int64_t i = i0; i < std::min(inner, i0 + kRunPerBlock); ++i)
        for (int64_t r = 0; r < r1 - r0; ++r) dst[r * inner + i] = src[i * stride + r];
  }
}

// Calls f(T()) with T the unsigned integer of `bytes` bytes (2, 4 or 8); false for other sizes.
template <class F>
bool with_bits_type(size_t bytes, F&& f) {
  switch (bytes) {
    case 2: f(uint16_t()); return true;
    case 4: f(uint32_t()); return true;
    case 8: f(uint64_t()); return true;
    default: return false;
  }
}

// Whether copy_transposing applies: a strided inner run, and a last outer dim along which src is
// contiguous (dst, dense, always is: its stride there is the inner run).
bool transposes(const StridedLoop& loop, int64_t stride) {
  return stride != 1 && !loop.outer.empty() && loop.outer_strides[0].back() == 1 && loop.outer.back() > 1;
}

// Copies a strided tensor into a dense one of the same dtype, bit for bit.
void copy_kernel(const KernelArgs& args) {
  const TensorView &src = args.in[0], &dst = args.out;
  const size_t es = dtype_size(src.dtype);
  const StridedLoop loop = make_strided_loop(src.shape, {src.strides, contiguous_strides(dst.shape)});
  const char* s = static_cast<const char*>(src.data);
  char* d = static_cast<char*>(dst.data);
  const int64_t rows = loop.outer_count(), stride = loop.inner_stride[0];
  if (transposes(loop, stride) &&
      with_bits_type(es, [&](auto t) { copy_transposing<decltype(t)>(s, d, loop, stride); })) {
    return;
  }
#pragma omp parallel for schedule(static) if (dst.numel() >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const char* sp = s + loop.offset(0, r) * int64_t(es);
    char* dp = d + loop.offset(1, r) * int64_t(es);
    if (stride == 1) {
      std::memcpy(dp, sp, size_t(loop.inner) * es);
    } else if (!with_bits_type(es, [&](auto t) { copy_strided<decltype(t)>(sp, dp, loop.inner, stride); })) {
      for (int64_t i = 0; i < loop.inner; ++i) std::memcpy(dp + i * int64_t(es), sp + i * stride * int64_t(es), es);
    }
  }
}

// Casts. Between float types (and int <-> float) the f32 tile path is exact; between integer
// types it goes through int64 so large values survive.
void cast_kernel(const KernelArgs& args) {
  const TensorView &src = args.in[0], &dst = args.out;
  if (is_floating(src.dtype) || is_floating(dst.dtype)) {
    if (!is_floating(dst.dtype) && dst.dtype != DType::boolean) {
      run_tiles(args, [](const float* const* in, float* y, int64_t n) {
        for (int64_t i = 0; i < n; ++i) y[i] = std::trunc(in[0][i]);
      });
    } else {
      run_tiles(args, [](const float* const* in, float* y, int64_t n) { std::memcpy(y, in[0], size_t(n) * 4); });
    }
    return;
  }
  const StridedLoop loop = make_strided_loop(src.shape, {src.strides, contiguous_strides(dst.shape)});
  for (int64_t r = 0; r < loop.outer_count(); ++r) {
    const int64_t so = loop.offset(0, r), dof = loop.offset(1, r);
    for (int64_t i = 0; i < loop.inner; ++i) {
      const int64_t si = so + i * loop.inner_stride[0];
      int64_t v = src.dtype == DType::i64 ? src.as<const int64_t>()[si]
                  : src.dtype == DType::i32 ? src.as<const int32_t>()[si]
                                            : int64_t(src.as<const uint8_t>()[si] != 0);
      if (dst.dtype == DType::i64) dst.as<int64_t>()[dof + i] = v;
      else if (dst.dtype == DType::i32) dst.as<int32_t>()[dof + i] = int32_t(v);
      else dst.as<uint8_t>()[dof + i] = v != 0;
    }
  }
}

template <int... Is>
void add_unary(KernelTable& t, std::integer_sequence<int, Is...>) {
  ((t[unary_name(UnaryOp(Is))] = &unary_entry<UnaryOp(Is)>), ...);
}
template <int... Is>
void add_binary(KernelTable& t, std::integer_sequence<int, Is...>) {
  ((t[binary_name(BinaryOp(Is))] = &binary_entry<BinaryOp(Is)>), ...);
}

}  // namespace

void add_elementwise_kernels(KernelTable& table) {
  add_unary(table, std::make_integer_sequence<int, int(UnaryOp::clamp) + 1>{});
  add_binary(table, std::make_integer_sequence<int, int(BinaryOp::ge) + 1>{});
  table["where"] = &where_kernel;
  table["cast"] = &cast_kernel;
  table["copy"] = &copy_kernel;
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
