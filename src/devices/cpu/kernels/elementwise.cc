// Elementwise kernels: read strided, broadcast operands of any dtype into f32 tiles, apply
// the op's f32 formula (elementwise_math.h), and round into the output dtype.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "devices/cpu/kernels/elementwise_math.h"
#include "devices/cpu/kernels/kernel_table.h"
#include "devices/cpu/kernels/strided.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kTile = 2048;            // floats per operand per tile (fits L1 for 3 operands)
constexpr int64_t kParallelMin = 1 << 15;  // elements below which threads cost more than they save

struct Operand {
  const char* base;
  DType dtype;
};

// Loads `n` elements of an operand starting at element offset `off` with stride `stride`
// into f32; returns a pointer to them (the operand itself when it is dense f32).
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

// Runs `compute(const float* const* ins, float* out, int64_t n)` over the output in tiles.
template <typename Compute>
void run_tiles(const KernelArgs& args, Compute compute) {
  const TensorView& out = args.out;
  const size_t n_in = args.in.size();
  std::vector<Strides> strides;
  std::vector<Operand> ops;
  for (const TensorView& v : args.in) {
    strides.push_back(broadcast_strides(v.shape, v.strides, out.shape));
    ops.push_back({static_cast<const char*>(v.data), v.dtype});
  }
  strides.push_back(contiguous_strides(out.shape));
  const StridedLoop loop = make_strided_loop(out.shape, strides);
  const int64_t tiles_per_row = (loop.inner + kTile - 1) / kTile;
  const int64_t tasks = loop.outer_count() * tiles_per_row;
  const size_t out_es = dtype_size(out.dtype);
  char* out_base = static_cast<char*>(out.data);

#pragma omp parallel if (out.numel() >= kParallelMin)
  {
    std::vector<float> bufs((n_in + 1) * size_t(kTile));
    std::vector<const float*> ins(n_in);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t row = t / tiles_per_row, start = (t % tiles_per_row) * kTile;
      const int64_t n = std::min(kTile, loop.inner - start);
      for (size_t k = 0; k < n_in; ++k) {
        const int64_t off = loop.offset(k, row) + start * loop.inner_stride[k];
        ins[k] = load_tile(ops[k], off, loop.inner_stride[k], n, bufs.data() + k * size_t(kTile));
      }
      const int64_t out_off = loop.offset(n_in, row) + start;
      float* y = out.dtype == DType::f32 ? reinterpret_cast<float*>(out_base) + out_off
                                         : bufs.data() + n_in * size_t(kTile);
      compute(ins.data(), y, n);
      if (out.dtype != DType::f32) convert_from_f32(y, out_base + out_off * int64_t(out_es), out.dtype, n);
    }
  }
}

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
