// Elementwise kernels: read strided, broadcast operands of any dtype into f32 tiles, apply
// the op's f32 formula (elementwise_math.h), and round into the output dtype (tiles.h).
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "devices/cpu/kernels/elementwise_math.h"
#include "devices/cpu/kernels/kernel_table.h"
#include "devices/cpu/kernels/strided.h"
#include "devices/cpu/kernels/tiles.h"

namespace kiln::cpu {

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

// Copies a strided tensor into a dense one of the same dtype, bit for bit.
void copy_kernel(const KernelArgs& args) {
  const TensorView &src = args.in[0], &dst = args.out;
  const size_t es = dtype_size(src.dtype);
  const StridedLoop loop = make_strided_loop(src.shape, {src.strides, contiguous_strides(dst.shape)});
  const char* s = static_cast<const char*>(src.data);
  char* d = static_cast<char*>(dst.data);
  const int64_t rows = loop.outer_count(), stride = loop.inner_stride[0];
#pragma omp parallel for schedule(static) if (dst.numel() >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const char* sp = s + loop.offset(0, r) * int64_t(es);
    char* dp = d + loop.offset(1, r) * int64_t(es);
    if (stride == 1) {
      std::memcpy(dp, sp, size_t(loop.inner) * es);
    } else {
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

}  // namespace kiln::cpu
