#include "nn/weight_quantization.h"

#include <atomic>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/quant_blocks.h"
#include "exec/host.h"

namespace kiln::nn {

float quantization_scale(DType type, float amax) {
  const float largest = type == DType::f8_e4m3 ? 448.0f : type == DType::f8_e5m2 ? 57344.0f : 0.0f;
  return largest > 0 && amax > 0 && std::isfinite(amax) ? amax / largest : 1.0f;
}

float max_abs(const Tensor& w) {
  float m = 0;
  for (float v : to_vector(w)) m = std::max(m, std::fabs(v));
  return m;
}

Tensor quantize_weight(const Tensor& w, DType type, float scale, const std::string& what) {
  KILN_CHECK(is_storage_only(type), "quantize", dtype_name(type), " is not a quantized storage type");
  KILN_CHECK(w.rank() == 2 && is_floating(w.dtype()) && w.is_contiguous(), "quantize",
             "quantizes a dense float [N,K] weight, got ", w.describe());
  const int64_t N = w.dim(0), K = w.dim(1);
  KILN_CHECK(K % dtype_block_elems(type) == 0, "quantize", dtype_name(type), " needs in_features (", K,
             ") to be a whole number of its ", dtype_block_elems(type), "-element blocks");
  wait(w);
  BufferPtr buf = host_allocate(storage_bytes(type, N * K));
  const char* src = static_cast<const char*>(w.data_ptr());
  char* dst = static_cast<char*>(buf->data());
  const size_t in_row = storage_bytes(w.dtype(), K), out_row = storage_bytes(type, K);
  // Nothing may throw out of the parallel region: the first non-finite row is reported after it.
  std::atomic<int64_t> bad_row{-1};
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      convert_to_f32(src + size_t(r) * in_row, w.dtype(), row.data(), K);
      bool finite = true;
      for (float& v : row) {
        v /= scale;
        finite = finite && std::isfinite(v);
      }
      if (!finite && is_block_quantized(type)) {
        int64_t none = -1;
        bad_row.compare_exchange_strong(none, r);
        continue;
      }
      quantize_from_f32(type, row.data(), dst + size_t(r) * out_row, K);
    }
  }
  KILN_CHECK(bad_row.load() < 0, "quantize", what, ": row ", bad_row.load(), " holds a value that is not finite, which ",
             dtype_name(type), " cannot store");
  return Tensor::view_of(std::move(buf), {N, K}, type);
}

}  // namespace kiln::nn
